#!/usr/bin/env bash
# `make test` (and so CI): test-fast, the e2e tier, then the worker tests under the oldest supported torch, with the
# set-up that waits on the network or the disk run beside work that needs the CPU, so a cold machine pays for less
# of it one after the other:
#   1. the venv (pip: downloading and unpacking torch) beside the control-plane tool builds (Go: compiling);
#   2. the e2e tier's own set-up (Debian packages, kubelet/kube-proxy/CoreDNS builds, the images) beside
#      test-fast, at the lowest CPU and I/O priority so the tests it shares the two cores with keep theirs
#      (their waits are timed). `make e2e` then finds it all cached, or builds what the background could not;
#   3. the oldest torch's venv beside test-fast as well (hack/compat.sh --python).
# A warm run costs the same as before: every step is then a cache check. Rows of what ran beside another phase
# end in "*" in the timing table (hack/timings.py) and are not in its sum.
# Environment: DDPJOB_TIMINGS (the timing table's file), MAKE (default make).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
MAKE=${MAKE:-make}
mkdir -p .out

if bash hack/images.sh --running; then dockerd_before=1; else dockerd_before=0; fi
bg=()
cleanup() {
  for pid in "${bg[@]}"; do kill -- "-$pid" 2>/dev/null; done
  # hack/e2e.sh stops a dockerd it started; the one step 2 started looked to it as if it was already running.
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

echo "[test] venv beside the cluster tool builds (its log: .out/venv.log)"
beside venv .out/venv.log bash hack/timed.sh venv bash hack/venv.sh
venv_pid=${bg[-1]}
$MAKE --no-print-directory tools
tools_rc=$?
wait "$venv_pid"; venv_rc=$?
merge venv
if [ "$venv_rc" != 0 ]; then tail -n 40 .out/venv.log >&2; echo "[test] venv failed (exit $venv_rc)" >&2; exit "$venv_rc"; fi
[ "$tools_rc" = 0 ] || exit "$tools_rc"

echo "[test] e2e set-up beside test-fast, at the lowest priority (its log: .out/e2e-setup.log)"
beside e2e-setup .out/e2e-setup.log nice -n 19 ionice -c 3 bash -c \
  "bash hack/timed.sh node-packages bash hack/node-packages.sh && bash hack/timed.sh node-tools bash hack/install-tools.sh --node && bash hack/timed.sh images bash hack/images.sh --e2e"
setup_pid=${bg[-1]}
# The oldest torch we claim (issue 22): its venv (pip, ~1.5 min cold) beside test-fast too; its tests run last.
# The newest is the main venv's, which test-fast runs.
# shellcheck disable=SC1091  # KEY=value lines only
oldest_torch=$(. hack/versions.env && echo "${TORCH_COMPAT_VERSIONS%% *}")
beside compat-venv .out/compat-venv.log nice -n 19 ionice -c 3 \
  bash hack/timed.sh compat-venv bash hack/compat.sh --python "$oldest_torch"
compat_venv_pid=${bg[-1]}
$MAKE --no-print-directory test-fast
fast_rc=$?
wait "$setup_pid"; setup_rc=$?
merge e2e-setup
wait "$compat_venv_pid"
merge compat-venv
# Not fatal here: `make e2e` runs each step again in the foreground and fails there with the step's own error.
[ "$setup_rc" = 0 ] || echo "[test] the e2e set-up beside test-fast failed (exit $setup_rc; .out/e2e-setup.log); make e2e retries it" >&2
bg=()

$MAKE --no-print-directory e2e
e2e_rc=$?
# tests/worker and tests/unit/worker under the oldest torch (`make test-compat` runs every release of the matrix).
$MAKE --no-print-directory test-compat TORCH_VERSIONS="$oldest_torch"
compat_rc=$?
# What this run leaves for the next one, against the disk budget (issue 44; reported, never fatal here).
bash hack/disk.sh --warn
[ "$fast_rc" = 0 ] || exit "$fast_rc"
[ "$e2e_rc" = 0 ] || exit "$e2e_rc"
exit "$compat_rc"
