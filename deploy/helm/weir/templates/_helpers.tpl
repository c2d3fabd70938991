{{/* Names and labels, as `helm create` makes them. */}}
{{- define "weir.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "weir.fullname" -}}
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

{{- define "weir.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "weir.selectorLabels" -}}
app.kubernetes.io/name: {{ include "weir.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "weir.labels" -}}
helm.sh/chart: {{ include "weir.chart" . }}
{{ include "weir.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "weir.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "weir.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Where the pod finds its files. */}}
{{- define "weir.configDir" -}}/etc/weir/config{{- end }}
{{- define "weir.configPath" -}}/etc/weir/config/pgbouncer.ini{{- end }}
{{- define "weir.authDir" -}}/etc/weir/auth{{- end }}

{{- define "weir.authSecretName" -}}
{{- if .Values.auth.existingSecret }}
{{- .Values.auth.existingSecret }}
{{- else }}
{{- printf "%s-auth" (include "weir.fullname" .) }}
{{- end }}
{{- end }}

{{/*
The drain's timing: the pod's grace period must cover the preStop delay and the drain,
or the kubelet kills Weir with SIGKILL while transactions are still finishing.
*/}}
{{- define "weir.drainBudget" -}}
{{- add (int .Values.preStopDelaySeconds) (int .Values.drainTimeoutSeconds) }}
{{- end }}

{{- define "weir.gracePeriod" -}}
{{- $budget := int (include "weir.drainBudget" .) }}
{{- if eq (toString .Values.terminationGracePeriodSeconds) "" }}
{{- add $budget 10 }}
{{- else }}
{{- $grace := int .Values.terminationGracePeriodSeconds }}
{{- if le $grace $budget }}
{{- fail (printf "terminationGracePeriodSeconds (%d) must be larger than preStopDelaySeconds + drainTimeoutSeconds (%d)" $grace $budget) }}
{{- end }}
{{- $grace }}
{{- end }}
{{- end }}

{{/* The userlist the chart makes: auth.userlist as it is, then one line per auth.users entry. */}}
{{- define "weir.userlist" -}}
{{- with .Values.auth.userlist }}
{{- trimSuffix "\n" . }}
{{ end }}
{{- range .Values.auth.users }}
{{- if not (and .name .password) }}
{{- fail "each auth.users entry needs a name and a password" }}
{{- end }}
{{- /* userlist.txt doubles a double quote inside a quoted field */ -}}
"{{ .name | replace "\"" "\"\"" }}" "{{ .password | replace "\"" "\"\"" }}"
{{ end }}
{{- end }}

{{/*
One ini value. YAML numbers reach templates as floats, which would print as 1e+06;
booleans become 1/0, the spelling pgbouncer.ini uses.
*/}}
{{- define "weir.iniValue" -}}
{{- if kindIs "float64" . }}
{{- if eq (float64 (int64 .)) . }}{{ int64 . }}{{ else }}{{ . }}{{ end }}
{{- else if kindIs "bool" . }}
{{- ternary "1" "0" . }}
{{- else }}
{{- . }}
{{- end }}
{{- end }}
