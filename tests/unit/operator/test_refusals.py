"""Issue 43 #14: a 403 on create is RBAC only when it names an identity and a verb. The API server's admission
plugins answer 403 too; each refusal is named by its real cause, with the fix that fits it. The messages are the
API server's own (kube-apiserver 1.34 and its plugins, an admission webhook, a ValidatingAdmissionPolicy)."""

from __future__ import annotations

import pytest
from ddpjob_operator.api import reasons
from ddpjob_operator.kube.refusals import classify, refusal

RBAC_FIX = "grant the operator's ServiceAccount"

CASES = [
    # The report of issue 43: the Priority admission plugin, not RBAC.
    ('pods "h-rdzv" is forbidden: no PriorityClass with name no-such-priority-class was found',
     reasons.PRIORITY_CLASS_NOT_FOUND, "create that PriorityClass"),
    ('pods "x" is forbidden: exceeded quota: compute, requested: cpu=2, used: cpu=1, limited: cpu=2',
     reasons.QUOTA_EXCEEDED, "raise the namespace's ResourceQuota"),
    ('pods "x" is forbidden: exceeded quota: q, requested: pods=1, used: pods=0, limited: pods=0',
     reasons.QUOTA_EXCEEDED, "raise the namespace's ResourceQuota"),
    ('pods "x" is forbidden: failed quota: compute: must specify limits.cpu for: worker; limits.memory for: worker',
     reasons.QUOTA_NEEDS_RESOURCES, "set the resources the namespace's ResourceQuota names"),
    ('pods "x" is forbidden: violates PodSecurity "restricted:latest": allowPrivilegeEscalation != false '
     '(container "worker" must set securityContext.allowPrivilegeEscalation=false)',
     reasons.POD_SECURITY, "Pod Security level"),
    ('pods "x" is forbidden: [maximum cpu usage per Container is 1, but limit is 2, maximum memory usage per '
     'Container is 1Gi, but limit is 2Gi]', reasons.LIMIT_RANGE_VIOLATED, "LimitRange"),
    ('pods "x" is forbidden: minimum memory usage per Container is 100Mi, but request is 64Mi',
     reasons.LIMIT_RANGE_VIOLATED, "LimitRange"),
    ('pods "x" is forbidden: cpu max limit to request ratio per Container is 2, but provided ratio is 4.000000',
     reasons.LIMIT_RANGE_VIOLATED, "LimitRange"),
    ('pods "x" is forbidden: maximum cpu usage per Pod is 2, but limit is 4', reasons.LIMIT_RANGE_VIOLATED,
     "LimitRange"),
    ('pods "x" is forbidden: error looking up service account team-a/ddpjob-worker: serviceaccount "ddpjob-worker" '
     'not found', reasons.SERVICE_ACCOUNT_MISSING, "ServiceAccount does not exist"),
    ('admission webhook "validation.gatekeeper.sh" denied the request: [k8srequiredlabels] you must provide '
     'labels: {"owner"}', reasons.ADMISSION_DENIED, "admission check"),
    # A webhook's words are the webhook's, whatever they name (its own quota is no ResourceQuota).
    ('admission webhook "quota.example" denied the request: pods "x" is forbidden: exceeded quota: team',
     reasons.ADMISSION_DENIED, "admission check"),
    ('pods "x" is forbidden: ValidatingAdmissionPolicy \'no-gpu\' with binding \'no-gpu-binding\' denied request: '
     'GPUs are not allowed here', reasons.ADMISSION_DENIED, "admission check"),
    ('pods "x" is forbidden: unable to validate against any security context constraint: [provider restricted-v2: '
     '.spec.securityContext.fsGroup: Invalid value: []int64{10001}]', reasons.ADMISSION_DENIED, "admission check"),
    ('networkpolicies.networking.k8s.io "j-rdzv" is forbidden: some plugin said no', reasons.ADMISSION_DENIED,
     "admission check"),
    # RBAC: the authorizer names the identity and the verb.
    ('pods is forbidden: User "system:serviceaccount:ddpjob-system:ddpjob-operator" cannot create resource "pods" '
     'in API group "" in the namespace "team-a"', reasons.FORBIDDEN, RBAC_FIX),
    ('networkpolicies.networking.k8s.io is forbidden: User "system:serviceaccount:s:op" cannot create resource '
     '"networkpolicies" in API group "networking.k8s.io" in the namespace "ns"', reasons.FORBIDDEN, RBAC_FIX),
]


@pytest.mark.parametrize(("message", "reason", "fix"), CASES, ids=[c[1] + "-" + str(i) for i, c in enumerate(CASES)])
def test_a_403_is_named_by_its_real_cause(message: str, reason: str, fix: str) -> None:
    problem = refusal("Pod", "x", message)
    assert (problem.reason, problem.conflict) == (reason, False)
    assert message in problem.message and fix in problem.message.removeprefix(message)


def test_only_a_403_naming_an_identity_and_a_verb_is_rbac() -> None:
    rbac = [m for m, r, _ in CASES if classify(m)[0] == reasons.FORBIDDEN]
    assert rbac and all('User "' in m and " cannot " in m for m in rbac)
    assert all(RBAC_FIX not in classify(m)[1] for m, r, _ in CASES if r != reasons.FORBIDDEN)
