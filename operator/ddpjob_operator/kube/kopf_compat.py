"""kopf's private modules, named here and nowhere else: the operator reuses kopf's authenticated API client and its
error types (kube/client.py, runtime/resync.py) and its watch stream (podwatch.py), which kopf keeps under
``kopf._cogs`` and may change in any release. pyproject pins kopf to the minor these were read in and tested with
(``kopf>=1.45,<1.46``); moving that pin means checking each name below against the new kopf, and the tests that use
them."""

from __future__ import annotations

from kopf._cogs.clients import api as kopf_api
from kopf._cogs.clients import errors as kopf_errors
from kopf._cogs.clients import watching as kopf_watching
from kopf._cogs.structs import references as kopf_references

__all__ = ["kopf_api", "kopf_errors", "kopf_references", "kopf_watching"]
