"""What a user reads in a DDPJob's Failed condition and failure Events must be a cause, not a dump: never native
frame addresses (`... (0x55d2e1 in /opt/venv/bin/python3)`), `frame #N` lines, Python tracebacks or a CLI's usage
text. Every integration and e2e namespace is checked with this before it is deleted (tests/conftest.py)."""

from __future__ import annotations

import json
import re
from typing import Any

UNREADABLE = {
    "a native frame address": re.compile(r"\(0x[0-9a-fA-F]+ in |\+ 0x[0-9a-fA-F]{2,}\b"),
    "a frame line": re.compile(r"\bframe #\d+:"),
    "a Python traceback": re.compile(r"Traceback \(most recent call last\)"),
    "usage text": re.compile(r"(?:^|\n|: )usage: \S+ \["),
}

#: Event reasons that report a failure (Warning Events of DDPJobs).
FAILURE_EVENT_TYPES = ("Warning",)


def problems(text: str) -> list[str]:
    """What makes ``text`` unreadable (empty when it is fine)."""
    return [what for what, pattern in UNREADABLE.items() if pattern.search(text)]


def failure_texts(kubectl: Any, namespace: str) -> list[tuple[str, str]]:
    """(where, text) of every Failed condition of a DDPJob and every Warning Event about a DDPJob."""
    out: list[tuple[str, str]] = []
    jobs = json.loads(kubectl("get", "ddpjobs", "-n", namespace, "-o", "json", check=False).stdout or '{"items":[]}')
    for job in jobs.get("items", []):
        for cond in (job.get("status") or {}).get("conditions") or []:
            if cond.get("type") == "Failed" and cond.get("status") == "True":
                out.append((f"DDPJob {job['metadata']['name']} Failed condition", cond.get("message") or ""))
        for inc in (job.get("status") or {}).get("incidents") or []:
            out.append((f"DDPJob {job['metadata']['name']} incident #{inc.get('id')}", inc.get("message") or ""))
    events = json.loads(kubectl("get", "events", "-n", namespace, "-o", "json", check=False).stdout or '{"items":[]}')
    for ev in events.get("items", []):
        if ev.get("type") in FAILURE_EVENT_TYPES and (ev.get("involvedObject") or {}).get("kind") == "DDPJob":
            out.append((f"Event {ev.get('reason')}", ev.get("message") or ""))
    return out


def assert_readable(kubectl: Any, namespace: str) -> int:
    """Fail with every unreadable failure message of the namespace; returns how many messages were checked."""
    texts = failure_texts(kubectl, namespace)
    bad = [f"{where} has {', '.join(problems(text))}: {text[:400]!r}" for where, text in texts if problems(text)]
    assert not bad, "unreadable failure messages:\n" + "\n".join(bad)
    return len(texts)
