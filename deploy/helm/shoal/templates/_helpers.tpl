{{/*
Names and labels.
*/}}
{{- define "shoal.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "shoal.fullname" -}}
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

{{- define "shoal.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "shoal.selectorLabels" -}}
app.kubernetes.io/name: {{ include "shoal.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "shoal.labels" -}}
helm.sh/chart: {{ include "shoal.chart" . }}
{{ include "shoal.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: shoal
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The gateway's name, labels and selector. */}}
{{- define "shoal.gateway.fullname" -}}
{{- printf "%s-gateway" (include "shoal.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "shoal.gateway.selectorLabels" -}}
{{ include "shoal.selectorLabels" . }}
app.kubernetes.io/component: gateway
{{- end }}

{{/* A worker pool's name: call with (dict "root" $ "pool" $pool). */}}
{{- define "shoal.pool.fullname" -}}
{{- printf "%s-%s" (include "shoal.fullname" .root) .pool.name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "shoal.pool.selectorLabels" -}}
{{ include "shoal.selectorLabels" .root }}
app.kubernetes.io/component: worker
shoal.dev/pool: {{ .pool.name }}
{{- end }}

{{/*
The pools to deploy: `pools` entries with `enabled` not false, each merged over
`poolDefaults`, as a YAML list under the key `pools` (read it with fromYaml).
An empty `runtime` is the kind's image: `encoder` for encode pools, `sglang` (the generation
image) for generate pools. Fails on a pool without a name or models, a duplicate name, an
unknown kind/runtime, or a generate pool on the encoder image (which cannot generate).
*/}}
{{- define "shoal.pools" -}}
{{- $out := list }}
{{- $seen := dict }}
{{- range $i, $p := .Values.pools }}
{{- $pool := mergeOverwrite (deepCopy $.Values.poolDefaults) (deepCopy $p) }}
{{- if ne (toString $pool.enabled) "false" }}
{{- if not $pool.name }}{{ fail (printf "pools[%d]: `name` is required" $i) }}{{ end }}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$" $pool.name) }}{{ fail (printf "pools[%d]: name %q must be a DNS label (lower case letters, digits, '-')" $i $pool.name) }}{{ end }}
{{- if hasKey $seen $pool.name }}{{ fail (printf "pools: the name %q is used twice" $pool.name) }}{{ end }}
{{- $_ := set $seen $pool.name true }}
{{- if not $pool.models }}{{ fail (printf "pool %q: `models` must list at least one model id" $pool.name) }}{{ end }}
{{- if not (has $pool.kind (list "encode" "generate")) }}{{ fail (printf "pool %q: kind must be encode or generate, not %v" $pool.name $pool.kind) }}{{ end }}
{{- if not $pool.runtime }}{{ $_ := set $pool "runtime" ((eq $pool.kind "generate") | ternary "sglang" "encoder") }}{{ end }}
{{- if not (has $pool.runtime (list "encoder" "sglang")) }}{{ fail (printf "pool %q: runtime must be encoder or sglang, not %v" $pool.name $pool.runtime) }}{{ end }}
{{- if and (eq $pool.runtime "sglang") (ne $pool.kind "generate") }}{{ fail (printf "pool %q: the sglang runtime serves kind generate only" $pool.name) }}{{ end }}
{{- if and (eq $pool.runtime "encoder") (eq $pool.kind "generate") (not $pool.image.repository) }}{{ fail (printf "pool %q: the encoder image has no `generate` extra and no generation model package; leave `runtime` empty (a generate pool then runs the generation image, shoal-generator-sglang) or give the pool an `image.repository` that has them" $pool.name) }}{{ end }}
{{- $out = append $out $pool }}
{{- end }}
{{- end }}
{{- toYaml (dict "pools" $out) }}
{{- end }}

{{/*
A model id as one NATS subject token, as shoal.queue.subjects.model_token writes it:
[A-Za-z0-9-] are kept, every other byte becomes `_%02x`. This escapes the characters
that hub ids use (`_` first, since the escapes themselves contain it).
*/}}
{{- define "shoal.modelToken" -}}
{{- $t := . | replace "_" "_5f" | replace "/" "_2f" | replace "." "_2e" | replace ":" "_3a" | replace "@" "_40" }}
{{- if not (regexMatch "^[A-Za-z0-9_-]+$" $t) }}
{{- fail (printf "model id %q has characters the chart cannot escape (allowed: letters, digits, '-', '_', '/', '.', ':', '@')" .) }}
{{- end }}
{{- $t }}
{{- end }}

{{/* The durable JetStream consumer of (lane, model): call with (dict "lane" "batch" "model" $id). */}}
{{- define "shoal.consumer" -}}
{{- printf "%s-%s" .lane (include "shoal.modelToken" .model) }}
{{- end }}

{{/* The NATS chart's full name (the Service clients connect to). */}}
{{- define "shoal.nats.fullname" -}}
{{- if .Values.nats.fullnameOverride }}
{{- .Values.nats.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default "nats" .Values.nats.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* SHOAL_NATS__URL: `queue.url`, else the bundled NATS chart's Service. */}}
{{- define "shoal.nats.url" -}}
{{- if .Values.queue.url }}
{{- .Values.queue.url }}
{{- else if .Values.nats.enabled }}
{{- printf "nats://%s.%s.svc.%s:%v" (include "shoal.nats.fullname" .) .Release.Namespace .Values.clusterDomain (.Values.nats.config.nats.port | default 4222) }}
{{- else }}
{{- fail "nats.enabled is false: set queue.url to the NATS server(s) Shoal should use" }}
{{- end }}
{{- end }}

{{/* SHOAL_NATS__REPLICAS: `queue.replicas`, else the bundled cluster's size (1 without a cluster). */}}
{{- define "shoal.nats.replicas" -}}
{{- if .Values.queue.replicas }}
{{- .Values.queue.replicas }}
{{- else if and .Values.nats.enabled .Values.nats.config.cluster.enabled }}
{{- .Values.nats.config.cluster.replicas | default 3 }}
{{- else }}
{{- 1 }}
{{- end }}
{{- end }}

{{/* KEDA's natsServerMonitoringEndpoint: host:port of the NATS monitoring API. */}}
{{- define "shoal.nats.monitoringEndpoint" -}}
{{- if .Values.queue.monitoringEndpoint }}
{{- .Values.queue.monitoringEndpoint }}
{{- else if .Values.nats.enabled }}
{{- /* The headless Service: KEDA asks each node `<pod>.<endpoint>` which one leads a consumer. */}}
{{- printf "%s-headless.%s.svc.%s:%v" (include "shoal.nats.fullname" .) .Release.Namespace .Values.clusterDomain (.Values.nats.config.monitor.port | default 8222) }}
{{- else }}
{{- fail "a pool scales with KEDA but nats.enabled is false: set queue.monitoringEndpoint (host:port of NATS's monitoring API)" }}
{{- end }}
{{- end }}

{{/* An image reference: call with (dict "root" $ "image" $img "suffix" "-cpu"). */}}
{{- define "shoal.image" -}}
{{- $registry := .image.registry | default .root.Values.image.registry }}
{{- $tag := printf "%s%s" (.image.tag | default .root.Chart.AppVersion) (.suffix | default "") }}
{{- if .image.digest }}
{{- printf "%s/%s@%s" $registry .image.repository .image.digest | trimPrefix "/" }}
{{- else }}
{{- printf "%s/%s:%s" $registry .image.repository $tag | trimPrefix "/" }}
{{- end }}
{{- end }}

{{/* Whether any enabled pool may scale to zero ("true" or ""). */}}
{{- define "shoal.anyScaleToZero" -}}
{{- range (include "shoal.pools" . | fromYaml).pools }}
{{- if and .keda.enabled (eq (int .keda.minReplicaCount) 0) }}true{{ end }}
{{- end }}
{{- end }}

{{/* Whether every enabled pool may scale to zero ("true" or ""). */}}
{{- define "shoal.allScaleToZero" -}}
{{- $pools := (include "shoal.pools" . | fromYaml).pools }}
{{- $all := gt (len $pools) 0 }}
{{- range $pools }}
{{- if not (and .keda.enabled (eq (int .keda.minReplicaCount) 0)) }}{{ $all = false }}{{ end }}
{{- end }}
{{- if $all }}true{{ end }}
{{- end }}

{{/* Names of the secrets in use. */}}
{{- define "shoal.auth.secretName" -}}
{{- .Values.auth.existingSecret | default (printf "%s-auth" (include "shoal.fullname" .)) }}
{{- end }}

{{- define "shoal.s3.secretName" -}}
{{- .Values.s3.existingSecret | default (printf "%s-s3" (include "shoal.fullname" .)) }}
{{- end }}

{{/* Whether S3 credentials are passed from a secret ("true" or ""). */}}
{{- define "shoal.s3.credentials" -}}
{{- if or .Values.s3.existingSecret .Values.s3.accessKeyId }}true{{ end }}
{{- end }}

{{/* Whether the gateway reads API keys from a secret ("true" or ""). */}}
{{- define "shoal.auth.keysFromSecret" -}}
{{- if or .Values.auth.existingSecret .Values.auth.keys }}true{{ end }}
{{- end }}

{{- define "shoal.modelSpec.configMapName" -}}
{{- .Values.modelSpec.existingConfigMap | default (printf "%s-models" (include "shoal.fullname" .)) }}
{{- end }}

{{/*
Environment every Shoal container gets: NATS (with its credentials and TLS), the model
spec, the object store, S3.
*/}}
{{- define "shoal.commonEnv" -}}
- name: SHOAL_NATS__URL
  value: {{ include "shoal.nats.url" . | quote }}
- name: SHOAL_NATS__REPLICAS
  value: {{ include "shoal.nats.replicas" . | quote }}
- name: SHOAL_NATS__STREAM
  value: {{ .Values.queue.stream | quote }}
- name: SHOAL_NATS__SUBJECT_PREFIX
  value: {{ .Values.queue.subjectPrefix | quote }}
- name: SHOAL_NATS__STORAGE
  value: {{ .Values.queue.storage | quote }}
- name: SHOAL_DATA_DIR
  value: {{ .Values.dataDir.path | quote }}
- name: SHOAL_LOG_LEVEL
  value: {{ .Values.logLevel | quote }}
{{- if .Values.modelSpec.enabled }}
- name: SHOAL_MODELS_FILE
  value: {{ printf "%s/%s" .Values.modelSpec.mountPath .Values.modelSpec.fileName | quote }}
{{- end }}
- name: SHOAL_OBJECTS__BACKEND
  value: {{ .Values.objects.backend | quote }}
{{- if eq .Values.objects.backend "s3" }}
- name: SHOAL_OBJECTS__BUCKET
  value: {{ .Values.objects.bucket | quote }}
- name: SHOAL_OBJECTS__PREFIX
  value: {{ .Values.objects.prefix | quote }}
{{- end }}
{{- with .Values.s3.endpointUrl }}
- name: SHOAL_S3__ENDPOINT_URL
  value: {{ . | quote }}
{{- end }}
{{- with .Values.s3.region }}
- name: SHOAL_S3__REGION
  value: {{ . | quote }}
{{- end }}
{{- include "shoal.nats.env" . }}
{{- if include "shoal.s3.credentials" . }}
- name: SHOAL_S3__ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ include "shoal.s3.secretName" . }}
      key: {{ .Values.s3.accessKeyIdKey }}
- name: SHOAL_S3__SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ include "shoal.s3.secretName" . }}
      key: {{ .Values.s3.secretAccessKeyKey }}
{{- end }}
{{- range .Values.extraEnv }}
- {{ toYaml . | nindent 2 | trim }}
{{- end }}
{{- end }}

{{/* Volumes and mounts every Shoal pod gets: the model spec, the data dir, NATS's CA and credential files. */}}
{{- define "shoal.commonVolumes" -}}
{{- if .Values.modelSpec.enabled }}
- name: model-spec
  configMap:
    name: {{ include "shoal.modelSpec.configMapName" . }}
{{- end }}
- name: data
  emptyDir:
    {{- with .Values.dataDir.sizeLimit }}
    sizeLimit: {{ . }}
    {{- else }}
    {}
    {{- end }}
- name: tmp
  emptyDir: {}
{{- include "shoal.nats.volumes" . }}
{{- end }}

{{- define "shoal.commonVolumeMounts" -}}
{{- if .Values.modelSpec.enabled }}
- name: model-spec
  mountPath: {{ .Values.modelSpec.mountPath }}
  readOnly: true
{{- end }}
- name: data
  mountPath: {{ .Values.dataDir.path }}
- name: tmp
  mountPath: /tmp
{{- include "shoal.nats.volumeMounts" . }}
{{- end }}

{{/* The pod-level spec parts every Shoal pod shares. */}}
{{- define "shoal.podCommon" -}}
{{- with .Values.image.pullSecrets }}
imagePullSecrets:
  {{- range . }}
  - name: {{ . }}
  {{- end }}
{{- end }}
{{- if .Values.serviceAccount.create }}
serviceAccountName: {{ .Values.serviceAccount.name | default (include "shoal.fullname" .) }}
{{- else if .Values.serviceAccount.name }}
serviceAccountName: {{ .Values.serviceAccount.name }}
{{- end }}
automountServiceAccountToken: {{ .Values.serviceAccount.automountToken }}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- end }}
