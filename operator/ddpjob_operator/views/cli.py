"""`kubectl ddpjob describe|list` (the ``kubectl-ddpjob`` executable that ``pip install ddpjob`` puts on the
PATH, which kubectl runs as a plugin) and the same commands as `ddpjob describe|list`."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from ddpjob_operator.api.spec import MULTIKUEUE_MANAGER, manager_of
from ddpjob_operator.views import describe as describe_view
from ddpjob_operator.views import facts, listing
from ddpjob_operator.views import prometheus as prometheus_view
from ddpjob_operator.views import report as report_view
from ddpjob_operator.views.kubectl import Kubectl, ViewError

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="Views of DDPJobs (ddpjob.io): describe one, list them. Reads the cluster with your kubectl, "
                       "so your kubeconfig, context and credentials apply.")

Namespace = Annotated[str | None, typer.Option("--namespace", "-n", help="The job's namespace (default: the "
                                                                         "context's).")]
Context = Annotated[str | None, typer.Option("--context", help="The kubeconfig context to use.")]
Kubeconfig = Annotated[str | None, typer.Option("--kubeconfig", help="The kubeconfig file to use.")]
Watch = Annotated[bool, typer.Option("--watch", "-w", help="Keep showing it, redrawn when it changes (Ctrl-C ends).")]
Interval = Annotated[float, typer.Option("--interval", min=0.2, help="Seconds between reads with --watch.")]


def _now() -> datetime:
    return datetime.now(UTC)


def _show(render: Callable[[], tuple[str, bool]], watch: bool, interval: float) -> None:
    """Print ``render()`` once, or with ``watch`` each time it changes until it says it is final (a finished job)
    or Ctrl-C. On a terminal the screen is redrawn; in a pipe each new view follows the last."""
    last = None
    try:
        while True:
            try:
                text, final = render()
            except ViewError as err:
                typer.echo(str(err), err=True)
                raise typer.Exit(1) from None
            if text != last:
                if watch and sys.stdout.isatty():
                    typer.echo("\033[H\033[2J", nl=False)
                elif watch and last is not None:
                    typer.echo("")
                typer.echo(text, nl=False)
                last = text
            if not watch or final:
                return
            time.sleep(interval)
    except KeyboardInterrupt:
        return


@app.command()
def describe(name: Annotated[str, typer.Argument(help="The DDPJob's name.")], namespace: Namespace = None,
             context: Context = None, kubeconfig: Kubeconfig = None, watch: Watch = False,
             interval: Interval = 2.0) -> None:
    """State, progress (bar, steps, epoch, ETA), last checkpoint, spares, queue, and the incidents as a timeline
    with each recovery phase and the Events that belong to it. With --watch, ends when the job finishes."""
    kube = Kubectl(namespace=namespace, context=context, kubeconfig=kubeconfig)

    def render() -> tuple[str, bool]:
        job = kube.job(name)
        where = kube.worker_cluster(job) if manager_of(job) == MULTIKUEUE_MANAGER else None
        text = describe_view.render(job, kube.events(job), _now(), worker_cluster=where)
        return text, (job.get("status") or {}).get("state") in facts.FINISHED

    _show(render, watch, interval)


@app.command("list")
def list_jobs(namespace: Namespace = None,
              all_namespaces: Annotated[bool, typer.Option("--all-namespaces", "-A",
                                                           help="Jobs of every namespace.")] = False,
              context: Context = None, kubeconfig: Kubeconfig = None, watch: Watch = False,
              interval: Interval = 2.0) -> None:
    """Every DDPJob: state, ready workers, progress, incidents, time lost to failures (each incident from its start
    to the first step after it) and goodput (the share of the job's time not lost so)."""
    kube = Kubectl(namespace=namespace, context=context, kubeconfig=kubeconfig)

    def render() -> tuple[str, bool]:
        return listing.render(kube.jobs(all_namespaces), _now(), namespaces=all_namespaces), False

    _show(render, watch, interval)


@app.command()
def report(name: Annotated[str, typer.Argument(help="The DDPJob's name.")],
           output: Annotated[Path, typer.Option("--output", "-o", help="The PNG to write.")] = Path("job.png"),
           namespace: Namespace = None, context: Context = None, kubeconfig: Kubeconfig = None,
           prometheus: Annotated[str | None, typer.Option(
               "--prometheus", help="A Prometheus that scrapes the operator (e.g. http://localhost:9090): the step "
                                    "at every scrape, not only the points the job's status keeps.")] = None) -> None:
    """A picture of the job: global step over time, each incident shaded from its start to its recovery,
    the last checkpoint marked, the goodput in the title (from the job's status and Events, and with --prometheus
    from its series). Needs matplotlib."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        typer.echo("ddpjob: report draws with matplotlib, which is not installed: pip install 'ddpjob[report]'",
                   err=True)
        raise typer.Exit(1) from None
    kube = Kubectl(namespace=namespace, context=context, kubeconfig=kubeconfig)
    try:
        job = kube.job(name)
        now = _now()
        series = _series(prometheus, job, now) if prometheus else []
        tl = report_view.timeline(job, kube.events(job), now, series)
    except ViewError as err:
        typer.echo(str(err), err=True)
        raise typer.Exit(1) from None
    report_view.draw(tl, output)
    typer.echo(f"{output}: {tl.title}" + (f" ({len(tl.series)} samples from Prometheus)" if prometheus else ""))


def _series(url: str, job: Mapping[str, Any], now: datetime) -> list[tuple[datetime, int]]:
    """The job's steps in Prometheus from its creation to its end; none there is said, not an error: the picture
    is then drawn from the status alone."""
    meta = job.get("metadata") or {}
    start = facts.parse_time(meta.get("creationTimestamp")) or now
    end = facts.end_of(job.get("status") or {}, now)
    points = prometheus_view.steps(url, str(meta.get("namespace") or ""), str(meta.get("name") or ""), start, end)
    if not points:
        typer.echo(f"ddpjob: {url} has no samples of {prometheus_view.METRIC} for this job in its time (does it "
                   "scrape the operator's /metrics?): drawn from the job's status alone", err=True)
    return points


def main() -> None:
    app(prog_name="kubectl ddpjob")
