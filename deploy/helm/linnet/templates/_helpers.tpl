{{/* The release's name for every object ("linnet" by default, as in deploy/), or
fullnameOverride. */}}
{{- define "linnet.fullname" -}}
{{- .Values.fullnameOverride | default .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "linnet.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "linnet.labels" -}}
{{ include "linnet.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}

{{- define "linnet.gitSecret" -}}
{{- .Values.git.existingSecret | default (printf "%s-git" (include "linnet.fullname" .)) -}}
{{- end -}}

{{- define "linnet.webhookSecret" -}}
{{- .Values.webhook.existingSecret | default (printf "%s-webhook" (include "linnet.fullname" .)) -}}
{{- end -}}
