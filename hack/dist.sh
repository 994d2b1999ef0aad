#!/usr/bin/env bash
# `make dist`: what a platform team installs from, in DIST (default dist/):
#   - ddpjob-<version>-py3-none-any.whl: the operator, the worker runtime and the `ddpjob` and `kubectl-ddpjob`
#     commands (pip install it; kubectl finds the plugin on the PATH);
#   - ddpjob-operator-<chart version>.tgz: the Helm chart (`helm push` it to an OCI registry; `helm install` takes it
#     as it is).
# The wheel is built from a copy of what it packages (a build in the tree would leave build/ and *.egg-info beside
# the editable install the venv uses). Environment: PY (the venv's python: setuptools and wheel, no download),
# HELM (the pinned helm), DIST.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PY:-.venv/bin/python}
HELM=${HELM:?the helm binary (make dist sets it)}
DIST=${DIST:-dist}
mkdir -p "$DIST"
DIST=$(cd "$DIST" && pwd)
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
cp -r pyproject.toml README.md LICENSE operator worker "$src/"
find "$src" -name __pycache__ -prune -exec rm -rf {} +
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$DIST" "$src"
"$HELM" package charts/ddpjob-operator -d "$DIST" >/dev/null
ls -1 "$DIST"
