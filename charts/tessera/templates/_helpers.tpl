{{/* Chart name, truncated to the 63 characters of a DNS label. */}}
{{- define "tessera.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Fully qualified app name: <release>-tessera unless the release name already contains it. */}}
{{- define "tessera.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* <fullname>-<component>, for component-scoped objects. */}}
{{- define "tessera.componentName" -}}
{{- printf "%s-%s" (include "tessera.fullname" .root | trunc 50 | trimSuffix "-") .component -}}
{{- end -}}

{{- define "tessera.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Standard labels (helm.sh/docs/chart_best_practices/labels). */}}
{{- define "tessera.labels" -}}
helm.sh/chart: {{ include "tessera.chart" . }}
{{ include "tessera.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: tessera
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "tessera.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tessera.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels of one component: call with (dict "root" $ "component" "operator"). */}}
{{- define "tessera.componentLabels" -}}
{{ include "tessera.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "tessera.componentSelectorLabels" -}}
{{ include "tessera.selectorLabels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "tessera.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* ServiceAccount name of a component: call with (dict "root" $ "component" "agent"). */}}
{{- define "tessera.serviceAccountName" -}}
{{- $sa := index .root.Values.serviceAccounts .component -}}
{{- if $sa.create -}}
{{- default (include "tessera.componentName" .) $sa.name -}}
{{- else -}}
{{- default "default" $sa.name -}}
{{- end -}}
{{- end -}}

{{/* ServiceMonitors need the prometheus-operator CRD unless the check is skipped (helm template, GitOps). */}}
{{- define "tessera.serviceMonitorEnabled" -}}
{{- if and .Values.serviceMonitor.enabled (or .Values.serviceMonitor.skipCapabilityCheck (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1/ServiceMonitor")) -}}
true
{{- end -}}
{{- end -}}

{{/* Checks the schema cannot express (Go's regexp has no negative lookahead). */}}
{{- define "tessera.validate" -}}
{{- if eq (toString .Values.image.tag) "latest" -}}
{{- fail "image.tag: 'latest' is not allowed; pin a version (empty means the chart's appVersion)" -}}
{{- end -}}
{{- if and .Values.gpuNodes.reserve (not .Values.agent.enabled) -}}
{{- fail "gpuNodes.reserve: the agents taint the GPU nodes, and agent.enabled is false; enable the agent or leave reserve off" -}}
{{- end -}}
{{- if and .Values.gpuNodes.reserve .Values.gpuNodes.admissionPolicy (semverCompare "<1.36.0-0" .Capabilities.KubeVersion.Version) -}}
{{- fail (printf "gpuNodes.admissionPolicy: the MutatingAdmissionPolicy that routes namespaces' pods needs Kubernetes 1.36+ (admissionregistration.k8s.io/v1), this cluster runs %s; set gpuNodes.admissionPolicy=false and route the pods yourself (docs/operations.md, \"Reserving GPU nodes\")" .Capabilities.KubeVersion.Version) -}}
{{- end -}}
{{- if and (eq .Values.agent.mps.serverSharing "gpu") (eq .Values.agent.mps.protocol "legacy") -}}
{{- fail "agent.mps.serverSharing: gpu needs MPS v3 namespaces (protocol v3 or auto): legacy clients reach their daemon's control socket, which lanes would then share" -}}
{{- end -}}
{{- if eq (toString .Values.scheduler.kubeScheduler.image.tag) "latest" -}}
{{- fail "scheduler.kubeScheduler.image.tag: 'latest' is not allowed; leave it empty for the cluster's version, or pin one, e.g. v1.37.2" -}}
{{- end -}}
{{- end -}}

{{/* The toleration of the taint agents put on reserved GPU nodes (contract.gpu_node_toleration), as a flow
mapping for one list item. */}}
{{- define "tessera.gpuNodeToleration" -}}
{key: tessera.io/gpu-node, operator: Equal, value: reserved, effect: NoSchedule}
{{- end -}}

{{/* kube-scheduler's image tag: the value, else the cluster's version without a vendor suffix
(v1.37.2-eks-4f4795d -> v1.37.2), so the scheduler is never newer than the API server. */}}
{{- define "tessera.kubeSchedulerTag" -}}
{{- .Values.scheduler.kubeScheduler.image.tag | default (regexReplaceAll "[-+].*$" .Capabilities.KubeVersion.Version "") -}}
{{- end -}}

{{/*
The lanes API the chart renders for: lanes.api, with auto resolved by what the chart can see of the cluster
(Kubernetes 1.36+, where consumable capacity, which DRA lanes need, is on by default, serving
resource.k8s.io/v1). Whether the feature gate is on only a request shows: with auto the agent and the operator
run with --lanes-api=auto (tessera.lanesApiFlag) and fall back to the device plugin at start when it is off.
*/}}
{{- define "tessera.lanesApi" -}}
{{- $api := .Values.lanes.api -}}
{{- if eq $api "auto" -}}
{{- if and (semverCompare ">=1.36.0-0" .Capabilities.KubeVersion.Version) (.Capabilities.APIVersions.Has "resource.k8s.io/v1/DeviceClass") -}}
dra
{{- else -}}
devicePlugin
{{- end -}}
{{- else -}}
{{ $api }}
{{- end -}}
{{- end }}


{{/* The --lanes-api the agent and the operator run with: auto where lanes.api auto rendered the DRA parts
(each then dry-runs what it writes and may still fall back to devicePlugin), else the rendered API. */}}
{{- define "tessera.lanesApiFlag" -}}
{{- $api := include "tessera.lanesApi" . -}}
{{- if and (eq .Values.lanes.api "auto") (eq $api "dra") -}}
auto
{{- else -}}
{{ $api }}
{{- end -}}
{{- end }}
