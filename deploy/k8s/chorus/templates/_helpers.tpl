{{/* Names, labels and the small pieces every template shares. */}}

{{- define "chorus.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "chorus.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "chorus.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "chorus.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* The model services, in a fixed order, with the gRPC service name their health reports. */}}
{{- define "chorus.backends" -}}
talker: chorus.v1.Talker
vocoder: chorus.v1.Vocoder
diffusion: chorus.v1.Diffusion
{{- end }}

{{/* Settings the chart derives itself: a `settings` key may not override them. */}}
{{- define "chorus.reservedSettings" -}}
[host, port, metrics_port, grace_s, device, rest_host, rest_port, redis_url, talker_targets, vocoder_targets, diffusion_targets]
{{- end }}

{{/* Selector labels of one component. Call with (dict "root" $ "component" "talker"). */}}
{{- define "chorus.selectorLabels" -}}
app.kubernetes.io/name: {{ include "chorus.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "chorus.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "chorus.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: chorus
{{- end }}

{{/* Image of a component: the CUDA image for model services on GPUs, the CPU image otherwise. */}}
{{- define "chorus.image" -}}
{{- $image := ternary .root.Values.image.gpu .root.Values.image.cpu .onGpu -}}
{{ printf "%s:%s" $image.repository $image.tag }}
{{- end }}

{{/* CHORUS_<SERVICE>_<FIELD> env entries (YAML list, or nothing) from a component's `settings` map. */}}
{{- define "chorus.settingsEnv" -}}
{{- $reserved := include "chorus.reservedSettings" . | fromYamlArray }}
{{- $vars := list }}
{{- range $key, $value := .settings }}
{{- if has $key $reserved }}
{{- fail (printf "%s.settings.%s is set by the chart; use the chart's own value for it" $.service $key) }}
{{- end }}
{{- $name := printf "CHORUS_%s_%s" ($.service | upper) ($key | upper) }}
{{- $vars = append $vars (dict "name" $name "value" (toString $value)) }}
{{- end }}
{{- with $vars }}{{ toYaml . }}{{ end }}
{{- end }}

{{/* terminationGracePeriodSeconds: endpoint removal (preStop) + drain (grace_s) + time to close and exit. */}}
{{- define "chorus.terminationGracePeriodSeconds" -}}
{{ add .Values.drain.preStopSleepSeconds .Values.drain.graceSeconds .Values.drain.exitMarginSeconds }}
{{- end }}

{{/* Readiness and liveness timing shared by every Chorus container (the probed endpoint is the caller's).
Refused: a readiness probe too slow to take a draining pod out of rotation before its drain ends, and a liveness
probe that would restart a process before readiness has even taken it out of rotation. */}}
{{- define "chorus.probeTiming" -}}
{{- $probe := index .root.Values.probes .kind }}
{{- $readiness := .root.Values.probes.readiness }}
{{- $readinessWindow := mul $readiness.periodSeconds $readiness.failureThreshold }}
{{- if ge (int $readinessWindow) (int .root.Values.drain.graceSeconds) }}
{{- fail (printf "probes.readiness: periodSeconds × failureThreshold (%d s) must be shorter than drain.graceSeconds (%d s), or a draining pod stays in rotation" (int $readinessWindow) (int .root.Values.drain.graceSeconds)) }}
{{- end }}
{{- $liveness := .root.Values.probes.liveness }}
{{- if le (int (mul $liveness.periodSeconds $liveness.failureThreshold)) (int $readinessWindow) }}
{{- fail "probes.liveness: periodSeconds × failureThreshold must be longer than readiness's: a slow process is taken out of rotation before it is restarted" }}
{{- end -}}
periodSeconds: {{ $probe.periodSeconds }}
failureThreshold: {{ $probe.failureThreshold }}
timeoutSeconds: {{ $probe.timeoutSeconds }}
{{- end }}

{{- define "chorus.preStop" -}}
lifecycle:
  # Readiness and Service endpoints lag the SIGTERM; keep serving until callers stop picking this pod.
  preStop:
    exec:
      command: ["sleep", "{{ .Values.drain.preStopSleepSeconds }}"]
{{- end }}

{{/* The gateway's Redis URL as an env var: bundled StatefulSet, Sentinels, external URL, or a Secret. A Sentinel
URL's password comes from a Secret through REDIS_PASSWORD, defined first so that Kubernetes expands $(REDIS_PASSWORD). */}}
{{- define "chorus.redisUrlEnv" -}}
{{- $sentinel := .Values.externalRedis.sentinel }}
{{- if and .Values.redis.enabled $sentinel.enabled }}
{{- fail "externalRedis.sentinel.enabled needs redis.enabled=false (the bundled Redis has no Sentinels)" }}
{{- end }}
{{- if and $sentinel.enabled $sentinel.passwordSecret }}
- name: REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $sentinel.passwordSecret }}
      key: {{ $sentinel.passwordKey }}
{{- end }}
- name: CHORUS_GATEWAY_REDIS_URL
{{- if .Values.redis.enabled }}
  value: {{ printf "redis://%s-redis:6379/0" (include "chorus.fullname" .) | quote }}
{{- else if $sentinel.enabled }}
{{- if not $sentinel.hosts }}
{{- fail "externalRedis.sentinel.hosts: list at least one Sentinel (host:port)" }}
{{- end }}
{{- $auth := ternary "$(REDIS_PASSWORD)@" "" (not (empty $sentinel.passwordSecret)) }}
{{- $query := ternary "?sentinel_password=$(REDIS_PASSWORD)" "" (and (not (empty $sentinel.passwordSecret)) $sentinel.passwordForSentinels) }}
  value: {{ printf "redis+sentinel://%s%s/%s/%v%s" $auth (join "," $sentinel.hosts) $sentinel.masterName $sentinel.db $query | quote }}
{{- else if .Values.externalRedis.existingSecret }}
  valueFrom:
    secretKeyRef:
      name: {{ .Values.externalRedis.existingSecret }}
      key: {{ .Values.externalRedis.secretKey }}
{{- else if .Values.externalRedis.url }}
  value: {{ .Values.externalRedis.url | quote }}
{{- else }}
{{- fail "redis.enabled is false: set externalRedis.url or externalRedis.existingSecret" }}
{{- end }}
{{- end }}

{{/* Name of the Secret holding the API keys; empty when none is configured. */}}
{{- define "chorus.apiKeysSecret" -}}
{{- if .Values.gateway.apiKeys.existingSecret }}
{{- .Values.gateway.apiKeys.existingSecret }}
{{- else if .Values.gateway.apiKeys.keys }}
{{- printf "%s-api-keys" (include "chorus.fullname" .) }}
{{- end }}
{{- end }}

{{/* HPA metrics of a component. Call with (dict "autoscaling" $c.autoscaling). */}}
{{- define "chorus.hpaMetrics" -}}
- type: Resource
  resource:
    name: cpu
    target:
      type: Utilization
      averageUtilization: {{ .autoscaling.targetCPUUtilizationPercentage }}
{{- if .autoscaling.customMetric.enabled }}
- type: Pods
  pods:
    metric:
      name: {{ .autoscaling.customMetric.name }}
    target:
      type: AverageValue
      averageValue: {{ .autoscaling.customMetric.targetAverageValue | quote }}
{{- end }}
{{- end }}
