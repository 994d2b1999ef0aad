#!/usr/bin/env bash
# `make test` (and so CI): test-fast, the e2e tier and the worker tests under the oldest supported torch, arranged
# so that a cold machine's set-up (Go builds of the cluster tools, pip, Docker builds) runs beside tests that do not
# need it. A fresh-machine run took 83 min with the set-up first and each tier after it; the Go builds alone are
# ~23 min of both cores, and only the integration and e2e tiers need what they build.
#   from the start  beside: the venv (pip); the control-plane tools, weed first, then the node tools (Go, nice 10);
#   venv ready      beside, at the lowest CPU and I/O priority: the e2e set-up (Debian packages, the images) and the
#                   oldest torch's venv. In front: lint, layers, types; once weed is built (the object-store tests
#                   need it), the torchrun tier (tests/worker); then test-compat under the oldest torch;
#   tools ready     in front: the rest of test-fast (unit, integration: the control plane);
#   all ready       make e2e, which finds everything cached (or builds, in front, what the background could not).
# A warm run costs the same as before: every set-up step is then a cache check. Rows of what ran beside another
# phase end in "*" in the timing table (hack/timings.py) and are not in its sum.
# Environment: DDPJOB_TIMINGS (the timing table's file), MAKE (default make), VENV (default .venv).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
MAKE=${MAKE:-make}
PY=${VENV:-.venv}/bin/python
TIMED=(bash hack/timed.sh)
mkdir -p .out
rm -f .out/tools.rc

if bash hack/images.sh --running; then dockerd_before=1; else dockerd_before=0; fi
bg=()
cleanup() {
  for pid in "${bg[@]}"; do kill -- "-$pid" 2>/dev/null; done
  # hack/e2e.sh stops a dockerd it started; the one the set-up started looked to it as if it was already running.
  if [ "$dockerd_before" = 0 ] && bash hack/images.sh --running; then bash hack/images.sh --stop; fi
}
trap cleanup EXIT

# beside NAME LOG CMD...: CMD in its own process group in the background, its timing rows kept apart (in the order
# they end, a background row would land between another phase's rows) and merged, marked, when it is waited for.
beside() {
  local name=$1 log=$2; shift 2
  rm -f ".out/$name.tsv"
  set -m
  DDPJOB_TIMINGS=".out/$name.tsv" "$@" >"$log" 2>&1 &
  set +m
  bg+=("$!")
}
merge() {  # merge NAME: its rows into the table, the top-level ones marked "*"
  [ -n "${DDPJOB_TIMINGS:-}" ] && [ -f ".out/$1.tsv" ] \
    && awk -F'\t' -v OFS='\t' '$1 !~ /^ / { $1 = $1 "*" } { print }' ".out/$1.tsv" >>"$DDPJOB_TIMINGS"
  rm -f ".out/$1.tsv"
}
# await WHAT PID TEST...: wait until TEST succeeds, or fail once PID (what should make it true) has ended without it;
# the time waited is a row of the table ("waiting for WHAT"): the part of the set-up the tests could not hide.
await() {
  local what=$1 pid=$2 t0=$SECONDS rc=0; shift 2
  until "$@"; do
    if ! kill -0 "$pid" 2>/dev/null && ! "$@"; then
      echo "[test] $what: its background step ended without it" >&2; rc=1; break
    fi
    sleep 2
  done
  [ -z "${DDPJOB_TIMINGS:-}" ] || printf 'waiting for %s\t%d\t%d\n' "$what" $((SECONDS - t0)) "$rc" >>"$DDPJOB_TIMINGS"
  return "$rc"
}
# shellcheck disable=SC1091  # KEY=value lines only
. hack/versions.env
weed="$(bash hack/install-tools.sh --print-dir)/weed-$SEAWEEDFS_VERSION/weed"
weed_built() { [ -x "$weed" ]; }

echo "[test] the venv (pip) beside the cluster tools' Go builds (logs: .out/venv.log, .out/tools.log)"
beside venv .out/venv.log "${TIMED[@]}" venv bash hack/venv.sh
venv_pid=${bg[-1]}
beside tools .out/tools.log nice -n 10 bash -c \
  "${TIMED[*]} tools bash hack/install-tools.sh; rc=\$?; echo \$rc >.out/tools.rc; [ \$rc = 0 ] || exit \$rc
   ${TIMED[*]} node-tools bash hack/install-tools.sh --node"
tools_pid=${bg[-1]}
wait "$venv_pid"; venv_rc=$?
merge venv
if [ "$venv_rc" != 0 ]; then tail -n 40 .out/venv.log >&2; echo "[test] venv failed (exit $venv_rc)" >&2; exit "$venv_rc"; fi

echo "[test] e2e set-up and the oldest torch's venv beside the tests, at the lowest priority (.out/e2e-setup.log)"
beside e2e-setup .out/e2e-setup.log nice -n 19 ionice -c 3 bash -c \
  "${TIMED[*]} node-packages bash hack/node-packages.sh && ${TIMED[*]} images bash hack/images.sh --e2e"
setup_pid=${bg[-1]}
# The oldest torch we claim (issue 22); the newest is the main venv's, which test-fast runs.
oldest_torch=${TORCH_COMPAT_VERSIONS%% *}
beside compat-venv .out/compat-venv.log nice -n 19 ionice -c 3 \
  "${TIMED[@]}" compat-venv bash hack/compat.sh --python "$oldest_torch"
compat_venv_pid=${bg[-1]}

$MAKE --no-print-directory test-static
fast_rc=$?
pytest_args=(-m "not e2e" -q -n 2 --dist loadgroup)
if await "weed" "$tools_pid" weed_built; then
  "${TIMED[@]}" pytest-torchrun "$PY" -m pytest tests/worker "${pytest_args[@]}" || fast_rc=1
else
  fast_rc=1
fi
wait "$compat_venv_pid"
merge compat-venv
# tests/worker and tests/unit/worker under the oldest torch (`make test-compat` runs every release of the matrix).
$MAKE --no-print-directory test-compat TORCH_VERSIONS="$oldest_torch"
compat_rc=$?

if await "the control-plane tools" "$tools_pid" test -f .out/tools.rc \
    && [ "$(cat .out/tools.rc)" = 0 ]; then
  "${TIMED[@]}" pytest "$PY" -m pytest tests --ignore=tests/worker "${pytest_args[@]}" || fast_rc=1
else
  tail -n 40 .out/tools.log >&2
  fast_rc=1
fi
wait "$tools_pid"; tools_rc=$?
wait "$setup_pid"; setup_rc=$?
merge tools
merge e2e-setup
bg=()
# Not fatal here: `make e2e` runs each step again in the foreground and fails there with the step's own error.
[ "$tools_rc" = 0 ] || echo "[test] the tool builds failed (exit $tools_rc; .out/tools.log); make e2e retries them" >&2
[ "$setup_rc" = 0 ] || echo "[test] the e2e set-up failed (exit $setup_rc; .out/e2e-setup.log); make e2e retries it" >&2

$MAKE --no-print-directory e2e
e2e_rc=$?
# What this run leaves for the next one, against the disk budget (issue 44; reported, never fatal here).
bash hack/disk.sh --warn
[ "$fast_rc" = 0 ] || exit "$fast_rc"
[ "$e2e_rc" = 0 ] || exit "$e2e_rc"
exit "$compat_rc"
