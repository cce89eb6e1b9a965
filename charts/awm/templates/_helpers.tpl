{{/* Names, labels and small shared snippets. */}}

{{- define "awm.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* <release>-awm, or <release> when the release name already contains the chart name. */}}
{{- define "awm.fullname" -}}
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

{{/* Common labels; componentLabels adds name/instance/component (every object has one). */}}
{{- define "awm.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/part-of: awm
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels of one component: include "awm.selectorLabels" (list . "operator") */}}
{{- define "awm.selectorLabels" -}}
{{- $ctx := index . 0 -}}
app.kubernetes.io/name: awm-{{ index . 1 }}
app.kubernetes.io/instance: {{ $ctx.Release.Name }}
{{- end -}}

{{- define "awm.componentLabels" -}}
{{ include "awm.labels" (index . 0) }}
{{ include "awm.selectorLabels" . }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{/* An image reference: include "awm.image" (list . .Values.operator.image) */}}
{{- define "awm.image" -}}
{{- $ctx := index . 0 -}}
{{- $img := index . 1 -}}
{{- $repo := $img.repository -}}
{{- $first := first (splitList "/" $repo) -}}
{{- if and $ctx.Values.imageRegistry (not (or (contains "." $first) (contains ":" $first) (eq $first "localhost"))) -}}
{{- $repo = printf "%s/%s" (trimSuffix "/" $ctx.Values.imageRegistry) $repo -}}
{{- end -}}
{{- printf "%s:%s" $repo $img.tag -}}
{{- end -}}

{{- define "awm.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (printf "%s-operator" (include "awm.fullname" .)) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Namespaces the operator serves: operator.watchNamespaces, or the release namespace. */}}
{{- define "awm.namespaces" -}}
{{- $ns := .Values.operator.watchNamespaces | default (list .Release.Namespace) -}}
{{- toJson (uniq $ns) -}}
{{- end -}}

{{/* The Secret (keys `dsn`, `dsn-<shard>`) fleets name in spec.database.secretName. Fails on
     ambiguous values. */}}
{{- define "awm.databaseSecretName" -}}
{{- $db := .Values.externalDatabase -}}
{{- $n := 0 -}}
{{- if .Values.postgres.enabled }}{{ $n = add1 $n }}{{ end -}}
{{- if $db.secretName }}{{ $n = add1 $n }}{{ end -}}
{{- if or $db.dsn $db.shards }}{{ $n = add1 $n }}{{ end -}}
{{- if ne (int $n) 1 -}}
{{- fail "set exactly one of postgres.enabled=true, externalDatabase.secretName, externalDatabase.dsn (and/or externalDatabase.shards)" -}}
{{- end -}}
{{- if $db.secretName -}}
{{- $db.secretName -}}
{{- else -}}
{{- printf "%s-database" (include "awm.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* Container securityContext of every chart container (and of env pods, set by the operator). */}}
{{- define "awm.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
{{- end -}}
