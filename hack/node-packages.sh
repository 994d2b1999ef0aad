#!/usr/bin/env bash
# Installs the Debian packages the local real node runs on (tests/cluster/node.py checks the same list):
# containerd and runc (the CRI runtime), containernetworking-plugins (bridge, host-local, loopback, portmap),
# iptables and conntrack (kube-proxy), gcc and libc6-dev (the pause and probe images are compiled from C).
# Idempotent: apt-get runs only when something is missing, so a warm run costs a few `command -v` calls.
# Used by `make node-tools`, and so by `make e2e`, `make demo` and `make cluster-up NODE=real`.
set -euo pipefail

missing=()
for pair in containerd:containerd ctr:containerd runc:runc iptables:iptables conntrack:conntrack gcc:gcc; do
  command -v "${pair%%:*}" >/dev/null || missing+=("${pair#*:}")
done
[ -x /usr/lib/cni/bridge ] && [ -x /usr/lib/cni/host-local ] || missing+=(containernetworking-plugins)
[ -f /usr/include/stdio.h ] || missing+=(libc6-dev)
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" != 0 ]; then
  echo "node-packages: missing ${missing[*]}; as root: apt-get install -y ${missing[*]}" >&2
  exit 1
fi
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
echo "[node-packages] apt-get install ${missing[*]}"
t0=$(date +%s)
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# NEEDRESTART_SUSPEND: Debian's needrestart hook has nothing to restart here and only adds noise.
{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive NEEDRESTART_SUSPEND=1 \
    apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >"$log" 2>&1 \
  || { tail -n 30 "$log" >&2; echo "node-packages: apt-get install ${missing[*]} failed" >&2; exit 1; }
echo "[node-packages] installed in $(( $(date +%s) - t0 )) s"
