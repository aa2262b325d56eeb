{{- define "cache.labels" -}}
app: {{ .Release.Name }}
{{- end }}
