#!/usr/bin/env bash
# The e2e tier (`make e2e`, part of `make test` and so of CI): real containers, real training.
#   1. hack/images.sh --e2e: build ddpjob-operator:dev, ddpjob-worker:dev and ddpjob-runtime:dev from the working
#      tree (operator and runtime also tagged with the chart's appVersion, what the e2e tier's `helm install` with
#      default values deploys), and the plain user image ddpjob-plain:torch-<oldest supported>
#      (tests/e2e/images/plain). Always run, so
#      the tests never exercise stale images; a warm run rebuilds only the code layer (seconds).
#   2. tests/images: both images under Docker (non-root, no build tools, the worker trains, the operator
#      answers /healthz against a local control plane).
#   3. tests/e2e: a local control plane with 7 real nodes (containerd, kubelet, kube-proxy; CoreDNS), the images
#      imported into it, the Helm-installed operator, DDP training with kill -9 and pod deletions.
# A dockerd that step 1 started is stopped at the end, so a CI run leaves no process behind; one that was
# already running (`make images` earlier, or the machine's own) is left alone.
# Environment: PY (default .venv/bin/python), E2E_ARGS (extra pytest arguments for tests/e2e), E2E_MARK (the marker
# expression, default "e2e and not extended": `make e2e-extended` sets "e2e and extended"), DDPJOB_CACHE,
# TMPDIR (where the real node's state goes), DDPJOB_E2E_NEED_GB (free space required there, default 20).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PY:-.venv/bin/python}

if bash hack/images.sh --running; then keep_dockerd=1; else keep_dockerd=0; fi
cleanup() { if [ "$keep_dockerd" = 0 ] && bash hack/images.sh --running; then bash hack/images.sh --stop; fi; }
trap cleanup EXIT

# Fail now, with the fix, rather than 10 minutes in: while importing, the real node holds each image twice under
# pytest's temp directory (layer blobs, then the unpacked snapshot; the blobs are dropped once unpacked): measured
# peak ~17 GB with the 5.8 GB worker image unpacked and the 5.5 GB plain image being imported. Its kubelet evicts pods
# and images, pause included, once the disk runs low (docs/e2e.md, "Disk").
# Checked again after the build, which may have filled the same disk.
check_disk() {
  local need=${DDPJOB_E2E_NEED_GB:-20} tmp=${TMPDIR:-/tmp} avail
  avail=$(df --output=avail -BG "$tmp" | tail -n1 | tr -dc 0-9)
  if [ "$avail" -lt "$need" ]; then
    echo "e2e: ${avail} GB free under $tmp, the real node needs ${need} GB (the worker and plain images, ~6 GB" \
      "each, one of them twice while it is imported). Free space there, or point TMPDIR at a larger disk (DDPJOB_E2E_NEED_GB overrides the check)." >&2
    exit 1
  fi
}

check_disk
bash hack/timed.sh images bash hack/images.sh --e2e
check_disk
# Both suites start their own clusters; a KUBECONFIG from the caller's shell must not redirect them.
bash hack/timed.sh tests/images env -u KUBECONFIG "$PY" -m pytest tests/images -m e2e -q
# shellcheck disable=SC2086  # E2E_ARGS is a list of pytest arguments
bash hack/timed.sh tests/e2e env -u KUBECONFIG "$PY" -m pytest tests/e2e -m "${E2E_MARK:-e2e and not extended}" \
  --durations=0 ${E2E_ARGS:-}
