#!/usr/bin/env bash
# `make test-compat`: the worker runtime's tests (the real-torchrun tier, tests/worker, and tests/unit/worker) under
# every torch release of TORCH_COMPAT_VERSIONS (hack/versions.env), then one table: version, passed, failed, seconds.
# The runtime reaches into torchrun's internals (ddpjob_worker.compat); this is what proves each fallback there.
#
# Each release gets a venv cached once per machine, $DDPJOB_CACHE/venvs/torch-<version>-<hash of its requirements
# and the Python version>: torch==<version> and what the tests import (pyproject's runtime dependencies, pytest,
# pytest-timeout), never ddpjob itself. Like hack/venv.sh it is built under a lock and valid once `.complete` exists.
# This checkout reaches it through a thin venv of its own, .out/compat/torch-<version> (two .pth files: the cached
# site-packages and the checkout's packages), so two checkouts share the 6 GB without pointing it at either. The
# release the main venv already has runs in .venv itself.
#
# Usage: hack/compat.sh [VERSION...]        the matrix (default: TORCH_COMPAT_VERSIONS)
#        hack/compat.sh --python VERSION    build VERSION's venv if needed and print its python (to read its torch)
# Environment: DDPJOB_CACHE (default ~/.cache/ddpjob), COMPAT_PYTEST_ARGS (replaces the default test selection),
# COMPAT_TIMEOUT_SECONDS (one release's pytest, default 2400), DDPJOB_TIMINGS (a row per release for `make test`).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO=$PWD
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
CACHE=${DDPJOB_CACHE:-$HOME/.cache/ddpjob}
MAIN=${VENV:-.venv}
OUT=$REPO/.out/compat
# shellcheck disable=SC1091  # KEY=value lines only
VERSIONS=${TORCH_COMPAT_VERSIONS:-$(. hack/versions.env && echo "$TORCH_COMPAT_VERSIONS")}
TESTS=(tests/worker tests/unit/worker)

log() { echo "[compat] $*" >&2; }

# requirements VERSION: what the cached venv of torch VERSION holds. The runtime dependencies of pyproject (the
# torchrun tests start the local runner, ddpjob_operator, too) with torch pinned, and the three pytest packages the
# tests need; not the kubernetes client (neither the runtime nor these tests import it) nor the dev tools.
requirements() {
  "$PY" - "$1" <<'EOF'
import re, sys, tomllib
p = tomllib.load(open("pyproject.toml", "rb"))
extras = p["project"]["optional-dependencies"]
name = lambda r: re.split(r"[\s<>=!~\[;]", r, maxsplit=1)[0].lower()
reqs = [r for r in p["project"]["dependencies"] + extras["worker"] if name(r) != "torch"]
reqs += [r for r in extras["dev"] if name(r) in {"pytest", "pytest-timeout", "pytest-xdist"}]
print("\n".join(sorted(set(reqs)) + [f"torch=={sys.argv[1]}"]))
EOF
}

# main_torch: the torch release of the main venv (empty without one).
main_torch() {
  "$MAIN/bin/python" -c 'import importlib.metadata as m; print(m.version("torch").split("+")[0])' 2>/dev/null || true
}

# cached_venv_dir VERSION: where the cached venv of torch VERSION is (the name changes with what it must hold).
cached_venv_dir() {
  local key
  key=$({ requirements "$1"; "$PY" -c 'import sys; print(sys.version)'; } | sha256sum | cut -c1-16)
  echo "$CACHE/venvs/torch-$1-$key"
}

# cached_venv VERSION: build (once, under the lock) the cached venv of torch VERSION; print its directory.
cached_venv() {
  local version=$1 reqs dir t0
  reqs=$(requirements "$version")
  dir=$(cached_venv_dir "$version")
  mkdir -p "$CACHE/venvs"
  exec 9>"$CACHE/venvs/.lock"
  flock 9  # the lock hack/venv.sh takes: one install at a time on this machine, whichever venv it is
  if [ ! -f "$dir/.complete" ]; then
    t0=$(date +%s)
    log "installing torch==$version and the test dependencies into $dir (first time: ~3.5 GB)"
    rm -rf "$dir"
    "$PY" -m venv "$dir"
    # --no-cache-dir: the wheels are installed once here, a pip cache would only double the disk they take.
    "$dir/bin/python" -m pip install -q --no-cache-dir --upgrade pip >&2
    "$dir/bin/python" -m pip install -q --no-cache-dir --progress-bar off -r <(echo "$reqs") >&2
    echo "$reqs" >"$dir/.complete"
    echo "$(( $(date +%s) - t0 ))" >"$dir/.install-seconds"
    # The venvs of this release that held other requirements: superseded (3.5 GB each; issue 44, disk).
    for old in "$CACHE/venvs/torch-$version"-*; do
      [ "$old" = "$dir" ] || { log "removing the superseded $old"; rm -rf "$old"; }
    done
  fi
  flock -u 9
  echo "$dir"
}

# checkout_python VERSION: a python of torch VERSION that imports this checkout; prints its path.
checkout_python() {
  local version=$1 dir thin site
  if [ "$(main_torch)" = "$version" ]; then
    echo "$REPO/$MAIN/bin/python"
    return
  fi
  dir=$(cached_venv "$version")
  thin="$OUT/torch-$version"
  [ -x "$thin/bin/python" ] || "$PY" -m venv --without-pip "$thin"
  site=$("$thin/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  "$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))' >"$site/ddpjob-deps.pth"
  printf '%s\n' "$REPO/operator" "$REPO/worker" >"$site/ddpjob-checkout.pth"
  echo "$thin/bin/python"
}

# counts JUNIT_XML: "passed failed skipped" of one pytest run (errors count as failed).
counts() {
  "$PY" - "$1" <<'EOF'
import sys, xml.etree.ElementTree as ET
try:
    total = failed = skipped = 0
    for suite in ET.parse(sys.argv[1]).getroot().iter("testsuite"):
        total += int(suite.get("tests", 0))
        failed += int(suite.get("failures", 0)) + int(suite.get("errors", 0))
        skipped += int(suite.get("skipped", 0))
    print(total - failed - skipped, failed, skipped)
except (OSError, ET.ParseError):
    print(0, 1, 0)  # pytest died before writing its report: a failure
EOF
}

# failure_reports LOG: the failure reports of one release's pytest log (each failed test's traceback and the log
# tails tests/worker/conftest.py adds), at most COMPAT_REPORT_LINES lines (default 800). CI keeps only the output
# of `make test`, not .out/: a flaky failure under an older torch showed nothing but its one-line reason.
failure_reports() {
  sed -n '/^=* FAILURES =*$/,/^=* short test summary info =*$/p' "$1" | head -n "${COMPAT_REPORT_LINES:-800}" || true
}

# run_version VERSION: its venv (built if needed), its probe line, its tests; appends its row to ROWS.
run_version() {
  local version=$1 t0 venv py rc=0 seconds passed nfailed skipped
  t0=$(date +%s)
  if [ "$(main_torch)" = "$version" ]; then
    venv="main .venv"
  elif [ -f "$(cached_venv_dir "$version")/.complete" ]; then
    venv="cached ($(cat "$(cached_venv_dir "$version")/.install-seconds" 2>/dev/null || echo '?') s)"
  else
    venv="installed"
  fi
  py=$(checkout_python "$version")
  [ "$venv" = installed ] && venv="installed $(( $(date +%s) - t0 )) s"
  PROBES+=("$("$py" -c 'from ddpjob_worker import compat; print(compat.capabilities().describe())' 2>&1 | tail -n 1)")
  log "torch $version: pytest ${COMPAT_PYTEST_ARGS:-${TESTS[*]}} (venv: $venv; log: .out/compat/torch-$version.log)"
  t0=$(date +%s)
  # Two at a time, as test-fast runs them (-n 2; loadgroup keeps an xdist_group in one worker): 12 min instead of
  # 17 for torch 2.6.0 on 2 cores (2026-11-29).
  # timeout: a child that never exits (a worker stuck in torch's teardown) keeps pytest from exiting after its
  # summary; the next release must still run.
  # shellcheck disable=SC2086  # COMPAT_PYTEST_ARGS is a list of words
  timeout -k 30 "${COMPAT_TIMEOUT_SECONDS:-2400}" "$py" -m pytest ${COMPAT_PYTEST_ARGS:-${TESTS[*]}} -n 2 \
    --dist loadgroup -p no:cacheprovider -q --junitxml="$OUT/torch-$version.xml" >"$OUT/torch-$version.log" 2>&1 || rc=$?
  seconds=$(( $(date +%s) - t0 ))
  read -r passed nfailed skipped < <(counts "$OUT/torch-$version.xml")
  if [ "$rc" != 0 ]; then
    FAILED=1
    grep -E '^(FAILED|ERROR) ' "$OUT/torch-$version.log" >&2 || tail -n 20 "$OUT/torch-$version.log" >&2
    failure_reports "$OUT/torch-$version.log" >&2
  fi
  ROWS+=("$(printf '%-8s  %-20s  %6s  %6s  %7s  %7s' "$version" "$venv" "$passed" "$nfailed" "$skipped" "$seconds")")
  if [ -n "${DDPJOB_TIMINGS:-}" ]; then
    printf '  test-compat: torch %s\t%s\t%s\n' "$version" "$seconds" "$rc" >>"$DDPJOB_TIMINGS"
  fi
}

case "${1:-}" in
  --python) checkout_python "${2:?usage: hack/compat.sh --python VERSION}"; exit 0 ;;
  -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
esac
[ $# -gt 0 ] && VERSIONS="$*"
mkdir -p "$OUT"
rm -f "$OUT"/*.xml
ROWS=() PROBES=() FAILED=0
for version in $VERSIONS; do
  run_version "$version"
done

echo
printf '%-8s  %-20s  %6s  %6s  %7s  %7s\n' torch venv passed failed skipped seconds
printf '%s\n' "------------------------------------------------------------------------"
printf '%s\n' "${ROWS[@]}"
echo
printf '%s\n' "${PROBES[@]}"
exit "$FAILED"
