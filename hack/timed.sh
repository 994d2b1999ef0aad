#!/usr/bin/env bash
# hack/timed.sh PHASE CMD [ARGS...]: runs CMD and, when DDPJOB_TIMINGS names a file, appends one line
# "PHASE<TAB>seconds<TAB>exit code" to it; `make test` prints those lines as its timing table (hack/timings.py).
# The exit code is CMD's.
set -uo pipefail
phase=$1; shift
t0=$(date +%s.%N)
"$@"
rc=$?
if [ -n "${DDPJOB_TIMINGS:-}" ]; then
  awk -v p="$phase" -v a="$t0" -v b="$(date +%s.%N)" -v rc="$rc" 'BEGIN { printf "%s\t%.1f\t%d\n", p, b - a, rc }' >>"$DDPJOB_TIMINGS"
fi
exit "$rc"
