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
    # Issue 43 #12: what the first version missed.
    ("psql: FATAL (PGPASSWORD=hunter2 psql -h db)", "psql: FATAL (PGPASSWORD=*** psql -h db)"),
    ("Authorization: 0123456789abcdef0123", "Authorization: ***"),
    ("Authorization: AWS4-HMAC-SHA256 Credential=AKID/20260101/us-east-1/s3/aws4_request, SignedHeaders=host, "
     "Signature=fe5f80f77d5fa3beca038a248ff027", "Authorization: AWS4-HMAC-SHA256 ***"),
    ("curl -H 'Authorization: token-abc' https://x.example", "curl -H 'Authorization: ***' https://x.example"),
    ("request headers\\nAuthorization: abcdef0123\\nHost: x", "request headers\\nAuthorization: ***\\nHost: x"),
    ("train.py --password hunter2 --epochs 3", "train.py --password *** --epochs 3"),
    ("train.py --hf-token 'my token' --epochs 3", "train.py --hf-token '***' --epochs 3"),
    ('login failed: password="correct horse battery staple" user=bob', 'login failed: password="***" user=bob'),
    ("{'db_password': 'two words', 'host': 'db'}", "{'db_password': '***', 'host': 'db'}"),
    ("Cookie: session=abc123; csrftoken=xyz", "Cookie: ***"),
    ("{'Set-Cookie': 'sid=abc; HttpOnly'}", "{'Set-Cookie': '***'}"),
    ("DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=Zm9vYmFyYmF6+/==;EndpointSuffix=core.windows.net",
     "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=***;EndpointSuffix=core.windows.net"),
    ("GitLab said 401 for glpat-abcdefghij0123456789", "GitLab said 401 for ***"),
    ("maps?key=AIzaSyA-1234567890abcdefghijklmnopqrstu&q=x", "maps?key=***&q=x"),
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
                                  "the password reset page", "train.py --max-tokens 512",
                                  "--password-file /run/secrets/db", "the cookie jar is empty",
                                  "Authorization failed for user bob"])
def test_words_that_only_look_like_secret_names_stay(text: str) -> None:
    assert redact(text) == text


def test_the_termination_message_the_worker_writes_is_redacted(tmp_path: Path) -> None:
    from ddpjob_worker import contract
    from ddpjob_worker.termlog import write_termination_log

    path = tmp_path / "termination-log"
    write_termination_log("worker 1: ValueError: bad  header\\nAuthorization: Bearer abcdefghijklmnop",
                          {contract.DDPJOB_TERMINATION_LOG: str(path)})
    assert path.read_text() == "worker 1: ValueError: bad header\\nAuthorization: Bearer ***\n"
