{{/*
The one image of every component (node plugin, manager, CSI controller, instance and
unpack pods): REPOSITORY@DIGEST when image.digest is set (a release pins it), else
REPOSITORY:TAG (image.tag, or the chart's appVersion).
*/}}
{{- define "rukpak.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}
