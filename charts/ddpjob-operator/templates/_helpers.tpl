{{/*
Names and labels shared by every template (the cert-manager chart's pattern).
*/}}

{{/* The chart name, overridable. */}}
{{- define "ddpjob-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The prefix of every resource name: the release name, plus the chart name unless the release name already
contains it. Truncated to 63 characters (the DNS label limit).
*/}}
{{- define "ddpjob-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Name of cluster-scoped objects (ClusterRole, ClusterRoleBinding). The namespace is part of it so the same
release name can be installed in two namespaces without the second install taking over the first's RBAC.
*/}}
{{- define "ddpjob-operator.clusterName" -}}
{{- printf "%s-%s" .Release.Namespace (include "ddpjob-operator.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The worker admission policy and its binding (workeradmission.yaml); the operator checks them by this name. */}}
{{- define "ddpjob-operator.workerAdmissionPolicyName" -}}
{{- printf "%s-worker-status" (include "ddpjob-operator.clusterName" .) }}
{{- end }}

{{/* chart label value: name-version. */}}
{{- define "ddpjob-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels that select the operator pod; never change them on upgrade (Deployment selectors are immutable). */}}
{{- define "ddpjob-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ddpjob-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* Standard app.kubernetes.io labels on every object. */}}
{{- define "ddpjob-operator.labels" -}}
{{ include "ddpjob-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: ddpjob
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ include "ddpjob-operator.chart" . }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The operator's ServiceAccount name. */}}
{{- define "ddpjob-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "ddpjob-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
An image reference: [imageRegistry/]repository, then @digest when a digest is set, else :tag (tag defaults to the
appVersion). imageRegistry is one value for both images, the REGISTRY that `make images push` pushed them to.
Called with (list $ .Values.image).
*/}}
{{- define "ddpjob-operator.imageRef" -}}
{{- $root := index . 0 }}{{- $img := index . 1 }}
{{- $repo := $img.repository }}
{{- with $root.Values.imageRegistry }}{{- $repo = printf "%s/%s" (trimSuffix "/" .) $repo }}{{- end }}
{{- if $img.digest }}
{{- printf "%s@%s" $repo $img.digest }}
{{- else }}
{{- printf "%s:%s" $repo (default $root.Chart.AppVersion $img.tag) }}
{{- end }}
{{- end }}

{{- define "ddpjob-operator.image" -}}
{{- include "ddpjob-operator.imageRef" (list . .Values.image) }}
{{- end }}

{{- define "ddpjob-operator.runtimeImage" -}}
{{- include "ddpjob-operator.imageRef" (list . .Values.runtimeImage) }}
{{- end }}

{{/*
The rules the operator needs in a namespace where it manages DDPJobs. One list, used by the ClusterRole
(cluster-wide mode) and by each Role (watchNamespaces mode), so the two modes cannot drift apart.
*/}}
{{- define "ddpjob-operator.namespacedRules" -}}
# Exactly the verbs the operator uses (operator/ddpjob_operator/kube/client.py PERMISSIONS; tests/unit/test_chart.py
# compares the two). DDPJobs: watched and re-listed (resync), deleted when ttlSecondsAfterFinished has passed.
- apiGroups: ["ddpjob.io"]
  resources: ["ddpjobs"]
  verbs: ["list", "watch", "delete"]
# Status is written once per reconcile pass. Holding `patch` here is also what lets the operator create the
# workers' Role granting `patch ddpjobs/status` (RBAC forbids granting what one does not hold).
- apiGroups: ["ddpjob.io"]
  resources: ["ddpjobs/status"]
  verbs: ["patch"]
# Never called, but checked: every child's ownerReference sets blockOwnerDeletion, which clusters with the
# OwnerReferencesPermissionEnforcement admission plugin (OpenShift's default) allow only to whoever may update the
# owner's finalizers. Without it they refuse every child.
- apiGroups: ["ddpjob.io"]
  resources: ["ddpjobs/finalizers"]
  verbs: ["update"]
# Worker and rendezvous pods: watched and re-listed, created, read back when a name is taken, deleted; patched
# only to annotate the workers of a stall restarted in place (ddpjob.io/restart-request).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "create", "delete", "patch"]
# The other children (headless Service, checkpoint PVC) and the workers' identity, one per namespace
# (ServiceAccount, Role and RoleBinding `ddpjob-worker`; the Role allows only patch of DDPJob status): watched so
# a deleted one comes back, ensured, read back when a create finds the name taken. Never deleted by the operator.
- apiGroups: [""]
  resources: ["services", "persistentvolumeclaims", "serviceaccounts"]
  verbs: ["get", "list", "watch", "create"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "list", "watch", "create"]
# Per-job NetworkPolicy: only the job's own pods reach its rendezvous port.
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "list", "watch", "create"]
# Per-job PodGroup of a gang job (scheduler-plugins' coscheduling; spec.scheduling.gang). Listing it is skipped
# while the PodGroup CRD is not installed.
- apiGroups: ["scheduling.x-k8s.io"]
  resources: ["podgroups"]
  verbs: ["get", "list", "watch", "create"]
# Per-job Workload of a job queued in Kueue (label kueue.x-k8s.io/queue-name), and its status: the operator gives
# an evicted Workload's quota back and marks it Finished, as Kueue's own job integrations do; patch: it becomes the
# owner of a Workload that MultiKueue made for the job (prebuilt). Listing it is skipped while Kueue's CRDs are not
# installed.
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads/status"]
  verbs: ["patch"]
# Events about DDPJobs (kopf posts core/v1 events, one POST each).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end }}
