"""ddp-worker: the worker image's entrypoint; validates the env contract, waits for DNS, then execs torchrun."""

from __future__ import annotations

import argparse
import glob
import os
import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import NoReturn

from ddpjob_worker import contract, termlog
from ddpjob_worker.logs import get_logger

log = get_logger("entrypoint")

_HELP = f"""\
usage: ddp-worker [--dry-run] [--] COMMAND [ARGS...]

Runs COMMAND under torchrun with the settings the ddpjob operator puts into the pod's environment:
  ddp-worker python -m ddpjob_worker.examples.charlm --epochs 2
  ddp-worker -- python train.py --lr 0.1
  ddp-worker train.py            (a .py file is run with the image's python)

It validates the environment (exit {contract.EXIT_BAD_CONTRACT} with a message naming the variable on a broken
contract), sets OMP_NUM_THREADS and TORCHELASTIC_ERROR_FILE when unset, waits up to
{contract.DDPJOB_DNS_WAIT_SECONDS} (default {contract.DEFAULT_DNS_WAIT_SECONDS}s) for the rendezvous host to
resolve (exit {contract.EXIT_DNS_UNRESOLVED} if it never does), and then replaces itself (exec) with torchrun, so
SIGTERM from the kubelet reaches torchrun directly. Python scripts run under ddpjob_worker.recorded, so their
failures leave a torchelastic error file.
Exit codes: the failed worker's own code (143 after a SIGTERM checkpoint, 128+N for signal N),
{contract.EXIT_RENDEZVOUS_LOST} rendezvous lost, {contract.EXIT_PEER_LOST} a peer was lost,
{contract.EXIT_DNS_UNRESOLVED} rendezvous host not in DNS, {contract.EXIT_BAD_CONTRACT} broken contract. The root
cause goes to {contract.DDPJOB_TERMINATION_LOG} (default {contract.DEFAULT_TERMINATION_LOG}).

options:
  --dry-run   print the torchrun command line instead of executing it
  -h, --help  show this message
"""


def parse_args(argv: Sequence[str]) -> tuple[bool, list[str]]:
    """Split ddp-worker's own flags from the user's command (everything after ``--`` or the first non-flag)."""
    parser = argparse.ArgumentParser(prog="ddp-worker", add_help=False)
    parser.add_argument("-h", "--help", action="store_true")
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    ns = parser.parse_args(list(argv))
    if ns.help:
        print(_HELP)
        raise SystemExit(0)
    command = list(ns.command)
    if command and command[0] == "--":
        command = command[1:]
    return bool(ns.dry_run), command


def torchrun_argv(command: Sequence[str], env: contract.WorkerEnv) -> list[str]:
    """The launcher command line. torchrun reads every PET_* option from the environment, so only the script
    part is built here. Python scripts and ``python -m`` modules run under ``ddpjob_worker.recorded`` (their
    failures then leave a torchelastic error file, the root cause the agent reports, and their steps are counted:
    ddpjob_worker.autoprogress); other programs use ``--no-python`` (contract.python_target decides)."""
    if not command:
        raise contract.ContractError(
            "no training command: give the container args, e.g. args: [python, train.py] (or ddp-worker -- CMD)"
        )
    launcher = [sys.executable, "-m", "ddpjob_worker.launch"]
    target = contract.python_target(command)
    if target is None:
        return [*launcher, "--no-python", *command]
    as_module, rest = target
    return [*launcher, "--module", contract.RECORDED_MODULE, *(["--module"] if as_module else []), *rest]


def wait_for_dns(host: str, timeout: float, resolve: Callable[[str], object] = socket.gethostbyname) -> bool:
    """Poll until ``host`` resolves (headless-Service records lag pod start, pytorch#73682); never raise."""
    deadline = time.monotonic() + timeout
    attempt = 0
    while True:
        try:
            resolve(host)
            if attempt:
                log.info("rendezvous host %s resolves after %d attempts", host, attempt + 1)
            return True
        except OSError as err:
            attempt += 1
            if time.monotonic() >= deadline:
                log.error("rendezvous host %s still does not resolve after %.0fs (%s)", host, timeout, err)
                return False
            if attempt == 1 or attempt % 10 == 0:
                log.info("waiting for rendezvous host %s to resolve (%s)", host, err)
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


def dns_failure_message(host: str, timeout: float) -> str:
    """The termination message when the rendezvous host never resolved: which Service to check."""
    labels = host.split(".")
    where = f"rendezvous host {host} did not resolve within {timeout:.0f}s ({contract.DDPJOB_DNS_WAIT_SECONDS})"
    if len(labels) >= 3:
        return (f"{where}: check that the headless Service {labels[1]} exists in namespace {labels[2]} and that "
                f"the rendezvous pod {labels[0]} is running")
    return f"{where}: check {contract.PET_RDZV_ENDPOINT} and the cluster DNS"


def available_cpus(cgroup_cpu_max: str = "/sys/fs/cgroup/cpu.max") -> int:
    """CPUs this container may use: the cgroup v2 quota when set, else the affinity mask. os.cpu_count() is the
    node's count, which makes every pod on a big node start far too many OpenMP threads."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        with open(cgroup_cpu_max) as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            cpus = min(cpus, max(1, -(-int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cpus)


def visible_gpus() -> int:
    """NVIDIA devices in this container, without importing torch (the entrypoint must start fast)."""
    return len(glob.glob("/dev/nvidia[0-9]*"))


def default_omp_threads(nproc_per_node: str, cpus: int | None = None, gpus: int | None = None) -> int:
    """OMP_NUM_THREADS when the user did not set it: the container's CPUs shared by its worker processes
    (torchrun would otherwise force 1 for several processes, or let torch take every core of the node)."""
    cpus = available_cpus() if cpus is None else cpus
    gpus = visible_gpus() if gpus is None else gpus
    if nproc_per_node.isdigit():
        procs = int(nproc_per_node)
    elif nproc_per_node == "gpu" or (nproc_per_node == "auto" and gpus):
        procs = gpus
    else:  # cpu, or auto without GPUs: one process per CPU
        procs = cpus
    return max(1, cpus // max(1, procs))


def prepare_environ(environ: Mapping[str, str], env: contract.WorkerEnv) -> dict[str, str]:
    """The environment torchrun is exec'ed with: the pod's, plus defaults it would otherwise get wrong."""
    out = dict(environ)
    if "OMP_NUM_THREADS" not in out:
        out["OMP_NUM_THREADS"] = str(default_omp_threads(env.nproc_per_node))
    # torchrun copies the root-cause traceback of a failed worker here; the kubelet reads the same path as the
    # container's termination message when terminationMessagePath points at it.
    error_file = os.path.join(env.checkpoint_dir, ".errors", f"worker-{env.worker_index}.json")
    out.setdefault("TORCHELASTIC_ERROR_FILE", error_file)
    out.setdefault("PYTHONUNBUFFERED", "1")
    out.setdefault(contract.TORCH_DISABLE_SHARE_RDZV_TCP_STORE, "1")  # see contract: replacements would hang
    return out


def _fail(message: str, code: int) -> NoReturn:
    """Exit ``code`` with ``message`` on stderr and as the container's termination message."""
    print(f"ddp-worker: {message} (exit {code})", file=sys.stderr)
    termlog.write_termination_log(message)
    raise SystemExit(code)


def main(argv: Sequence[str] | None = None) -> None:
    """Console script ``ddp-worker``."""
    dry_run, command = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        env = contract.WorkerEnv.from_env(os.environ)
        args = torchrun_argv(command, env)
        for knob in sorted(contract.USER_SETTABLE_ENV & os.environ.keys()):
            problem = contract.knob_error(knob, os.environ[knob])
            if problem:
                raise contract.ContractError(problem)
        dns_wait = float(os.environ.get(contract.DDPJOB_DNS_WAIT_SECONDS, contract.DEFAULT_DNS_WAIT_SECONDS))
    except (contract.ContractError, ValueError) as err:
        _fail(f"broken environment contract: {err}", contract.EXIT_BAD_CONTRACT)
    environ = prepare_environ(os.environ, env)
    if dry_run:
        print(" ".join(args))
        return
    error_file = environ["TORCHELASTIC_ERROR_FILE"]
    try:
        os.makedirs(os.path.dirname(error_file), exist_ok=True)
    except OSError as err:  # a read-only or missing volume must not stop training; torchrun just skips the file
        log.warning("cannot create %s: %s", os.path.dirname(error_file), err)
    host = env.rdzv_endpoint.rsplit(":", 1)[0]
    if not wait_for_dns(host, dns_wait):
        # torchrun would only retry until its join timeout and then fail with a message that names no Service;
        # a retryable exit lets the operator replace the pod while the Service's records appear.
        _fail(dns_failure_message(host, dns_wait), contract.EXIT_DNS_UNRESOLVED)
    log.info("exec %s (nnodes=%s rdzv=%s id=%s)", " ".join(args), env.nnodes, env.rdzv_endpoint, env.job_uid)
    sys.stderr.flush()
    # exec, not subprocess: torchrun becomes this process (PID 1 in the container), so the kubelet's SIGTERM
    # reaches it and its exit code is the container's (kubernetes#24695).
    os.execve(args[0], args, environ)


if __name__ == "__main__":
    main()
