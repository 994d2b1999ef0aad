"""`python -m tests.cluster up|down|status [--dir DIR]`: the commands behind `make cluster-up` / `make cluster-down`."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tests.cluster.controlplane import REPO, ClusterState, StartError, down, up


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.cluster", description=__doc__)
    parser.add_argument("command", choices=["up", "down", "status"])
    parser.add_argument("--dir", type=Path, default=REPO / ".cluster", help="state, certs and logs (default .cluster/)")
    parser.add_argument(
        "--real-node", action="store_true",
        help="also run a real node: containerd, kubelet, kube-proxy, CoreDNS (root; see docs/real-node.md)",
    )
    parser.add_argument("--nodes", type=int, default=1,
                        help="with --real-node: how many real nodes (1.. in network namespaces; docs/real-node.md)")
    parser.add_argument("--no-addons", action="store_true",
                        help="without Kueue and scheduler-plugins: a plain cluster, as `make demo`'s")
    args = parser.parse_args()
    if args.command == "up":
        t0 = time.monotonic()
        try:
            state = up(args.dir, real_node=args.real_node, nodes=args.nodes, addons=not args.no_addons)
        except StartError as err:
            print(f"cluster-up failed: {err}", file=sys.stderr)
            return 1
        print(f"# control plane up in {time.monotonic() - t0:.1f}s; logs in {args.dir.resolve() / 'logs'}", flush=True)
        # Last line by contract: callers eval it.
        print(f"export KUBECONFIG={state.kubeconfig}")
        return 0
    if args.command == "down":
        down(args.dir)
        return 0
    found = ClusterState.load(args.dir.resolve())
    if found is None:
        print("no cluster")
        return 1
    print(f"kubeconfig: {found.kubeconfig}\npids: {found.pids}\nports: {found.ports}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
