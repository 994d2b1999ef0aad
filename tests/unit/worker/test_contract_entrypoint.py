"""The env contract, and ddp-worker's command line and environment."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from ddpjob_worker import contract, entrypoint


def make_env(**overrides: object) -> contract.WorkerEnv:
    values: dict[str, object] = dict(job_name="j", namespace="ns", job_uid="uid-1", worker_index=1, min_nodes=1,
                                     max_nodes=4, nproc_per_node="1", rdzv_endpoint="j-rdzv.j.ns.svc:29400",
                                     max_restarts=3, checkpoint_dir="/checkpoints")
    values.update(overrides)
    return contract.WorkerEnv(**values)  # type: ignore[arg-type]


def test_contract_round_trips_and_tells_torchrun_not_to_share_the_agent_store() -> None:
    env = make_env(checkpoint_keep=5, progress_file="/tmp/p.json")
    raw = env.to_env()
    assert raw[contract.PET_NNODES] == "1:4" and raw[contract.TORCH_DISABLE_SHARE_RDZV_TCP_STORE] == "1"
    assert contract.WorkerEnv.from_env(raw) == env
    assert contract.DDPJOB_PROGRESS_FILE not in make_env().to_env()  # pods get no local-only variable


@pytest.mark.parametrize(("name", "value", "message"), [
    (contract.DDPJOB_CHECKPOINT_KEEP, "0", "DDPJOB_CHECKPOINT_KEEP='0' must be a positive integer"),
    (contract.DDPJOB_SIGTERM_BUDGET_SECONDS, "0", "DDPJOB_SIGTERM_BUDGET_SECONDS=0 must be >= 1"),
    (contract.PET_RDZV_ENDPOINT, "nohost", "PET_RDZV_ENDPOINT='nohost' is malformed"),
])
def test_contract_errors_name_the_variable(name: str, value: str, message: str) -> None:
    raw = {**make_env().to_env(), name: value}
    with pytest.raises(contract.ContractError, match=message):
        contract.WorkerEnv.from_env(raw)


def test_torchrun_argv_maps_the_container_args() -> None:
    env = make_env()
    launcher = [sys.executable, "-m", "ddpjob_worker.launch"]
    # Python code runs under the recorded runner, so its exceptions reach torchrun as error files.
    recorded = [*launcher, "--module", "ddpjob_worker.recorded"]
    assert entrypoint.torchrun_argv(["python", "-m", "pkg.train", "--x"], env) == [*recorded, "--module",
                                                                                   "pkg.train", "--x"]
    assert entrypoint.torchrun_argv(["python3", "train.py", "1"], env) == [*recorded, "train.py", "1"]
    assert entrypoint.torchrun_argv(["train.py"], env) == [*recorded, "train.py"]
    assert entrypoint.torchrun_argv(["./bin/train"], env) == [*launcher, "--no-python", "./bin/train"]
    # -u is what PYTHONUNBUFFERED=1 already does; any other interpreter flag keeps the command as it is.
    assert entrypoint.torchrun_argv(["python", "-u", "t.py"], env) == [*recorded, "t.py"]
    assert entrypoint.torchrun_argv(["python3", "-u", "-m", "pkg"], env) == [*recorded, "--module", "pkg"]
    assert entrypoint.torchrun_argv(["python", "-O", "t.py"], env) == [*launcher, "--no-python", "python", "-O",
                                                                       "t.py"]
    assert entrypoint.torchrun_argv(["python", "-c", "pass"], env) == [*launcher, "--no-python", "python", "-c",
                                                                       "pass"]
    with pytest.raises(contract.ContractError, match="no training command"):
        entrypoint.torchrun_argv([], env)


def test_parse_args_splits_at_double_dash() -> None:
    assert entrypoint.parse_args(["--dry-run", "--", "python", "t.py", "--help"]) == (True, ["python", "t.py",
                                                                                             "--help"])
    assert entrypoint.parse_args(["python", "t.py", "--lr", "1"]) == (False, ["python", "t.py", "--lr", "1"])


def test_environment_defaults_keep_user_settings() -> None:
    env = make_env(nproc_per_node="2")
    out = entrypoint.prepare_environ({"OMP_NUM_THREADS": "7"}, env)
    assert out["OMP_NUM_THREADS"] == "7"
    assert out["TORCHELASTIC_ERROR_FILE"] == "/checkpoints/.errors/worker-1.json"
    assert entrypoint.default_omp_threads("2", cpus=8) == 4
    assert entrypoint.default_omp_threads("auto", cpus=8, gpus=0) == 1
    assert entrypoint.default_omp_threads("auto", cpus=16, gpus=4) == 4
    assert entrypoint.default_omp_threads("gpu", cpus=8, gpus=2) == 4


def test_cgroup_quota_limits_cpus(tmp_path: pytest.TempPathFactory) -> None:
    path = tmp_path / "cpu.max"  # type: ignore[operator]
    path.write_text("150000 100000\n")
    assert entrypoint.available_cpus(str(path)) <= 2
    path.write_text("max 100000\n")
    assert entrypoint.available_cpus(str(path)) >= 1


def test_wait_for_dns_retries_then_gives_up_without_raising() -> None:
    calls: list[str] = []

    def flaky(host: str) -> object:
        calls.append(host)
        if len(calls) < 3:
            raise OSError("Name or service not known")
        return "10.0.0.1"

    assert entrypoint.wait_for_dns("j-rdzv", 10, flaky) is True and len(calls) == 3

    def never(host: str) -> object:
        raise OSError("nope")

    assert entrypoint.wait_for_dns("j-rdzv", 0, never) is False


def test_dns_failure_names_the_service_to_check() -> None:
    message = entrypoint.dns_failure_message("j-rdzv.j.ns.svc", 300)
    assert "j-rdzv.j.ns.svc did not resolve within 300s" in message
    assert "headless Service j exists in namespace ns" in message and "rendezvous pod j-rdzv" in message


def pod_environ(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, **overrides: object) -> Path:
    """Put a worker pod's environment into os.environ; returns its termination-log path."""
    termination = tmp_path / "termination-log"
    raw = make_env(checkpoint_dir=str(tmp_path), **overrides).to_env()
    for name, value in {**raw, contract.DDPJOB_TERMINATION_LOG: str(termination),
                        contract.DDPJOB_DNS_WAIT_SECONDS: "0"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(os, "execve", lambda *a: pytest.fail(f"torchrun was started: {a}"))
    return termination


def test_unresolvable_rendezvous_host_exits_202_naming_the_service(monkeypatch: pytest.MonkeyPatch,
                                                                    tmp_path: Path) -> None:
    """It used to start torchrun anyway, which failed much later with a message naming no Service."""
    termination = pod_environ(monkeypatch, tmp_path)
    monkeypatch.setattr(entrypoint, "wait_for_dns", lambda host, timeout: False)
    with pytest.raises(SystemExit) as exited:
        entrypoint.main(["python", "train.py"])
    assert exited.value.code == contract.EXIT_DNS_UNRESOLVED == 202
    assert termination.read_text() == entrypoint.dns_failure_message("j-rdzv.j.ns.svc", 0) + "\n"


def test_broken_contract_writes_the_termination_message(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    termination = pod_environ(monkeypatch, tmp_path)
    monkeypatch.delenv(contract.PET_RDZV_ENDPOINT)
    with pytest.raises(SystemExit) as exited:
        entrypoint.main(["python", "train.py"])
    assert exited.value.code == contract.EXIT_BAD_CONTRACT
    assert termination.read_text().startswith("broken environment contract: PET_RDZV_ENDPOINT is not set")


@pytest.mark.parametrize(
    ("command", "args", "expected"),
    [
        (None, ["python", "t.py"], ["python", "t.py"]),  # the image's entrypoint, ddp-worker
        (["ddp-worker"], ["--", "t.py"], ["t.py"]),
        (["/usr/local/bin/ddp-worker", "python"], ["-m", "pkg"], ["python", "-m", "pkg"]),
        (["python", "t.py"], None, None),  # ddp-worker replaced: no worker runtime
        (["torchrun", "t.py"], [], None),
    ],
)
def test_training_command_is_what_ddp_worker_runs(command: list[str] | None, args: list[str] | None,
                                                  expected: list[str] | None) -> None:
    assert contract.training_command(command, args) == expected
