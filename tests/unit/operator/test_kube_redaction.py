"""The API server's refusals reach the job's conditions and Events (CreateRefused, InvalidPodTemplate) redacted: a
webhook or a validation error may quote the object it refused, and a pod's env may hold a credential."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf
import pytest
from ddpjob_operator.kube.client import Kube, Rejected
from ddpjob_operator.kube.kopf_compat import kopf_errors

POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "j-worker-0", "namespace": "ns"}}
SECRET = "hunter2hunter2"


def status(message: str) -> Any:
    """The Status object the API server answers a refused create with."""
    return {"kind": "Status", "status": "Failure", "message": message}


class Refusing(Kube):
    """A client whose every request the API server answers with ``error``."""

    def __init__(self, error: Exception) -> None:
        super().__init__(kopf.OperatorSettings(), logging.getLogger("test"))
        self.error = error

    async def _call(self, *_: Any, **__: Any) -> Any:
        raise self.error


def create_failing_with(error: Exception) -> Any:
    """What Kube.create makes of the API server answering a create with ``error``."""
    return asyncio.run(Refusing(error).create(POD))


def test_a_webhooks_denial_is_redacted_and_still_diagnosed() -> None:
    message = (f'admission webhook "policy.example" denied the request: pods "j-worker-0" is forbidden: exceeded '
               f"quota: q; env PGPASSWORD={SECRET} is not allowed")
    created = create_failing_with(kopf_errors.APIForbiddenError(status(message), status=403, headers={}))
    assert created.refused is not None and created.refused.reason == "AdmissionDenied"
    assert SECRET not in created.refused.message and "PGPASSWORD=***" in created.refused.message


def test_a_validation_error_is_redacted_in_the_message_and_the_exception() -> None:
    message = f'Pod "j-worker-0" is invalid: spec.containers[0].args: Invalid value: "--password {SECRET}": bad'
    with pytest.raises(Rejected) as rejected:
        create_failing_with(kopf_errors.APIUnprocessableEntityError(status(message), status=422,
                                                                     headers={}))
    assert SECRET not in rejected.value.message and SECRET not in str(rejected.value)
    assert "spec.containers[0].args: Invalid value" in rejected.value.message
