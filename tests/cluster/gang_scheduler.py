"""The second scheduler of the local control plane: scheduler-plugins' scheduler with the coscheduling plugin
(gang scheduling), under the name scheduler-plugins' own Helm chart gives it, and the PodGroup CRD it serves.

Pods that name it (spec.schedulerName) get gang semantics; every other pod stays with kube-scheduler. Built by
hack/install-tools.sh like the other tools (hack/versions.env pins it); docs/scheduling.md explains the plugin."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

from ddpjob_operator.api.spec import DEFAULT_GANG_SCHEDULER

if TYPE_CHECKING:
    from tests.cluster.controlplane import ClusterState

NAME = "scheduler-plugins"
#: The profile name a DDPJob's gang asks for by default (spec.scheduling.gang.schedulerName).
SCHEDULER_NAME = DEFAULT_GANG_SCHEDULER
#: How long placed members of a gang wait at Permit for the rest when their PodGroup sets no timeout; the
#: plugin's default. DDPJob's PodGroups always set scheduleTimeoutSeconds.
PERMIT_WAITING_SECONDS = 10


def crd_path(binary: Path) -> Path:
    """install-tools copies the PodGroup CRD of the same version next to the binary."""
    return binary.parent / "podgroup-crd.yaml"


def config(kubeconfig: Path) -> str:
    """KubeSchedulerConfiguration: one profile, coscheduling in every extension point it implements, its queue
    sort instead of the default (a gang's pods leave the queue together)."""
    return textwrap.dedent(f"""\
        apiVersion: kubescheduler.config.k8s.io/v1
        kind: KubeSchedulerConfiguration
        leaderElection: {{leaderElect: false}}
        clientConnection: {{kubeconfig: "{kubeconfig}", qps: 200, burst: 400}}
        profiles:
        - schedulerName: {SCHEDULER_NAME}
          plugins:
            multiPoint:
              enabled: [{{name: Coscheduling}}]
            queueSort:
              enabled: [{{name: Coscheduling}}]
              disabled: [{{name: "*"}}]
          pluginConfig:
          - name: Coscheduling
            args: {{permitWaitingTimeSeconds: {PERMIT_WAITING_SECONDS}}}
        """)


def argv(binary: Path, state: ClusterState, port: int) -> list[str]:
    """The scheduler's command line; writes its configuration into the cluster directory."""
    path = Path(state.dir) / "scheduler-plugins.yaml"
    path.write_text(config(state.kubeconfig))
    kubeconfig = str(state.kubeconfig)
    return [str(binary), f"--config={path}", f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}", "--bind-address=127.0.0.1", f"--secure-port={port}",
            "--v=1"]
