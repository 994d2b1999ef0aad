"""Kueue in the local control plane: the real manager of sigs.k8s.io/kueue (hack/versions.env pins it,
hack/install-tools.sh builds it and copies its CRDs and webhook configurations next to the binary), run as a process
on loopback like the other components.

It gets what a Deployment from Kueue's own manifests gets: the namespace kueue-system, the CRDs (the five Kueue
converts between v1beta1 and v1beta2 with its conversion webhook), a serving certificate, here from the cluster CA,
and the webhook configurations, which call https://127.0.0.1:<port> instead of a Service (the apiserver runs on this
host, also when it binds a real node's bridge address). docs/scheduling.md describes the setup."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import yaml

from tests.cluster import controlplane as cp
from tests.cluster.pki import serving_cert

NAME = "kueue"
NAMESPACE = "kueue-system"
#: The integrations Kueue runs a controller for: plain Jobs, so a cluster can show admission without the operator.
FRAMEWORKS = ("batch/job",)
#: Kinds another controller queues through Kueue's Workload API: Kueue's owner walks (its Job reconciler, its pod
#: webhook) stop at such a controller owner with a queue name and leave its children to it, and its webhooks default
#: no queue name onto a child of one.
EXTERNAL_FRAMEWORKS = ("DDPJob.v1alpha1.ddpjob.io",)
#: The CRDs whose conversion Kueue serves at /convert (the webhook patches of its config/components/crd).
CONVERTED = frozenset({"localqueues", "clusterqueues", "cohorts", "workloads", "multikueueclusters"})
#: Webhooks every pod, Deployment or StatefulSet passes through, by integration: as Kueue's Helm chart does, they
#: skip kube-system and Kueue's namespace, and a failure is ignored while their integration is off.
EVERY_OBJECT_WEBHOOKS = {"pod": ("mpod.kb.io", "vpod.kb.io"), "deployment": ("mdeployment.kb.io", "vdeployment.kb.io"),
                         "statefulset": ("mstatefulset.kb.io", "vstatefulset.kb.io")}
#: A dry-run create of this passes Kueue's mutating and validating webhooks: the apiserver reaches them.
PROBE = "apiVersion: kueue.x-k8s.io/v1beta2\nkind: ResourceFlavor\nmetadata: {name: ddpjob-webhook-probe}\n"
# libyaml when there: the CRDs are 1.6 MB of YAML, 0.1 s to load with it and seconds without.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def crds_path(binary: Path) -> Path:
    """install-tools puts Kueue's CRDs of the same version, in one file, next to the binary."""
    return binary.parent / "kueue-crds.yaml"


def webhooks_path(binary: Path) -> Path:
    """... and its Mutating- and ValidatingWebhookConfiguration (config/components/webhook/manifests.yaml)."""
    return binary.parent / "kueue-webhooks.yaml"


def home(state: cp.ClusterState) -> Path:
    """Kueue's files in the cluster directory: configuration, certificates, the manifests applied."""
    return Path(state.dir) / "kueue"


#: MultiKueue's workerLostTimeout in these clusters (Kueue's default: 15m).
WORKER_LOST_TIMEOUT = "20s"


def configuration(state: cp.ClusterState) -> str:
    """Kueue's Configuration (config.kueue.x-k8s.io/v1beta2, apis/config/v1beta2 of its module)."""
    ports, d = state.ports, home(state)
    return textwrap.dedent(f"""\
        apiVersion: config.kueue.x-k8s.io/v1beta2
        kind: Configuration
        namespace: {NAMESPACE}
        leaderElection: {{leaderElect: false}}
        # Off: its cert rotator makes a certificate for the webhook Service's DNS name only, and the apiserver calls
        # 127.0.0.1. The webhook and metrics certificates come from the cluster CA (tests/cluster/kueue.py).
        internalCertManagement: {{enable: false}}
        webhook: {{host: 127.0.0.1, port: {ports['kueue-webhook']}, certDir: "{d / 'webhook-certs'}"}}
        health: {{healthProbeBindAddress: "127.0.0.1:{ports['kueue-probe']}"}}
        metrics: {{bindAddress: "127.0.0.1:{ports['kueue-metrics']}"}}
        # Kueue's own manifests' client settings (its default, 20/s, is slower than the tests' bursts).
        clientConnection: {{qps: 50, burst: 100}}
        manageJobsWithoutQueueName: false
        # The visibility API server reads its certificate from /visibility with internalCertManagement off; nothing
        # here asks it for pending workloads.
        featureGates: {{VisibilityOnDemand: false}}
        integrations:
          frameworks: {json.dumps(list(FRAMEWORKS))}
          externalFrameworks: {json.dumps(list(EXTERNAL_FRAMEWORKS))}
        # A cluster that is a MultiKueue manager dispatches DDPJobs through Kueue's generic adapter for custom jobs
        # (feature gate MultiKueueAdaptersForCustomJobs, on by default): tests/integration/test_multikueue.py.
        # How long a job stays dispatched to a worker cluster MultiKueue lost before it dispatches it again: Kueue's
        # default is 15 min; test_multikueue.py loses one.
        multiKueue:
          externalFrameworks: {json.dumps([{"name": f} for f in EXTERNAL_FRAMEWORKS])}
          workerLostTimeout: {WORKER_LOST_TIMEOUT}
        """)


#: Kueue's process starts as this script, so that its whole start overlaps with the other components' (the CRDs
#: alone take the apiserver a second or two on two cores): apply the namespace and CRDs (server-side: they are too
#: large for the last-applied annotation), wait until discovery serves every one (Kueue exits at once when an
#: informer of its finds no REST mapping), register the webhooks (without kubectl's client-side validation, whose
#: OpenAPI v2 document costs the apiserver most of a second to rebuild just after CRDs changed; the server validates
#: the fields either way), lay the directory's etc/ over /etc (see start), and become the manager: same PID, which
#: `down` stops. Its output goes to Kueue's log.
BOOT = r"""set -e
dir=$1 kubeconfig=$2 plurals=$3
shift 3
k() { kubectl --kubeconfig="$kubeconfig" "$@"; }
k apply --server-side -f "$dir/crds.json" >/dev/null
served() {
  found=$(k get --raw /apis/kueue.x-k8s.io/v1beta2 2>/dev/null) || return 1
  for r in $plurals; do case $found in *"\"name\":\"$r\""*) ;; *) return 1 ;; esac; done
}
until served; do sleep 0.1; done
k apply --server-side --validate=false -f "$dir/webhooks.json" >/dev/null
mount -t overlay overlay -o "lowerdir=$dir/etc:/etc" /etc
exec "$@"
"""


def start(state: cp.ClusterState, binary: Path) -> subprocess.Popen[bytes]:
    """Right after the apiserver is ready: Kueue's ports and files, and its process (BOOT), which needs nothing from
    `up` until wait_ready. Nothing `up` does before then passes through Kueue's webhooks.

    With internalCertManagement off, Kueue reads its metrics certificate from /etc/kueue/metrics/certs, a path no
    flag or configuration field changes (cmd/kueue/main.go; its Deployment mounts a Secret there). Its process gets
    that path in a mount namespace of its own, whose /etc is the host's with <dir>/kueue/etc laid over it (a
    read-only overlay): nothing is written to the host's /etc, and the namespace ends with the process. Root needs
    only the mount namespace; anyone else gets a user namespace too (unprivileged overlay mounts, Linux 5.11+)."""
    d = home(state)
    if ":" in str(d) or "," in str(d):
        raise cp.StartError(f"{d}: a cluster directory with ':' or ',' cannot be an overlay layer")
    d.mkdir(exist_ok=True)
    for name in ("kueue-webhook", "kueue-probe", "kueue-metrics"):
        state.ports[name] = cp.free_port()
    state.save()
    cert, key = serving_cert(Path(state.dir) / "pki", "kueue-webhook", ("IP:127.0.0.1", "DNS:localhost"))
    for cert_dir in (d / "webhook-certs", d / "etc" / "kueue" / "metrics" / "certs"):
        cert_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(cert, cert_dir / "tls.crt")
        shutil.copyfile(key, cert_dir / "tls.key")
    (d / "config.yaml").write_text(configuration(state))
    plurals = _write_crds(state, binary, d / "crds.json")
    (d / "webhooks.json").write_text(json.dumps(_webhooks(state, binary)))
    unshare = ["unshare", "--mount"] if os.geteuid() == 0 else ["unshare", "--user", "--map-root-user", "--mount"]
    return cp._start(state, NAME, [
        *unshare, "sh", "-c", BOOT, "kueue-boot", str(d), str(state.kubeconfig), " ".join(sorted(plurals)),
        str(binary), f"--config={d / 'config.yaml'}", f"--kubeconfig={state.kubeconfig}"])


def wait_ready(state: cp.ClusterState, proc: subprocess.Popen[bytes]) -> None:
    """Kueue is ready (readyz: its webhook server listens) and the apiserver reaches its webhooks (their handlers
    answer only once Kueue's caches have synced)."""
    readyz = f"http://127.0.0.1:{state.ports['kueue-probe']}/readyz"
    cp._wait(NAME, proc, lambda: cp._insecure_ok(readyz), state, 90)
    probe = ("create", "--dry-run=server", "--validate=false", "-f", "-")  # no OpenAPI fetch, as in BOOT
    cp._wait(NAME, proc, lambda: bool(cp._kubectl(state, *probe, stdin=PROBE)), state, 30)


def _write_crds(state: cp.ClusterState, binary: Path, path: Path) -> set[str]:
    """Kueue's namespace and CRDs as one List, the converted ones calling Kueue's /convert; returns their plurals."""
    crds = [doc for doc in yaml.load_all(crds_path(binary).read_text(), Loader=_LOADER) if doc]
    ca = _ca_bundle(state)
    for crd in crds:
        if crd["spec"]["names"]["plural"] in CONVERTED:
            crd["spec"]["conversion"] = {"strategy": "Webhook", "webhook": {
                "conversionReviewVersions": ["v1"], "clientConfig": _client_config(state, "/convert", ca)}}
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": [namespace, *crds]}))
    return {crd["spec"]["names"]["plural"] for crd in crds}


def _ca_bundle(state: cp.ClusterState) -> str:
    return base64.b64encode((Path(state.dir) / "pki" / "ca.crt").read_bytes()).decode()


def _client_config(state: cp.ClusterState, path: str, ca_bundle: str) -> dict[str, str]:
    return {"url": f"https://127.0.0.1:{state.ports['kueue-webhook']}{path}", "caBundle": ca_bundle}


def _webhooks(state: cp.ClusterState, binary: Path) -> dict[str, Any]:
    """Kueue's webhook configurations (under the names its Helm chart gives them), each webhook calling Kueue's
    port on loopback instead of its Service."""
    ca = _ca_bundle(state)
    configs = [doc for doc in yaml.safe_load_all(webhooks_path(binary).read_text()) if doc]
    for doc in configs:
        doc["metadata"] = {"name": f"kueue-{doc['metadata']['name']}"}
        for hook in doc["webhooks"]:
            hook["clientConfig"] = _client_config(state, hook["clientConfig"]["service"]["path"], ca)
            framework = next((f for f, names in EVERY_OBJECT_WEBHOOKS.items() if hook["name"] in names), None)
            if framework is not None:
                hook["namespaceSelector"] = {"matchExpressions": [{
                    "key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", NAMESPACE]}]}
                if framework not in FRAMEWORKS:
                    hook["failurePolicy"] = "Ignore"
    return {"apiVersion": "v1", "kind": "List", "items": configs}

