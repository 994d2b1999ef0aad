"""Host-level primitives for the real node (tests/cluster/node.py): commands, sysctls, stopping processes, and
undoing exactly what a node added to the host (mounts, iptables rules and chains, nftables tables, stale sockets)."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from tests.cluster import controlplane as cp
from tests.cluster.controlplane import StartError

COMMENT = "ddpjob-real-node"


def run(*argv: str, check: bool = True, stdin: str | None = None) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, input=stdin)
    if check and proc.returncode != 0:
        raise StartError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def sysctl(name: str, value: str | None = None) -> str | None:
    path = Path("/proc/sys") / name
    try:
        if value is not None:
            path.write_text(value)
        return path.read_text().strip()
    except OSError:
        return None


def running(pid: int) -> bool:
    """Alive and not a zombie: orphans of a crashed `up` wait, dead, for init to reap them."""
    try:
        return cp._alive(pid) and Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def stop_pids(pids: list[int], timeout: float = 15) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(running(p) for p in pids):
        time.sleep(0.1)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def unmount_under(*roots: Path) -> None:
    """Unmount every mount point below `roots`, deepest first (kubelet volumes, rootfs overlays, netns, shm)."""
    prefixes = tuple(f"{r}/" for r in roots)
    for _ in range(5):
        points = [ln.split()[4] for ln in Path("/proc/self/mountinfo").read_text().splitlines()]
        points = sorted({p for p in points if p.startswith(prefixes) or p in map(str, roots)}, key=len, reverse=True)
        if not points:
            return
        for p in points:
            if subprocess.run(["umount", p], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", p], capture_output=True)


def remove_stale_sockets(directory: Path) -> None:
    """Shims killed with SIGKILL leave their sockets behind; a socket nobody listens on is stale (dockerd's own
    containerd keeps live ones here too, and those answer)."""
    for path in directory.glob("*") if directory.is_dir() else []:
        with socket.socket(socket.AF_UNIX) as s:
            try:
                s.connect(str(path))
            except ConnectionRefusedError:
                path.unlink(missing_ok=True)
            except OSError:
                pass


def _iptables_parse(text: str) -> dict[str, tuple[set[str], list[str]]]:
    """iptables-save text -> {table: (chain names, rules without the leading "-A ")}."""
    tables: dict[str, tuple[set[str], list[str]]] = {}
    for line in text.splitlines():
        if line.startswith("*"):
            chains, rules = tables.setdefault(line[1:], (set(), []))
        elif line.startswith(":") and tables:
            chains.add(line[1:].split()[0])
        elif line.startswith("-A ") and tables:
            rules.append(line[3:])
    return tables


def iptables_undo(cmd: str, before_file: Path) -> None:
    """Remove what appeared since `up`: new KUBE-*/CNI-* chains, rules jumping to them, rules with our comment.
    Rules others added meanwhile (dockerd's) are left alone, so this never restores a stale snapshot."""
    if shutil.which(f"{cmd}-save") is None or not before_file.exists():
        return
    before = _iptables_parse(before_file.read_text())
    batch: list[str] = []
    for table, (chains, rules) in _iptables_parse(run(f"{cmd}-save", check=False)).items():
        old_chains, old_rules = before.get(table, (set(), []))
        new = {c for c in chains - old_chains if c.startswith(("KUBE-", "CNI-"))}
        lines = [f"*{table}"]
        for rule in rules:
            argv = shlex.split(rule)
            target = argv[argv.index("-j") + 1] if "-j" in argv[:-1] else ""
            if argv[0] not in new and rule not in old_rules and (target in new or COMMENT in rule):
                lines.append(f"-D {rule}")
        lines += [f"-F {c}" for c in sorted(new)] + [f"-X {c}" for c in sorted(new)]
        if len(lines) > 1:
            batch += [*lines, "COMMIT"]
    # One atomic restore instead of a process per rule; if some line no longer applies, line by line.
    if batch and subprocess.run([f"{cmd}-restore", "--noflush"], input="\n".join(batch) + "\n", text=True,
                                capture_output=True).returncode != 0:
        table = ""
        for line in batch:
            if line.startswith("*"):
                table = line[1:]
            elif line != "COMMIT":
                run(cmd, "-t", table, *shlex.split(line), check=False)


def nft_undo(before_file: Path) -> None:
    """iptables-nft creates the nftables tables it first touches; drop those that are new and left empty."""
    builtin = ("table", "chain INPUT", "chain OUTPUT", "chain FORWARD", "chain PREROUTING", "chain POSTROUTING",
               "type ", "}")
    if shutil.which("nft") is None or not before_file.exists():
        return
    before = set(before_file.read_text().splitlines())
    for table in set(run("nft", "list", "tables", check=False).splitlines()) - before:
        family, name = table.split()[1:3]
        lines = [ln.strip() for ln in run("nft", "list", "table", family, name, check=False).splitlines()]
        if all(not ln or ln.startswith(builtin) for ln in lines):
            run("nft", "delete", "table", family, name, check=False)
