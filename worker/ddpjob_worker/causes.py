"""Root causes of failures as one readable line, and whether a failure was caused by losing a peer (pure: the
operator imports it too, so it must not import torch)."""

from __future__ import annotations

import json
import re

#: A traceback's exception line: a CamelCase type (optionally module-qualified) ending like an exception name.
_EXC_LINE = re.compile(
    r"^(?:[a-z_][\w]*\.)*(?P<type>[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Failure|Timeout|Warning))"
    r"(?::\s*(?P<message>.*))?$"
)
#: Lines of native stack traces that c10 appends to errors: never useful in a one-line cause.
_NATIVE_NOISE = re.compile(
    r"^(?:Exception raised from \S+ at |frame #\d+:|#\d+ \S|C\+\+ CapturedTraceback:|"
    r"\(no backtrace available\))"
)
#: torchrun prefixes every line of a worker's output with its rank, e.g. ``[rank1]: `` or ``[default0]:``.
_RANK_PREFIX = re.compile(r"^\[(?:rank|default)?\d+\]:\s?", re.MULTILINE)
_DOTTED = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*$")
_ADDRESS = re.compile(r"\s*\(0x[0-9a-fA-F]+ in [^)]*\)|\s*\+ 0x[0-9a-fA-F]+|\b0x[0-9a-fA-F]{6,}\b")
_TRACEBACK = "Traceback (most recent call last):"
_DIRECT_CAUSE = "The above exception was the direct cause of the following exception:"
_CONTEXT = "During handling of the above exception, another exception occurred:"
#: A chained cause is kept only when the line stays readable.
_SHORT_CAUSE = 160

#: Failures whose cause is another process: a peer died, hung or became unreachable (gloo, c10d store, NCCL).
_PEER_LOSS = [re.compile(p, re.IGNORECASE) for p in (
    r"connection (?:closed|reset) by (?:remote )?peer",
    r"\bDistNetworkError\b",
    r"\bDistBackendError\b.*(?:connection|timed? ?out|timeout|remote|network|peer)",
    r"socket timeout",
    r"Failed to recv, got 0 bytes",
    r"Timed out waiting \d+ms for (?:recv|send) operation",
    r"Application timeout caused pair closure",
    r"ncclRemoteError",
    r"remote process exited or there was a network error",
    r"Watchdog caught collective operation timeout",
    r"NCCL communicator was aborted",
    r"\bPeerStopped\b",  # a framework stopped this rank because a peer was stopped (ddpjob_worker.frameworks)
)]


def _error_file_text(text: str) -> str | None:
    """The traceback or message inside a torchelastic error file's JSON, or None when ``text`` is not one."""
    if not text.lstrip().startswith("{"):
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    message = data.get("message") if isinstance(data, dict) else None
    if isinstance(message, dict):
        extra = message.get("extraInfo")
        stack = extra.get("py_callstack") if isinstance(extra, dict) else None
        if isinstance(stack, str) and _TRACEBACK in stack:
            return stack
        inner = message.get("message")
        return inner if isinstance(inner, str) else json.dumps(message)
    return message if isinstance(message, str) else None


def _plain(text: str) -> str:
    """The failure text with error-file JSON unwrapped and torchrun's rank prefixes removed."""
    inner = _error_file_text(text)
    return _RANK_PREFIX.sub("", inner if inner is not None else text)


def _exception_at(lines: list[str], start: int) -> str:
    """The exception line at ``start`` joined with its continuation lines (multi-line messages, e.g. NCCL's)."""
    parts = [lines[start].strip()]
    for line in lines[start + 1:]:
        stripped = line.strip()
        if (not stripped or _NATIVE_NOISE.match(stripped) or stripped in (_DIRECT_CAUSE, _CONTEXT)
                or stripped.startswith(_TRACEBACK)):
            break
        parts.append(stripped)
    return " ".join(parts)


def _short_type(line: str) -> str:
    """``torch.distributed.DistNetworkError: m`` -> ``DistNetworkError: m`` (the error file's own form)."""
    name, sep, message = line.partition(":")
    if _DOTTED.match(name):
        return f"{name.rsplit('.', 1)[-1]}{sep}{message}"
    return line


def _last_exception(block: str) -> str | None:
    """The last exception (with its continuation lines) of a traceback or log block, or None."""
    if _TRACEBACK in block:
        # The exception is the first line after the frames, whatever its type is called (CorruptCheckpoint...).
        lines = block.rsplit(_TRACEBACK, 1)[1].splitlines()[1:]
        for i, line in enumerate(lines):
            if line.strip() and not line[:1].isspace():
                return _short_type(_exception_at(lines, i))
    lines = block.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        if not lines[i][:1].isspace() and _EXC_LINE.match(lines[i].strip()):
            return _short_type(_exception_at(lines, i))
    return None


def _usage_error(text: str) -> str | None:
    """The ``error:`` line of an argparse usage dump (the usage text itself says nothing about the failure)."""
    if not re.search(r"^usage: ", text, re.MULTILINE):
        return None
    errors = re.findall(r"^(?:\S+: )?error: .*$", text, re.MULTILINE)
    return errors[-1].strip() if errors else None


def _first_meaningful(text: str) -> str:
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not _NATIVE_NOISE.match(stripped) and stripped != _TRACEBACK:
            return stripped
    return ""


def _cap(line: str, limit: int) -> str:
    line = " ".join(_ADDRESS.sub("", line).split())
    return line if len(line) <= limit else line[: max(0, limit - 3)].rstrip() + "..."


def condense(text: str, limit: int = 500) -> str:
    """One readable line for whatever a failure produced: a Python traceback, a torchelastic error file, a c10d
    error with native frames, or a usage dump; never frame addresses or usage text, at most ``limit`` chars."""
    plain = _plain(text)
    usage = _usage_error(plain)
    if usage is not None:
        return _cap(usage, limit)
    chained = plain.split(_DIRECT_CAUSE)
    outer = _last_exception(chained[-1])
    if outer is None:
        return _cap(_first_meaningful(chained[-1]), limit)
    cause = _last_exception(chained[-2]) if len(chained) > 1 else None
    if cause is not None and len(cause) <= _SHORT_CAUSE and cause not in outer:
        outer = f"{outer} (caused by {cause})"
    return _cap(outer, limit)


def is_peer_loss(text: str) -> bool:
    """True when a failure was caused by losing a peer (a collective or the store connection broke or timed
    out), not by this process's own code; Python source lines of the traceback are not searched."""
    plain = _plain(text)
    # Indented lines of a traceback are file/line references and source code, which may quote anything.
    searched = "\n".join(line for line in plain.splitlines() if not line[:1].isspace())
    return any(pattern.search(searched) for pattern in _PEER_LOSS)
