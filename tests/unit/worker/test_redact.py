"""Credentials are masked in messages copied to status, conditions and Events; the rest of a message stays."""

from __future__ import annotations

from pathlib import Path

import pytest
from ddpjob_worker.redact import redact

JWT = "eyJhbGciOiJSUzI1NiIsImtpZCI6IjEifQ.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQifQ.c2lnbmF0dXJlLWJ5dGVzLWhlcmU"
SHA = "d063c032930bdc7d654f451fb6434ed8c0ae84d282a0ac8c5e989e67bea951e6"


@pytest.mark.parametrize(("text", "want"), [
    ("ConnectionError: https://alice:s3cr3t@data.example/shard-1.tar",
     "ConnectionError: https://alice:***@data.example/shard-1.tar"),
    ("403 for https://bucket.s3.example/x?X-Amz-Credential=AK%2F1&X-Amz-Signature=abcdef0123&part=2",
     "403 for https://bucket.s3.example/x?X-Amz-Credential=***&X-Amz-Signature=***&part=2"),
    ("GET https://hub.example/api?token=hf_abcdefghijklmnopqrstuvwxyz0123456789 failed",
     "GET https://hub.example/api?token=*** failed"),
    ("headers={'Authorization': 'Bearer abcdefghijklmnop'}", "headers={'Authorization': 'Bearer ***'}"),
    (f"Unauthorized: {JWT}", "Unauthorized: ***"),
    ("RuntimeError: WANDB_API_KEY=0123456789abcdef0123 rejected", "RuntimeError: WANDB_API_KEY=*** rejected"),
    ('{"password": "hunter2", "user": "bob"}', '{"password": "***", "user": "bob"}'),
    ("boto: AKIAIOSFODNN7EXAMPLE denied", "boto: *** denied"),
    ("git clone https://ghp_abcdefghijklmnopqrstuvwxyz0123456789@git.example/x",
     "git clone https://***@git.example/x"),
    ("key -----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY----- end",
     "key -----PRIVATE KEY ***----- end"),
    # What must stay: digests, paths, exit codes, the cause.
    (f"checkpoint step-12 sha256 {SHA}", f"checkpoint step-12 sha256 {SHA}"),
    ("RendezvousLost: store ddpjob-j-rdzv:29400 unreachable (exit 200)",
     "RendezvousLost: store ddpjob-j-rdzv:29400 unreachable (exit 200)"),
    ("OSError: [Errno 28] No space left on device: '/ckpt/step-4'",
     "OSError: [Errno 28] No space left on device: '/ckpt/step-4'"),
    ("tokenizer failed to load vocab.json", "tokenizer failed to load vocab.json"),
])
def test_redact(text: str, want: str) -> None:
    assert redact(text) == want
    assert redact(want) == want  # idempotent: the operator may see a message the worker already redacted


@pytest.mark.parametrize("text", ["max_tokens: 512", "num_tokens=5", "Signal 9 (SIGKILL)", "keyboard interrupt",
                                  "the password reset page"])
def test_words_that_only_look_like_secret_names_stay(text: str) -> None:
    assert redact(text) == text


def test_the_termination_message_the_worker_writes_is_redacted(tmp_path: Path) -> None:
    from ddpjob_worker import contract
    from ddpjob_worker.termlog import write_termination_log

    path = tmp_path / "termination-log"
    write_termination_log("worker 1: ValueError: bad  header\\nAuthorization: Bearer abcdefghijklmnop",
                          {contract.DDPJOB_TERMINATION_LOG: str(path)})
    assert path.read_text() == "worker 1: ValueError: bad header\\nAuthorization: Bearer ***\n"
