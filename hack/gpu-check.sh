#!/usr/bin/env bash
# The checks that need a GPU, as one script for a lent GPU machine (no cluster there): NCCL collectives of the
# checkpoint library (tests/gpu), `ddpjob run` of manifests/examples/gpu.yaml with kill -9 of the trainer (recovery
# time with CUDA start-up in it), and bench/checkpoint_bench.py with a CUDA state of 1 GB and 8 GB.
#
#   bash hack/gpu-check.sh [OUTDIR]        (OUTDIR: where logs and results go; default $OUT or /tmp/gpu-check)
#
# Uses the machine's own python3 with torch; wheels in .whl/ (what that python lacks, e.g. pydantic) are installed
# into /tmp/site first. The local run has one replica per GPU the machine has (NCCL refuses two ranks on one GPU),
# and 30 epochs instead of 5 so the kill lands mid-run.
set -uo pipefail
out=${1:-${OUT:-/tmp/gpu-check}}
mkdir -p "$out"
cd "$(dirname "$0")/.."
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD/operator:$PWD/worker:$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
step() { echo; echo "=== $* ($(date +%T), load $(cut -d' ' -f1-3 /proc/loadavg))"; }

step "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda',
torch.version.cuda, 'nccl', torch.cuda.nccl.version(), 'gpus', torch.cuda.device_count())"

step "checkpoint collectives under NCCL (tests/gpu)"
timeout 300 python3 -m pytest -p no:cacheprovider tests/gpu -s -q -o addopts="" 2>&1 | tee "$out/nccl.txt"

step "ddpjob run of manifests/examples/gpu.yaml, kill -9 of the trainer"
work=/tmp/gpu-run
rm -rf "$work"
python3 - "$work/job.yaml" <<'EOF'
import sys, pathlib, torch, yaml
job = yaml.safe_load(open("manifests/examples/gpu.yaml"))
job["spec"]["replicas"] = max(1, min(job["spec"]["replicas"], torch.cuda.device_count()))
args = job["spec"]["template"]["spec"]["containers"][0]["args"]
args[args.index("--epochs") + 1] = "30"
pathlib.Path(sys.argv[1]).parent.mkdir(parents=True)
pathlib.Path(sys.argv[1]).write_text(yaml.safe_dump(job))
EOF
start=$(date +%s.%N)
timeout 300 python3 -c 'from ddpjob_operator.cli import app; app()' run "$work/job.yaml" --workdir "$work" \
  --kill-after 5 2>&1 | tee "$out/run.txt"
echo "ddpjob run: exit ${PIPESTATUS[0]} after $(python3 -c "import time; print(round(time.time() - $start, 1))") s"
cp "$work/logs/worker-0.log" "$out/worker-0.log" 2>/dev/null
python3 - "$out/run.txt" "$work/logs/worker-0.log" "$work/progress.json" <<'EOF'
import json, re, sys
from datetime import datetime
ts = lambda s: datetime.strptime(s, "%Y-%m-%d %H:%M:%S,%f").timestamp()  # local time, as the logs write it
kill = re.search(r"SIGKILLed .* at (\S+ \S+)", open(sys.argv[1]).read())
lines = open(sys.argv[2], errors="replace").read().splitlines()
stamp = lambda pat: [(ts(x[:23]), x[24:]) for x in lines if re.search(pat, x) and re.match(r"\d{4}-", x)]
if not kill:
    sys.exit("no kill happened (training ended first?)")
at = ts(kill.group(1))
for what, pat in [("checkpoint loaded", "resumed from checkpoint|no valid checkpoint"),
                  ("trainer ready (CUDA, NCCL, model)", "training: world")]:
    after = [(t, x) for t, x in stamp(pat) if t > at]
    print(f"kill -9 -> {what}: {after[0][0] - at:.2f} s ({after[0][1][-90:]})" if after else f"no {what} logged")
start = json.load(open(sys.argv[3])).get("start", {})
if start.get("firstStepTime"):
    first = datetime.fromisoformat(start["firstStepTime"]).timestamp()
    print(f"kill -9 -> first training step: {first - at:.2f} s (progress.json start: {start})")
EOF

step "bench/checkpoint_bench.py, CUDA state 1 GB (all rows) and 8 GB (async rows)"
mkdir -p /tmp/ckb
python3 bench/checkpoint_bench.py --dir /tmp/ckb --device cuda --sizes-mb 1024 --repeats 2 2>&1 | tee "$out/bench.txt"
python3 bench/checkpoint_bench.py --dir /tmp/ckb --device cuda --sizes-mb 8192 --repeats 2 --async-only 2>&1 |
  tee -a "$out/bench.txt"
python3 bench/checkpoint_bench.py --dir /tmp/ckb --device cpu --sizes-mb 1024 --repeats 2 --async-only 2>&1 |
  tee -a "$out/bench.txt"
step "done"
