#!/usr/bin/env bash
# `make demo`: the set-up the demo needs, and only that, with what waits on the network or the disk beside what
# needs the CPU (issue 44: 43 min 54 s cold on 2 cores when it built every test tool and did each step in turn):
#   beside:     the venv (pip: torch), the node's Debian packages, then the three images (they pin the venv's
#               versions, so they come after it);
#   foreground: the core cluster tools and the node's (hack/install-tools.sh --core --node: Go, CPU-bound). No
#               Kueue, scheduler-plugins, Prometheus, SeaweedFS or registry: the demo's cluster runs none of them.
# Then hack/demo.py: a real-node cluster without Kueue and scheduler-plugins, the operator installed with Helm, the
# CPU example followed live to Succeeded. Prints a timing table (hack/timings.py) at the end. A warm run: seconds
# of cache checks, then the job.
# Environment: PY (the venv's python, default .venv/bin/python), CLUSTER_DIR (default .cluster), DEMO_DOWN (non-empty:
# tear the cluster down at the end), DDPJOB_TIMINGS (the timing table's file, default .out/demo-timings.tsv).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
PY=${PY:-.venv/bin/python}
mkdir -p .out
export DDPJOB_TIMINGS=${DDPJOB_TIMINGS:-$PWD/.out/demo-timings.tsv}
rm -f "$DDPJOB_TIMINGS" .out/demo-setup.tsv
start=$(date +%s)

setup_pid=
# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() { [ -n "$setup_pid" ] && kill -- "-$setup_pid" 2>/dev/null; }
trap cleanup EXIT

echo "[demo] venv, node packages and images beside the tool builds (their log: .out/demo-setup.log)"
# Its timing rows in a file of their own, merged marked "*" (ran beside; not in the sum) once it ends.
set -m
DDPJOB_TIMINGS=.out/demo-setup.tsv bash -c "bash hack/timed.sh venv bash hack/venv.sh && bash hack/timed.sh node-packages bash hack/node-packages.sh \
  && bash hack/timed.sh images bash hack/images.sh" >.out/demo-setup.log 2>&1 &
setup_pid=$!
set +m
bash hack/timed.sh tools bash hack/install-tools.sh --core --node
tools_rc=$?
echo "[demo] tools done; waiting for the venv, node packages and images (tail -f .out/demo-setup.log)"
wait "$setup_pid"
setup_rc=$?
setup_pid=
awk -F'\t' -v OFS='\t' '$1 !~ /^ / { $1 = $1 "*" } { print }' .out/demo-setup.tsv >>"$DDPJOB_TIMINGS" 2>/dev/null
rm -f .out/demo-setup.tsv
if [ "$setup_rc" != 0 ]; then
  tail -n 40 .out/demo-setup.log >&2
  echo "[demo] set-up failed (exit $setup_rc): the lines above are the end of .out/demo-setup.log" >&2
  exit "$setup_rc"
fi
[ "$tools_rc" = 0 ] || exit "$tools_rc"
bash hack/timed.sh job "$PY" hack/demo.py --dir "${CLUSTER_DIR:-.cluster}" ${DEMO_DOWN:+--down}
rc=$?
"$PY" hack/timings.py "$DDPJOB_TIMINGS" --since "$start" --what "make demo"
exit "$rc"
