#!/usr/bin/env bash
# Installs the Debian packages the local real node runs on (the one list: tests/cluster/node.py runs --check):
# containerd and runc (the CRI runtime), containernetworking-plugins (bridge, host-local, loopback, portmap),
# iptables and conntrack (kube-proxy), gcc and libc6-dev (the pause and probe images are compiled from C).
# Idempotent: apt-get runs only when something is missing, so a warm run costs a few `command -v` calls.
# Used by `make node-tools`, and so by `make e2e`, `make demo` and `make cluster-up NODE=real`.
#   node-packages.sh            install what is missing (root)
#   node-packages.sh --check    only report what is missing (exit 1 naming the apt-get command)
set -euo pipefail
check_only=0
[ "${1:-}" = "--check" ] && check_only=1

missing=()
for pair in containerd:containerd ctr:containerd runc:runc iptables:iptables iptables-save:iptables \
    conntrack:conntrack gcc:gcc; do
  command -v "${pair%%:*}" >/dev/null || missing+=("${pair#*:}")
done
[ -x /usr/lib/cni/bridge ] && [ -x /usr/lib/cni/host-local ] || missing+=(containernetworking-plugins)
[ -f /usr/include/stdio.h ] || missing+=(libc6-dev)
[ ${#missing[@]} -eq 0 ] && exit 0
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)

if [ "$check_only" = 1 ] || [ "$(id -u)" != 0 ]; then
  echo "node-packages: missing ${missing[*]}; as root: apt-get install -y ${missing[*]} (or make node-tools)" >&2
  exit 1
fi
echo "[node-packages] apt-get install ${missing[*]}"
t0=$(date +%s)
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# NEEDRESTART_SUSPEND: Debian's needrestart hook has nothing to restart here and only adds noise.
{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive NEEDRESTART_SUSPEND=1 \
    apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >"$log" 2>&1 \
  || { tail -n 30 "$log" >&2; echo "node-packages: apt-get install ${missing[*]} failed" >&2; exit 1; }
echo "[node-packages] installed in $(( $(date +%s) - t0 )) s"
