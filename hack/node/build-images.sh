#!/usr/bin/env bash
# Builds the real node's local images as docker-archive tarballs for `ctr -n k8s.io images import`, without
# Docker (another helper owns dockerd) and without any registry (none can be reached here):
#   ddpjob.local/pause:3.10   the pod sandbox image (static pause binary, scratch image)
#   ddpjob.local/probe:dev    /probe (static Go, see probe/main.go) and /pause, for tests/e2e/test_real_node.py
# Output goes to OUTDIR/<hash of the sources>/, so a warm run is a no-op; the last line is that directory.
# Usage: hack/node/build-images.sh OUTDIR
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=${1:?usage: build-images.sh OUTDIR}
key=$(cat "$here/pause.c" "$here/probe/go.mod" "$here/probe/main.go" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-16)
out=$root/$key
if [ -f "$out/done" ]; then echo "$out"; exit 0; fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

gcc -Os -static -o "$work/pause" "$here/pause.c"
strip "$work/pause"
(cd "$here/probe" && GOFLAGS=-buildvcs=false GOTOOLCHAIN=local CGO_ENABLED=0 \
  go build -trimpath -ldflags='-s -w' -o "$work/probe" .)

# mkimage TAR REF ENTRYPOINT-JSON FILE...: a one-layer image; fixed owner and mtime keep the digest stable.
mkimage() {
  local tar=$1 ref=$2 entry=$3; shift 3
  local img=$work/img-$(basename "$tar" .tar) layer=$work/layer-$(basename "$tar" .tar)
  mkdir -p "$img" "$layer"
  cp "$@" "$layer/"
  tar --owner=0 --group=0 --numeric-owner --mtime=@0 --sort=name -C "$layer" -cf "$img/layer.tar" .
  local diff; diff=$(sha256sum "$img/layer.tar" | cut -d' ' -f1)
  printf '{"architecture":"amd64","os":"linux","config":{"Entrypoint":%s,"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
    "$entry" "$diff" >"$img/config.json"
  local cfg; cfg=$(sha256sum "$img/config.json" | cut -d' ' -f1)
  mv "$img/config.json" "$img/$cfg.json"
  printf '[{"Config":"%s.json","RepoTags":["%s"],"Layers":["layer.tar"]}]' "$cfg" "$ref" >"$img/manifest.json"
  tar -C "$img" -cf "$tar" manifest.json "$cfg.json" layer.tar
}
mkdir -p "$out"
mkimage "$out/pause.tar" ddpjob.local/pause:3.10 '["/pause"]' "$work/pause"
mkimage "$out/probe.tar" ddpjob.local/probe:dev '["/probe"]' "$work/probe" "$work/pause"
touch "$out/done"
echo "$out"
