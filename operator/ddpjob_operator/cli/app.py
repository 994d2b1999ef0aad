"""The `ddpjob` command line: run the operator against the current kubeconfig, or run a DDPJob locally."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from ddpjob_operator.api import names
from ddpjob_operator.kube import leader, ratelimit
from ddpjob_operator.planner.policies import report_cadence
from ddpjob_operator.views import cli as views_cli

app = typer.Typer(no_args_is_help=True, help="ddpjob: fault-tolerant PyTorch DDP training on Kubernetes.")


@app.command()
def operator(
    namespace: Annotated[
        list[str] | None,
        typer.Option("--namespace", "-n", help="Watch only these namespaces (default: all namespaces)."),
    ] = None,
    metrics_port: Annotated[int, typer.Option(help="Port of the Prometheus /metrics endpoint (0 disables it).")] = 8080,
    liveness_port: Annotated[int, typer.Option(help="Port of kopf's /healthz liveness endpoint (0 off).")] = 8081,
    resync_seconds: Annotated[
        float, typer.Option(help="Re-list every watched kind this often and correct what the watches missed (0: off); "
                     "longer past 200 listed objects a second of it.")
    ] = 60.0,
    runtime_image: Annotated[
        str,
        typer.Option(envvar="DDPJOB_RUNTIME_IMAGE", help="Image of the injected worker runtime and the rendezvous "
                     "store (a job's spec.runtime.image overrides it)."),
    ] = "ddpjob-runtime:dev",
    worker_admission_policy: Annotated[
        str,
        typer.Option(envvar="DDPJOB_WORKER_ADMISSION_POLICY", help="The chart's ValidatingAdmissionPolicy (and "
                     "binding) that holds each worker to its own job's status.progress: checked at start and every "
                     "resync, its absence reported on every job (condition StatusUnprotected). Empty: not checked."),
    ] = "",
    report_writes_per_second: Annotated[
        float, typer.Option(envvar="DDPJOB_REPORT_WRITES_PER_SECOND", help="Routine progress reports per second for "
                            "all running jobs together: their rank 0s' cadence (status.reportIntervalSeconds) "
                            "doubles from 10 s until they fit, up to 320 s (0: no budget).")
    ] = report_cadence.DEFAULT_BUDGET,
    api_qps: Annotated[
        float, typer.Option(envvar="DDPJOB_API_QPS", help="API requests per second after the burst (0: no limit).")
    ] = ratelimit.DEFAULT_QPS,
    api_burst: Annotated[
        int, typer.Option(envvar="DDPJOB_API_BURST", help="API requests that may go at once before --api-qps applies.")
    ] = ratelimit.DEFAULT_BURST,
    leader_elect: Annotated[
        bool, typer.Option(help="Run as one of several replicas: reconcile only while holding the leader Lease "
                           "(coordination.k8s.io), wait as a standby otherwise.")
    ] = False,
    leader_election_namespace: Annotated[
        str | None, typer.Option(help="Namespace of the leader Lease (default: the operator's own in a pod, else "
                                 "'default').")
    ] = None,
    leader_election_lease: Annotated[
        str, typer.Option(help="Name of the leader Lease: replicas that share it elect one leader.")
    ] = names.LEADER_LEASE,
    lease_duration: Annotated[
        float, typer.Option(help="Seconds a standby waits on an unrenewed Lease before it takes over.")
    ] = leader.DEFAULT_TIMING.lease,
    renew_deadline: Annotated[
        float, typer.Option(help="Seconds a leader may fail to renew before it stops (less than --lease-duration).")
    ] = leader.DEFAULT_TIMING.renew_deadline,
    retry_period: Annotated[
        float, typer.Option(help="Seconds between renewals, and between a standby's tries.")
    ] = leader.DEFAULT_TIMING.retry,
) -> None:
    """Run the ddpjob operator against the current kubeconfig (or in-cluster config)."""
    # kopf imports the kubernetes client whenever it is installed, only to recognise its model objects, which the
    # operator never passes it: ~10 MB of RSS (66 -> 56 MB after importing the handlers). The operator image does
    # not install it; a dev venv does (the tests use it), and the operator must behave and measure the same there.
    sys.modules.setdefault("kubernetes", None)  # type: ignore[arg-type]
    from ddpjob_operator.runtime.main import run_operator  # imported late: `ddpjob run` needs no kopf start-up

    try:
        ratelimit.configure(api_qps, api_burst)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from err
    election = None
    if leader_elect:
        from ddpjob_operator.kube import lease_io
        from ddpjob_operator.runtime.main import Election

        timing = leader.Timing(lease=lease_duration, renew_deadline=renew_deadline, retry=retry_period)
        if (problem := timing.error()) is not None:
            raise typer.BadParameter(f"{problem} (--retry-period, --renew-deadline, --lease-duration)")
        election = Election(namespace=leader_election_namespace or lease_io.default_namespace(),
                            name=leader_election_lease, timing=timing)

    raise typer.Exit(run_operator(namespaces=namespace or [], metrics_port=metrics_port, liveness_port=liveness_port,
                                  resync_seconds=resync_seconds, election=election, runtime_image=runtime_image,
                                  worker_admission_policy=worker_admission_policy,
                                  report_budget=report_writes_per_second))


@app.command()
def run(
    manifest: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="A DDPJob YAML manifest.")],
    workdir: Annotated[Path, typer.Option(help="Where local checkpoints and logs are kept.")] = Path(".ddpjob-local"),
    kill_after: Annotated[
        float | None,
        typer.Option(help="Fault injection: SIGKILL one worker's training process this many seconds after training "
                     "first reports progress."),
    ] = None,
) -> None:
    """Run a DDPJob manifest locally: one torchrun agent per replica on localhost, no Kubernetes."""
    from ddpjob_operator.cli.local_run import run_local  # imported late: only `ddpjob run` needs it

    raise typer.Exit(run_local(manifest, workdir=workdir, kill_after=kill_after))


# The kubectl plugin's views (`kubectl ddpjob describe|list|report`), also as `ddpjob describe|list|report`.
app.command("describe")(views_cli.describe)
app.command("list")(views_cli.list_jobs)
app.command("report")(views_cli.report)


@app.command()
def version() -> None:
    """Print the ddpjob version."""
    from importlib.metadata import version as _v

    typer.echo(_v("ddpjob"))


if __name__ == "__main__":
    app()
