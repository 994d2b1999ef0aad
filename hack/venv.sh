#!/usr/bin/env bash
# Creates the project virtualenv (.venv) and installs ddpjob with its dev extras into it.
# Idempotent: skipped when pyproject.toml has not changed since the last install. pip's own cache
# (~/.cache/pip) keeps torch's multi-GB download to once per machine.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV=${VENV:-.venv}
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
stamp="$VENV/.ddpjob-installed"
want=$(sha256sum pyproject.toml | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$VENV/bin/python" -c 'import importlib.util as u, sys; sys.exit(not (u.find_spec("ddpjob_operator") and u.find_spec("torch")))' 2>/dev/null; then
  exit 0
fi
t0=$(date +%s)
echo "[venv] installing ddpjob[dev] into $VENV (first time: downloads torch, ~3.5 GB, into pip's cache)"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q --progress-bar off -e '.[dev]'
echo "$want" >"$stamp"
echo "[venv] ready in $(( $(date +%s) - t0 )) s"
