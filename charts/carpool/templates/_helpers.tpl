{{/*
The chart name, overridable, truncated to the 63 characters a Kubernetes name allows.
*/}}
{{- define "carpool.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The fully qualified app name: release name plus chart name unless the release name already
contains it. Truncated to 63 characters because some name fields are limited to that.
*/}}
{{- define "carpool.fullname" -}}
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
Chart name and version, as used by the helm.sh/chart label.
*/}}
{{- define "carpool.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The labels that name the release, on every object of the chart.
*/}}
{{- define "carpool.releaseLabels" -}}
app.kubernetes.io/name: {{ include "carpool.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Selector labels of the operator pod: the immutable subset that its Deployment selector and
its Service use. A Deployment's selector cannot change, so neither may these.
*/}}
{{- define "carpool.selectorLabels" -}}
{{ include "carpool.releaseLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{/*
Common labels: the release's plus the ones that may change between releases. Each template
adds its own app.kubernetes.io/component (operator, rbac, dashboard, crd).
*/}}
{{- define "carpool.labels" -}}
helm.sh/chart: {{ include "carpool.chart" . }}
{{ include "carpool.releaseLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: carpool
{{- end }}

{{/*
The ServiceAccount the operator runs as.
*/}}
{{- define "carpool.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "carpool.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
An image reference from a map with repository, tag and digest; the tag defaults to the
chart's appVersion (plus the map's tagSuffix, if any), and a digest, when set, pins the image
instead of the tag.
Usage: include "carpool.image" (dict "image" .Values.images.operator "root" .)
*/}}
{{- define "carpool.image" -}}
{{- $tag := default (printf "%s%s" .root.Chart.AppVersion (default "" .image.tagSuffix)) .image.tag }}
{{- if .image.digest }}
{{- printf "%s@%s" .image.repository .image.digest }}
{{- else }}
{{- printf "%s:%s" .image.repository $tag }}
{{- end }}
{{- end }}

{{/*
The namespace of the Grafana dashboard ConfigMap: where Grafana's sidecar looks, by default
the release namespace.
*/}}
{{- define "carpool.dashboardNamespace" -}}
{{- default .Release.Namespace .Values.dashboard.namespace }}
{{- end }}

{{/*
The name of the prometheus-adapter rules ConfigMap, which users pass to the adapter as
rules.existing: the full name, shortened so that the suffix fits in 63 characters.
*/}}
{{- define "carpool.adapterRulesName" -}}
{{- printf "%s-adapter-rules" (include "carpool.fullname" . | trunc 49 | trimSuffix "-") }}
{{- end }}

{{/*
The operator's application rules: in the ClusterRole when it serves every namespace, else in a
Role in each namespace of operator.watchNamespaces. Each rule says why it is there.
*/}}
{{- define "carpool.operatorRules" -}}
# Application: the BatchedModel resource itself. kopf watches it and patches metadata
# (progress annotations under carpool.dev/); the operator's cache lists and watches it too.
- apiGroups: ["carpool.dev"]
  resources: ["batchedmodels"]
  verbs: ["list", "watch", "patch"]
# Application: status.conditions and status.observedGeneration, on the status subresource.
- apiGroups: ["carpool.dev"]
  resources: ["batchedmodels/status"]
  verbs: ["patch"]
# Application: children carry an ownerReference with blockOwnerDeletion, which clusters
# running the OwnerReferencesPermissionEnforcement admission plugin allow only to whoever may
# update the owner's finalizers. No request uses it; admission checks it.
- apiGroups: ["carpool.dev"]
  resources: ["batchedmodels/finalizers"]
  verbs: ["update"]
# Application: carpool's events on its BatchedModels (ChildCreated, Degraded reasons, ...).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
# Application: the children every BatchedModel has, server-side applied (an apply that
# creates is authorized as create too) by the reconciler, and listed and watched (by label,
# filtered by the API server) into the operator's cache, which every read comes from, so that
# drift is repaired at once; one get before a child is created, since an object of another
# owner under its name carries no carpool label and so is not in the cache. Never deleted by
# the operator: garbage collection removes them with their BatchedModel.
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: [""]
  resources: ["services", "configmaps"]
  verbs: ["get", "list", "watch", "create", "patch"]
# Application: the models' pods, listed and watched (by label) so that ImagePullBackOff,
# CrashLoopBackOff, Unschedulable and ModelLoadFailed reach the BatchedModel's status.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch"]
# No rule for Secrets: a get would let the operator read every Secret's data. A Secret a model
# reads and that is missing is reported from its pods (the kubelet's CreateContainerConfigError).
# Application: the optional PDB and HPA, listed and watched (by label) into the cache (and
# one get before creating, as above), deleted when the spec stops asking for them. Optional: without these rules the operator runs
# every model that does not ask for the kind, and reports Degraded (Forbidden) on one that does.
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["autoscaling"]
  resources: ["horizontalpodautoscalers"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Application: a PodMonitor per BatchedModel so that Prometheus scrapes the sidecar and the
# model server, when the spec asks and the Prometheus Operator CRDs exist; listed and watched
# like the PDB and HPA, deleted when the spec stops asking for it. Optional as they are.
- apiGroups: ["monitoring.coreos.com"]
  resources: ["podmonitors"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
{{- end }}
