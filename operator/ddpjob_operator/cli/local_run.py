"""``ddpjob run job.yaml``: run a DDPJob manifest on this machine without Kubernetes (TorchX ``local_cwd``
style): a rendezvous store, one torchrun agent per replica with the pods' env contract, a live view, and
the job's result as the exit code. An agent that exits is judged by the operator's own policies (failure.py
classifies it as it would the pod, incidents.py counts it against backoffLimit, success.py says when the job is
done), so a job fails or succeeds locally exactly when it would in a cluster."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from ddpjob_worker import contract, procs
from rich.console import Console
from rich.live import Live
from rich.table import Table

from ddpjob_operator.api import names
from ddpjob_operator.api.spec import RunPolicy, worker_container_index
from ddpjob_operator.planner.observation import PodView
from ddpjob_operator.planner.policies import failure, incidents, success


@dataclass
class Agent:
    """One replica: a torchrun agent process (what a worker pod runs)."""

    index: int
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    replacements: int = 0
    exit_code: int | None = None
    finished_at: datetime | None = None
    termination_log: Path | None = None
    worker_pids: set[int] = field(default_factory=set)

    def start(self, cwd: Path) -> None:
        log = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the process
        log.write(f"--- start {time.strftime('%H:%M:%S')} (replacement {self.replacements})\n".encode())
        log.flush()
        if self.termination_log is not None:
            self.termination_log.unlink(missing_ok=True)
        self.proc = subprocess.Popen(self.argv, env=self.env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        log.close()
        self.exit_code, self.finished_at = None, None

    def as_pod(self, job: str) -> PodView:
        """This agent as the pod it stands for (Running, Succeeded or Failed), for the operator's policies."""
        message = ""
        if self.exit_code:
            with contextlib.suppress(OSError):
                message = self.termination_log.read_text() if self.termination_log else ""
        phase = "Running" if self.exit_code is None else "Succeeded" if self.exit_code == 0 else "Failed"
        return PodView(name=names.worker_pod_name(job, self.index), uid=f"local-{self.index}-{self.replacements}",
                       replica_type=names.TYPE_WORKER, index=self.index, phase=phase, exit_code=self.exit_code,
                       termination_message=message, finished_at=self.finished_at)

    def poll(self) -> int | None:
        assert self.proc is not None
        self.worker_pids.update(procs.training_processes(self.proc.pid))
        code = self.proc.poll()
        if code is not None and self.exit_code is None:
            self.exit_code = 128 - code if code < 0 else code  # a signal -> what the kubelet would report
            self.finished_at = datetime.now(UTC)
        return self.exit_code


def agent_argv(container: dict[str, Any], bindir: Path, *, inject: bool = False) -> list[str]:
    """The process a worker pod runs. With the injected runtime (``inject``): ddp-worker around the training
    command, as in a pod. Otherwise the container's ``command`` (which replaces the image's ENTRYPOINT) and
    ``args``, or ``ddp-worker ARGS`` when there is no command, as with the worker image."""
    if inject:
        training = contract.injected_command(container.get("command"), container.get("args"))
        if contract.runs_python(training):
            training = [sys.executable, *training[1:]]  # the image's python is this venv's here
        return [sys.executable, "-m", "ddpjob_worker.entrypoint", "--", *training]
    command = [str(x) for x in container.get("command") or []]
    args = [str(x) for x in container.get("args") or []]
    if not command:
        return [sys.executable, "-m", "ddpjob_worker.entrypoint", *args]
    first = command[0]
    if first == "ddp-worker":
        return [sys.executable, "-m", "ddpjob_worker.entrypoint", *command[1:], *args]
    if first.startswith("python"):
        return [sys.executable, *command[1:], *args]
    resolved = shutil.which(first, path=f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    return [resolved or first, *command[1:], *args]


def _container_env(container: dict[str, Any], console: Console) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in container.get("env") or []:
        if "value" in item:
            env[item["name"]] = str(item["value"])
        else:
            console.print(f"[yellow]env {item.get('name')}: valueFrom is not supported locally; skipped")
    return env


def _progress(path: Path) -> dict[str, Any]:
    with contextlib.suppress(OSError, ValueError):
        data: Any = json.loads(path.read_text())
        if isinstance(data, dict):
            return dict(data)
    return {}


def _view(job: str, agents: list[Agent], progress: dict[str, Any], started: float) -> Table:
    table = Table(title=f"ddpjob run: {job}  ({time.monotonic() - started:.0f}s)")
    for col in ("worker", "agent pid", "state", "worker processes started", "agent replacements"):
        table.add_column(col)
    for a in agents:
        state = "running" if a.exit_code is None else ("succeeded" if a.exit_code == 0 else f"exited {a.exit_code}")
        table.add_row(str(a.index), str(a.proc.pid if a.proc else "-"), state, str(len(a.worker_pids)),
                      str(a.replacements))
    ckpt = progress.get("lastCheckpoint") or {}
    table.caption = (f"epoch {progress.get('epoch', '-')}  step {progress.get('step', '-')}  "
                     f"global step {progress.get('globalStep', '-')}  loss {progress.get('loss', '-')}  "
                     f"last checkpoint step {ckpt.get('step', '-')}")
    return table


def run_local(manifest: Path, workdir: Path, kill_after: float | None = None) -> int:
    """Run the manifest's job locally; return 0 on success, else the failing worker's exit code."""
    from ddpjob_operator.api.spec import InvalidSpec, parse_ddpjob

    console = Console(stderr=True, soft_wrap=True)  # a log line is one line, whatever the width
    try:
        job = parse_ddpjob(yaml.safe_load(manifest.read_text()) or {})
    except (InvalidSpec, yaml.YAMLError) as err:
        console.print(f"[red]{manifest}: {err}")
        return 2
    spec = job.spec
    containers: list[dict[str, Any]] = spec.template["spec"]["containers"]
    container = containers[worker_container_index(containers)]
    console.print(f"image {container.get('image')!r} ignored: the command runs with {sys.executable}")
    workdir = workdir.resolve()
    (workdir / "logs").mkdir(parents=True, exist_ok=True)
    ckpt_dir, progress_file = workdir / "checkpoints", workdir / "progress.json"
    progress_file.unlink(missing_ok=True)
    bindir = Path(sys.executable).parent
    port = procs.free_port()
    rdzv_log = open(workdir / "logs" / "rdzv.log", "ab")  # noqa: SIM115
    rdzv = subprocess.Popen([sys.executable, "-m", "ddpjob_worker.rdzv", "--host", "127.0.0.1", "--port", str(port)],
                            stdout=rdzv_log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    agents: list[Agent] = []
    try:
        procs.wait_for_port(port, 60, rdzv)
        rv = spec.rendezvous
        base_env = {**os.environ, **_container_env(container, console),
                    "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
                    contract.DDPJOB_DNS_WAIT_SECONDS: "5", "PYTHONUNBUFFERED": "1"}
        # All replicas share this machine (in a cluster each pod has its own CPUs): split the cores among them.
        nproc = int(spec.nproc_per_node) if spec.nproc_per_node.isdigit() else 1
        base_env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // (spec.pod_count * nproc))))
        uid = job.uid or f"local-{job.name}-{uuid.uuid4().hex[:8]}"
        for i in range(spec.pod_count):  # spares too: the rendezvous keeps the extra agents waiting
            env = contract.WorkerEnv(
                job_name=job.name, namespace="local", job_uid=uid, worker_index=i,
                min_nodes=spec.min_replicas, max_nodes=spec.max_replicas, nproc_per_node=spec.nproc_per_node,
                rdzv_endpoint=f"127.0.0.1:{port}", max_restarts=spec.max_restarts, checkpoint_dir=str(ckpt_dir),
                rdzv_conf=(f"is_host=false,join_timeout={rv.join_timeout_seconds},"
                           f"last_call_timeout={rv.last_call_seconds},close_timeout={rv.close_timeout_seconds}"),
                checkpoint_keep=spec.checkpoint.keep, progress_file=str(progress_file),
                peer_timeout_seconds=rv.peer_timeout_seconds,
                termination_log=str(workdir / "logs" / f"worker-{i}.termination"),
            ).to_env()
            argv = agent_argv(container, bindir, inject=spec.runtime.mode == "Inject")
            agents.append(Agent(i, argv, {**base_env, **env},
                                workdir / "logs" / f"worker-{i}.log",
                                termination_log=workdir / "logs" / f"worker-{i}.termination"))
        spares = f" ({spec.spares} of them hot spares)" if spec.spares else ""
        console.print(f"{spec.pod_count} agents{spares}, rendezvous 127.0.0.1:{port}, checkpoints {ckpt_dir}, "
                      f"logs {workdir / 'logs'}")
        for a in agents:
            a.start(Path.cwd())
        return _supervise(job.name, agents, Rules(spec.run_policy, rv.close_timeout_seconds), progress_file,
                          kill_after, console)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: stopping every process")
        return 130
    finally:
        for a in agents:
            if a.proc is not None:
                procs.stop_tree(a.proc, grace=10, also=tuple(a.worker_pids))
        procs.stop_tree(rdzv, grace=5)
        rdzv_log.close()


class _Budget:
    """The operator's failure and incident policies applied to agents that exit, as they would be to pods."""

    def __init__(self, job: str, policy: RunPolicy) -> None:
        self.job, self.policy = job, policy
        self.recent: list[dict[str, Any]] = []
        self.count = 0
        self.counted: list[str] = []

    def judge(self, agent: Agent) -> tuple[bool, str]:
        """(replace the agent?, what to say): counts its exit into an incident; False when the job fails."""
        now = datetime.now(UTC)
        loss = failure.worker_loss(agent.as_pod(self.job), self.policy, {}, now)
        assert loss is not None  # an agent that exited non-zero is a failed pod
        d = incidents.attribute(self.recent, self.count, self.counted, [loss],
                                window=self.policy.incident_window_seconds, backoff_limit=self.policy.backoff_limit)
        self.recent, self.count, self.counted = d.incidents, d.count, d.counted
        if d.permanent is not None:
            return False, f"worker {agent.index} failed permanently: {loss.detail}"
        if d.exhausted:
            return False, (f"{self.count} incidents exceed spec.runPolicy.backoffLimit ({self.policy.backoff_limit}): "
                           f"{incidents.list_text(self.recent, self.count)}")
        iid = d.new_losses[0][1] if d.new_losses else self.count
        return True, (f"worker {agent.index}: {loss.detail}; incident #{iid} ({loss.cause}), {self.count} of "
                      f"backoffLimit {self.policy.backoff_limit}: replacing it")


@dataclass(frozen=True)
class Rules:
    """What the operator's policies need of the job's spec."""

    policy: RunPolicy
    close_timeout_seconds: int


def _show(name: str, agents: list[Agent], codes: list[int | None], progress: dict[str, Any], started: float,
          live: Live | None, console: Console) -> None:
    """The live view on a terminal; elsewhere a plain line every call (the caller paces it)."""
    if live is not None:
        live.update(_view(name, agents, progress, started))
        return
    states = " ".join(f"w{a.index}={'run' if c is None else c}/starts={len(a.worker_pids)}"
                      for a, c in zip(agents, codes, strict=True))
    console.print(f"[{time.monotonic() - started:5.0f}s] {states} epoch={progress.get('epoch', '-')} "
                  f"step={progress.get('globalStep', '-')} loss={progress.get('loss', '-')} "
                  f"group restarts={progress.get('restartCount', '-')}", highlight=False)


def _succeeded(name: str, agents: list[Agent], rules: Rules, progress: dict[str, Any], console: Console) -> bool:
    """The cluster's success rule (policies/success.py): one agent exited 0, and the others ended or the
    rendezvous' closeTimeoutSeconds passed since (a straggler still waiting to join a closed rendezvous is then
    stopped, as cleanPodPolicy removes its pod)."""
    pods = [a.as_pod(name) for a in agents]
    if not success.job_succeeded(pods, rules.close_timeout_seconds, datetime.now(UTC)):
        return False
    left = [a.index for a in agents if a.exit_code is None]
    stopped = f"; stopping worker(s) {', '.join(map(str, left))}, still running after spec.rendezvous." \
              f"closeTimeoutSeconds ({rules.close_timeout_seconds}s)" if left else ""
    console.print(f"[green]job {name} succeeded[/] (final progress: {progress or 'none reported'}){stopped}")
    return True


def _supervise(name: str, agents: list[Agent], rules: Rules, progress_file: Path, kill_after: float | None,
               console: Console) -> int:
    """Watch the agents until the job succeeds (the cluster's rule) or one fails for good; replace the others as the
    operator replaces pods (the same classification and incident rule, the same backoffLimit)."""
    started = time.monotonic()
    killed = kill_after is None
    training_since: float | None = None
    budget = _Budget(name, rules.policy)
    live = Live(console=console, refresh_per_second=2, transient=False) if console.is_terminal else None
    last_plain = 0.0
    with live or contextlib.nullcontext():
        while True:
            codes = [a.poll() for a in agents]
            progress = _progress(progress_file)
            if live is not None or time.monotonic() - last_plain > 5:
                last_plain = time.monotonic()
                _show(name, agents, codes, progress, started, live, console)
            # The clock starts at the first progress report, not at launch: start-up (imports, rendezvous)
            # varies with load, and a fault injected before training starts tests nothing.
            if training_since is None and progress.get("globalStep") is not None:
                training_since = time.monotonic()
            if not killed and kill_after is not None and training_since is not None \
                    and time.monotonic() - training_since >= kill_after:
                killed = _kill_one_worker(agents, console)
            if _succeeded(name, agents, rules, progress, console):
                return 0
            # After the first success no failure counts and no agent is replaced (the cluster's rule too).
            failed = [] if 0 in codes else [a for a, code in zip(agents, codes, strict=True) if code]
            for a in failed:
                replace, why = budget.judge(a)
                if not replace:
                    return _failed(name, a, why, console)
                console.print(f"[yellow]{why}", highlight=False)
                a.replacements += 1
                a.start(Path.cwd())
            time.sleep(0.5)


def _failed(name: str, agent: Agent, why: str, console: Console) -> int:
    """Say why the job failed, with the agent's log tail; its exit code is the job's."""
    console.print(f"[red]job {name} failed: {why}; log: {agent.log_path}", highlight=False)
    with contextlib.suppress(OSError):
        tail = agent.log_path.read_text(errors="replace").splitlines()[-15:]
        console.print("\n".join(tail), markup=False, highlight=False)
    assert agent.exit_code is not None
    return agent.exit_code


def _kill_one_worker(agents: list[Agent], console: Console) -> bool:
    """Fault injection: SIGKILL the training process of the last replica (not its agent, so torchrun restarts
    the group in place). False until there is a training process to kill."""
    for a in reversed(agents):
        pids = procs.training_processes(a.proc.pid) if a.proc and a.exit_code is None else []
        if pids:
            os.kill(pids[0], 9)
            at = datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]  # the worker logs' format
            console.print(f"[magenta]--kill-after: SIGKILLed worker {a.index}'s training process {pids[0]} at {at}",
                          highlight=False)
            return True
    return False
