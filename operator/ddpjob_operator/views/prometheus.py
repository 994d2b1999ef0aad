"""A job's global step over time from Prometheus (`kubectl ddpjob report --prometheus URL`): the operator exports
ddpjob_job_global_step{ddpjob_namespace, ddpjob_name} (metrics.JobStatsCollector), and Prometheus keeps a sample
per scrape, where the job's status keeps only its latest step. Read with the HTTP API's range query."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from datetime import UTC, datetime

from ddpjob_operator.views.kubectl import ViewError

METRIC = "ddpjob_job_global_step"
#: At most this many points per query (Prometheus refuses more than 11,000): the step widens for long jobs.
MAX_POINTS = 2000


def query(namespace: str, name: str) -> str:
    def quoted(value: str) -> str:
        return json.dumps(value)  # a PromQL string literal: the same escapes as JSON

    # max: with two operator replicas scraped, only the leader exports a job, but a failover leaves both for a while.
    return f"max({METRIC}{{ddpjob_namespace={quoted(namespace)},ddpjob_name={quoted(name)}}})"


def resolution(start: datetime, end: datetime) -> float:
    """Seconds between points: 1 s, or wider so that the whole job fits in MAX_POINTS."""
    return max(1.0, (end - start).total_seconds() / MAX_POINTS)


def parse(answer: object) -> list[tuple[datetime, int]]:
    """(time, step) points of a range query's answer (one series after max)."""
    if not isinstance(answer, dict) or answer.get("status") != "success":
        error = answer.get("error") if isinstance(answer, dict) else None
        raise ViewError(f"ddpjob: Prometheus refused the query: {error or answer!r}")
    points: list[tuple[datetime, int]] = []
    for series in (answer.get("data") or {}).get("result") or []:
        for at, value in series.get("values") or []:
            points.append((datetime.fromtimestamp(float(at), UTC), int(float(value))))
    return sorted(points)


def steps(url: str, namespace: str, name: str, start: datetime, end: datetime,
          timeout: float = 30) -> list[tuple[datetime, int]]:
    """The job's global step from ``start`` to ``end`` as the Prometheus at ``url`` scraped it."""
    params = urllib.parse.urlencode({"query": query(namespace, name), "start": f"{start.timestamp():.3f}",
                                     "end": f"{end.timestamp():.3f}", "step": f"{resolution(start, end):.3f}"})
    target = f"{url.rstrip('/')}/api/v1/query_range?{params}"
    try:
        with urllib.request.urlopen(target, timeout=timeout) as resp:
            answer = json.loads(resp.read())
    except urllib.error.HTTPError as err:  # a bad query answers 400 with Prometheus' own reason in the body
        try:
            answer = json.loads(err.read())
        except ValueError:
            raise ViewError(f"ddpjob: Prometheus at {url} answered {err.code} {err.reason}") from None
    except (urllib.error.URLError, TimeoutError, ValueError) as err:
        reason = getattr(err, "reason", err)
        raise ViewError(f"ddpjob: cannot read Prometheus at {url}: {reason}") from None
    return parse(answer)
