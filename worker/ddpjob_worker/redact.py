"""Credentials out of messages that leave the pod (issue 23 #14).

A failure's last line becomes the container's termination message, and the operator copies it into the DDPJob's
conditions, ``status.incidents`` and Events: objects that more people may read than the pod's logs. A traceback
easily holds a secret: a URL with a user and password or a signed query, an ``Authorization`` header, a token
passed as an argument. ``redact`` replaces each such value with ``***`` and keeps the rest, so the message still
says what failed. Torch-free and standard-library only: the operator and the injected runtime both use it.

Hex digests (our checkpoints' sha256, git commits) are left alone: a pattern wide enough to catch every random
string would also hide the digests that messages name on purpose."""

from __future__ import annotations

import re

MASK = "***"

# Names whose value is a secret, as a query parameter, an environment-style assignment, a JSON/YAML key or a
# command-line option; in text with any prefix (WANDB_API_KEY, AWS_SECRET_ACCESS_KEY, DB_PASSWORD, PGPASSWORD).
_SECRET_NAMES = (
    r"(?:access[_-]?token|id[_-]?token|refresh[_-]?token|auth[_-]?token|token|api[_-]?key|apikey|access[_-]?key"
    r"|secret[_-]?access[_-]?key|secret[_-]?key|client[_-]?secret|secret|password|passwd|pwd|private[_-]?key"
    r"|account[_-]?key|x-amz-signature|x-amz-credential|x-amz-security-token|x-goog-signature|x-goog-credential"
    r"|signature|sig)"
)
# A name with its prefix, whole words only: "PGPASSWORD" and "db_password" count, "the password reset" has no value.
_SECRET_WORD = rf"\b[A-Za-z0-9_-]*?{_SECRET_NAMES}"
# A value: quoted (spaces and escaped quotes included) or one word; never one this module already masked.
_VALUE = r"""(?!\*\*\*)(?:"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|[^\s'",;&]+)"""
# Where a header's name starts: a word's start, or right after an escaped newline (``\\n`` in a one-line message).
_START = r"(?:(?<=\\n)|\b)"
# Authorization schemes whose name may stay in a masked header (it says which kind of credential failed).
_SCHEMES = r"(?:Bearer|Basic|Digest|Token|Negotiate|NTLM|OAuth|AWS4-HMAC-SHA256|SharedKey|SharedKeyLite)"

_RULES: tuple[tuple[re.Pattern[str], str | None], ...] = (
    # A PEM private key, whole.
    (re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|$)", re.S),
     f"-----PRIVATE KEY {MASK}-----"),
    # scheme://user:password@host: the password (the user may stay: it says which account failed).
    (re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s:/@]*:)[^\s@/]+(@)"), rf"\1{MASK}\2"),
    # An Authorization or Cookie header (raw, or a dict's key): the whole value up to the line's (a real or an
    # escaped newline) or the quote's end, but a known scheme's name.
    (re.compile(rf"({_START}(?:Proxy-)?Authorization[\"']?\s*[:=]\s*[\"']?(?:{_SCHEMES}\s+)?)"
                rf"(?!(?:{_SCHEMES}\s+)?\*\*\*)[^\s'\"\\][^\r\n'\"\\]*", re.I), rf"\1{MASK}"),
    (re.compile(rf"({_START}(?:Set-)?Cookie[\"']?\s*[:=]\s*[\"']?)(?!\*\*\*)[^\s'\"\\][^\r\n'\"\\]*", re.I),
     rf"\1{MASK}"),
    # A bare "Bearer <token>" / "Basic <base64>".
    (re.compile(r"(\b(?:Bearer|Basic|Token)\s+)[A-Za-z0-9._~+/=-]{8,}", re.I), rf"\1{MASK}"),
    # ?token=...&sig=... in a URL, and name=value / name: value / "name": "value" in text.
    (re.compile(rf"([?&;]{_SECRET_NAMES}=)[^&#;\s'\"]+", re.I), rf"\1{MASK}"),
    (re.compile(rf"({_SECRET_WORD}[\"']?\s*[=:]\s*){_VALUE}", re.I), None),
    # --password x, --api-key "a b" (--password=x is name=value above).
    (re.compile(rf"(--?{_SECRET_WORD}\s+)(?!-){_VALUE}", re.I), None),
    # Tokens recognisable by their shape alone.
    (re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"), MASK),  # a JWT (service accounts)
    (re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), MASK),  # an AWS access key id
    (re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,})"), MASK),  # GitHub
    (re.compile(r"\bgl(?:pat|dt|rt|ptt|ft|soat|cbt)-[A-Za-z0-9_-]{20,}"), MASK),  # GitLab
    (re.compile(r"\bAIza[0-9A-Za-z_-]{35}"), MASK),  # a Google API key
    (re.compile(r"\bhf_[A-Za-z0-9]{30,}"), MASK),  # Hugging Face
    (re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}"), MASK),  # Slack
    (re.compile(r"\bsk-(?:proj-)?[A-Za-z0-9_-]{20,}"), MASK),  # OpenAI-style secret keys
)


def _masked(match: re.Match[str]) -> str:
    """The name part kept, the value masked; a quoted value keeps its quotes."""
    value = match.group(0)[len(match.group(1)):]
    quote = value[0] if value[:1] in ("'", '"') else ""
    return f"{match.group(1)}{quote}{MASK}{quote}"


def redact(text: str) -> str:
    """``text`` with every credential it holds replaced by ``***``."""
    for pattern, replacement in _RULES:
        text = pattern.sub(_masked if replacement is None else replacement, text)
    return text
