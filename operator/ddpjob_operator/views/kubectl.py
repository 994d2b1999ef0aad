"""The reads behind `kubectl ddpjob`: the user's own kubectl, so whatever their kubeconfig, context, credentials
plugin or proxy is, this works the same as `kubectl get`. Errors become one line that says what to do."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
from typing import Any

from ddpjob_operator.api.names import LABEL_JOB_NAME
from ddpjob_operator.api.spec import GROUP, KIND, PLURAL

Obj = dict[str, Any]

RESOURCE = f"{PLURAL}.{GROUP}"
#: How long one read may take before the command gives up (kubectl's own request timeout).
REQUEST_TIMEOUT = "20s"


class ViewError(Exception):
    """A read failed for a reason the user can fix: the message is the whole story."""


@dataclasses.dataclass(frozen=True)
class Kubectl:
    """Global kubectl flags the user gave (``--context``, ``--kubeconfig``) and the namespace to read."""

    namespace: str | None = None
    context: str | None = None
    kubeconfig: str | None = None
    binary: str = "kubectl"

    def _base(self) -> list[str]:
        found = shutil.which(self.binary)
        if found is None:
            raise ViewError(f"ddpjob: {self.binary} is not on the PATH (the plugin reads the cluster through it)")
        args = [found, f"--request-timeout={REQUEST_TIMEOUT}"]
        if self.context:
            args.append(f"--context={self.context}")
        if self.kubeconfig:
            args.append(f"--kubeconfig={self.kubeconfig}")
        return args

    def _ns(self, all_namespaces: bool = False) -> list[str]:
        if all_namespaces:
            return ["--all-namespaces"]
        return [f"--namespace={self.namespace}"] if self.namespace else []

    def _get(self, *args: str) -> Obj:
        proc = subprocess.run([*self._base(), "get", *args, "-o", "json"], capture_output=True, text=True,
                              check=False)
        if proc.returncode != 0:
            raise ViewError(explain(proc.stderr, self.namespace))
        return dict(json.loads(proc.stdout))

    def job(self, name: str) -> Obj:
        return self._get(RESOURCE, name, *self._ns())

    def jobs(self, all_namespaces: bool) -> list[Obj]:
        return list(self._get(RESOURCE, *self._ns(all_namespaces)).get("items") or [])

    def events(self, job: Obj) -> list[Obj]:
        """The Events about ``job`` (this incarnation: matched by UID)."""
        meta = job.get("metadata") or {}
        selector = f"involvedObject.kind={KIND},involvedObject.name={meta.get('name')}"
        try:
            items = self._get("events", f"--namespace={meta.get('namespace')}", f"--field-selector={selector}")
        except ViewError:  # no right to list Events: the job's own status still tells most of it
            return []
        uid = meta.get("uid")
        return [e for e in items.get("items") or [] if (e.get("involvedObject") or {}).get("uid") in (None, uid)]

    def worker_cluster(self, job: Obj) -> str | None:
        """The MultiKueue worker cluster that runs ``job`` (its Workload's status.clusterName), or None."""
        meta = job.get("metadata") or {}
        try:
            items = self._get("workloads.kueue.x-k8s.io", f"--namespace={meta.get('namespace')}",
                              f"--selector={LABEL_JOB_NAME}={meta.get('name')}")
        except ViewError:  # no Kueue, or no right to read Workloads: describe says less
            return None
        for wl in items.get("items") or []:
            owners = (wl.get("metadata") or {}).get("ownerReferences") or []
            if any(o.get("uid") == meta.get("uid") for o in owners):
                return ((wl.get("status") or {}).get("clusterName")) or None
        return None

    def namespace_in_use(self) -> str:
        """The namespace kubectl would use: --namespace, else the context's, else default."""
        if self.namespace:
            return self.namespace
        proc = subprocess.run([*self._base(), "config", "view", "--minify", "-o",
                               "jsonpath={..namespace}"], capture_output=True, text=True, check=False)
        return proc.stdout.strip() or "default"


def explain(stderr: str, namespace: str | None) -> str:
    """kubectl's error as one line a user can act on."""
    text = " ".join(stderr.split())
    if "the server doesn't have a resource type" in text:
        return (f"ddpjob: the DDPJob CRD ({RESOURCE}) is not installed in this cluster: install the operator "
                "(helm install ... charts/ddpjob-operator, or kubectl apply -f manifests/install.yaml)")
    if "NotFound" in text and RESOURCE in text:
        where = f" in namespace {namespace}" if namespace else " in the current namespace"
        name = text.split('"')[1] if text.count('"') >= 2 else "?"
        return f"ddpjob: no DDPJob {name!r}{where} (kubectl get ddpjobs -A lists them all)"
    return f"ddpjob: kubectl failed: {text or 'no output'}"
