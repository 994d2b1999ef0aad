"""Pure parts of Kueue's setup in the local control plane (tests/cluster/kueue.py): its Configuration and how its
webhook configurations are rewritten to call loopback. The real manager runs in tests/integration."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import yaml

from tests.cluster import kueue
from tests.cluster.controlplane import REPO, ClusterState

PORTS = {"kueue-webhook": 9443, "kueue-probe": 8081, "kueue-metrics": 8443}

#: A trimmed copy of Kueue's config/components/webhook/manifests.yaml: a webhook every pod passes through and one
#: for its own integration.
WEBHOOKS = """\
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata: {name: mutating-webhook-configuration}
webhooks:
- name: mjob.kb.io
  clientConfig: {service: {name: webhook-service, namespace: system, path: /mutate-batch-v1-job}}
  failurePolicy: Fail
- name: mpod.kb.io
  clientConfig: {service: {name: webhook-service, namespace: system, path: /mutate--v1-pod}}
  failurePolicy: Fail
"""


def _state(tmp_path: Path) -> ClusterState:
    (tmp_path / "pki").mkdir()
    (tmp_path / "pki" / "ca.crt").write_text("CA PEM\n")
    return ClusterState(dir=str(tmp_path), ports=dict(PORTS))


def test_configuration_serves_on_loopback_under_the_cluster_directory(tmp_path: Path) -> None:
    config: dict[str, Any] = yaml.safe_load(kueue.configuration(_state(tmp_path)))
    assert config["apiVersion"] == "config.kueue.x-k8s.io/v1beta2" and config["kind"] == "Configuration"
    assert config["namespace"] == kueue.NAMESPACE
    assert config["leaderElection"] == {"leaderElect": False}
    assert config["internalCertManagement"] == {"enable": False}
    certs = str(tmp_path / "kueue" / "webhook-certs")
    assert config["webhook"] == {"host": "127.0.0.1", "port": 9443, "certDir": certs}
    assert config["health"]["healthProbeBindAddress"] == "127.0.0.1:8081"
    assert config["metrics"]["bindAddress"] == "127.0.0.1:8443"
    assert config["manageJobsWithoutQueueName"] is False
    assert config["integrations"]["frameworks"] == ["batch/job"]


def test_external_framework_names_the_operators_crd() -> None:
    """Kind.version.group of the DDPJob CRD: a rename there must not silently leave Kueue a stale name."""
    crd = yaml.safe_load((REPO / "operator" / "ddpjob_operator" / "crd" / "ddpjob-crd.yaml").read_text())
    spec = crd["spec"]
    served = [v["name"] for v in spec["versions"] if v.get("served")]
    names = tuple(f"{spec['names']['kind']}.{v}.{spec['group']}" for v in served)
    assert names == kueue.EXTERNAL_FRAMEWORKS


def test_webhooks_call_kueue_on_loopback_with_the_cluster_ca(tmp_path: Path) -> None:
    state = _state(tmp_path)
    binary = tmp_path / "bin" / "kueue"
    binary.parent.mkdir()
    kueue.webhooks_path(binary).write_text(WEBHOOKS)
    configs = kueue._webhooks(state, binary)
    assert configs["kind"] == "List"
    [mutating] = configs["items"]
    assert mutating["metadata"] == {"name": "kueue-mutating-webhook-configuration"}
    hooks = {h["name"]: h for h in mutating["webhooks"]}
    ca = base64.b64encode(b"CA PEM\n").decode()
    assert hooks["mjob.kb.io"]["clientConfig"] == {"url": "https://127.0.0.1:9443/mutate-batch-v1-job", "caBundle": ca}
    assert hooks["mjob.kb.io"]["failurePolicy"] == "Fail"
    assert "namespaceSelector" not in hooks["mjob.kb.io"]
    # The pod integration is off: a pod is never refused because Kueue is down, and system pods never reach it.
    assert hooks["mpod.kb.io"]["failurePolicy"] == "Ignore"
    assert hooks["mpod.kb.io"]["namespaceSelector"]["matchExpressions"][0]["values"] == ["kube-system", "kueue-system"]
    json.dumps(configs)  # what start writes
