"""The `ddpjob` command line: run the operator against the current kubeconfig, or run a DDPJob locally."""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(no_args_is_help=True, help="ddpjob: fault-tolerant PyTorch DDP training on Kubernetes.")


@app.command()
def operator(
    namespace: list[str] = typer.Option(  # noqa: B008 - typer's documented style
        [], "--namespace", "-n", help="Watch only these namespaces (default: all namespaces)."
    ),
    metrics_port: int = typer.Option(8080, help="Port of the Prometheus /metrics endpoint (0 disables it)."),
    liveness_port: int = typer.Option(8081, help="Port of kopf's /healthz liveness endpoint (0 disables it)."),
) -> None:
    """Run the ddpjob operator against the current kubeconfig (or in-cluster config)."""
    from ddpjob_operator.main import run_operator  # imported late: `ddpjob run` needs no kopf start-up

    raise typer.Exit(run_operator(namespaces=namespace, metrics_port=metrics_port, liveness_port=liveness_port))


@app.command()
def run(
    manifest: Path = typer.Argument(..., exists=True, dir_okay=False, help="A DDPJob YAML manifest."),
    workdir: Path = typer.Option(Path(".ddpjob-local"), help="Where local checkpoints and logs are kept."),
    kill_after: float | None = typer.Option(
        None, help="Fault injection: SIGKILL one worker's training process after this many seconds."
    ),
) -> None:
    """Run a DDPJob manifest locally: one torchrun agent per replica on localhost, no Kubernetes."""
    from ddpjob_worker.local import run_local  # imported late: the operator image has no torch

    raise typer.Exit(run_local(manifest, workdir=workdir, kill_after=kill_after))


@app.command()
def version() -> None:
    """Print the ddpjob version."""
    from importlib.metadata import version as _v

    typer.echo(_v("ddpjob"))
