#!/usr/bin/env bash
# Tags the images `make images` built and pushes them to a registry: what `REGISTRY=host/path make images push`
# runs. The chart then needs one value, imageRegistry=host/path (its image tags default to the appVersion, which
# is what is pushed unless TAG says otherwise).
#
#   REGISTRY=registry.example.com/ml [TAG=x] [IMAGES="operator runtime worker"] hack/push-images.sh
#
# REGISTRY  where to push (required): a host, optionally :port and a path; `docker login` to it first if it asks
# TAG       the tag `make images` built (default dev) and the tag pushed (default: the chart's appVersion, the tag
#           `helm install` deploys with default values)
# IMAGES    which of the three (default all; the worker image is ~6 GB and only for jobs without an image of their own)
# DOCKER    the docker client (default: Debian's /usr/bin/docker when present, as hack/images.sh)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
: "${REGISTRY:?set REGISTRY to the registry and path to push to (REGISTRY=registry.example.com/ml make images push)}"
APP_VERSION=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/ddpjob-operator/Chart.yaml)
built=${TAG:-dev}
pushed=${TAG:-$APP_VERSION}
registry=${REGISTRY%/}
if [ -z "${DOCKER:-}" ]; then
  if [ -x /usr/bin/docker ]; then DOCKER=/usr/bin/docker; else DOCKER=docker; fi
fi
for image in ${IMAGES:-operator runtime worker}; do
  case $image in
    operator|runtime|worker) ;;
    *) echo "IMAGES: unknown image '$image' (operator, runtime, worker)" >&2; exit 2 ;;
  esac
  src=ddpjob-$image:$built dst=$registry/ddpjob-$image:$pushed
  "$DOCKER" image inspect "$src" >/dev/null 2>&1 || { echo "no image $src: run \`make images\` first" >&2; exit 1; }
  "$DOCKER" tag "$src" "$dst"
  echo "[push] $src -> $dst"
  "$DOCKER" push -q "$dst"
done
echo "[push] done: helm install ... --set imageRegistry=$registry"
