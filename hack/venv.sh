#!/usr/bin/env bash
# Creates the project virtualenv (.venv): a small venv of this checkout (ddpjob itself, installed editable) whose
# dependencies (torch and the dev tools, ~6 GB) live once per machine in a shared venv outside the repo,
# $DDPJOB_CACHE/venvs/deps-<hash of the dependency lists and the Python version>, linked by a .pth file. A fresh
# clone (what CI runs) then takes seconds instead of reinstalling torch; a change to the dependencies makes a new
# shared venv; one that no checkout used for DDPJOB_VENV_KEEP_DAYS days (default 7) is removed then.
# Idempotent: skipped when pyproject.toml has not changed since the last install.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV=${VENV:-.venv}
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
CACHE=${DDPJOB_CACHE:-$HOME/.cache/ddpjob}
stamp="$VENV/.ddpjob-installed"
want=$(sha256sum pyproject.toml | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$VENV/bin/python" -c 'import importlib.util as u, sys; sys.exit(not (u.find_spec("ddpjob_operator") and u.find_spec("torch")))' 2>/dev/null; then
  # Marks the shared venv used: the removal of unused ones (below) goes by this file's age.
  deps_site=$(cat "$VENV"/lib/python3*/site-packages/ddpjob-deps.pth 2>/dev/null) && touch "${deps_site%/lib/*}/.last-used" || true
  exit 0
fi
t0=$(date +%s)

# What the shared venv holds: every dependency of ddpjob[dev] and the build backend, not ddpjob.
reqs=$("$PY" - <<'EOF'
import tomllib
p = tomllib.load(open("pyproject.toml", "rb"))
extras = p["project"]["optional-dependencies"]
# ddpjob[a,b] in dev: the requirements of those extras of ddpjob itself.
own = lambda r: [x for e in r[len("ddpjob["):-1].split(",") for x in extras[e]] if r.startswith("ddpjob[") else [r]
dev = [x for r in extras["dev"] for x in own(r)]
print("\n".join(sorted(set(p["project"]["dependencies"] + dev + p["build-system"]["requires"]))))
EOF
)
key=$({ echo "$reqs"; "$PY" -c 'import sys; print(sys.version)'; } | sha256sum | cut -c1-16)
DEPS="$CACHE/venvs/deps-$key"
mkdir -p "$CACHE/venvs"
exec 9>"$CACHE/venvs/.lock"
flock 9  # one install per shared venv, whatever the number of checkouts asking at once
if [ ! -f "$DEPS/.complete" ]; then
  echo "[venv] installing the dependencies into $DEPS (first time: torch ~3.5 GB)"
  rm -rf "$DEPS"
  "$PY" -m venv "$DEPS"
  "$DEPS/bin/python" -m pip install -q --upgrade pip
  "$DEPS/bin/python" -m pip install -q --progress-bar off -r <(echo "$reqs")
  echo "$reqs" >"$DEPS/.complete"
  # The shared venvs of other dependency sets that no checkout used for DDPJOB_VENV_KEEP_DAYS days (default 7):
  # ~6 GB each (issue 44, disk). A checkout still pointing at one finds torch missing and reinstalls (above).
  bash hack/lib/prune-unused.sh "${DDPJOB_VENV_KEEP_DAYS:-7}" "$DEPS" "$CACHE/venvs"/deps-* | sed 's/^/[venv] /'
fi
touch "$DEPS/.last-used"
flock -u 9

# This checkout's venv: its site-packages sees the shared one through a .pth line; ddpjob itself is editable.
# Without its own pip and setuptools, so the shared ones (current) are the ones found.
[ -x "$VENV/bin/python" ] || "$PY" -m venv --without-pip "$VENV"
site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
deps_site=$("$DEPS/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
echo "$deps_site" >"$site/ddpjob-deps.pth"
"$VENV/bin/python" -m pip install -q --no-deps --no-build-isolation -e .
echo "$want" >"$stamp"
echo "[venv] ready in $(( $(date +%s) - t0 )) s ($VENV, dependencies from $DEPS)"
