{{/*
How Shoal's pods log in to NATS and check its certificate (`queue.auth`, `queue.tls`).

With the bundled NATS the chart makes both Secrets the NATS chart's values (values.yaml,
`nats:`) point at by name: `<nats>-client-auth` (user, password) and `<nats>-tls` (ca.crt,
tls.crt, tls.key); each keeps what it holds across upgrades (`lookup`). With an external
NATS, `queue.auth.existingSecret` and `queue.tls.existingSecret` name the operator's.
*/}}

{{- define "shoal.nats.authSecretName" -}}
{{- .Values.queue.auth.existingSecret | default (printf "%s-client-auth" (include "shoal.nats.fullname" .)) }}
{{- end }}

{{- define "shoal.nats.tlsSecretName" -}}
{{- printf "%s-tls" (include "shoal.nats.fullname" .) }}
{{- end }}

{{/* Whether Shoal logs in to NATS ("true" or ""); fails on settings that would leave it open. */}}
{{- define "shoal.nats.auth" -}}
{{- if .Values.nats.enabled }}
{{- if not .Values.queue.auth.enabled }}
{{- fail "queue.auth.enabled is false, but the bundled NATS always requires Shoal's credentials (anyone reaching an open NATS reads and forges every request and answer)" }}
{{- end }}
{{- if .Values.queue.auth.existingSecret }}
{{- fail "queue.auth.existingSecret is for an external NATS (nats.enabled=false); the bundled NATS takes the Secret the chart makes (set queue.auth.password to choose its password)" }}
{{- end }}
{{- true }}
{{- else if .Values.queue.auth.enabled }}
{{- if not (or .Values.queue.auth.existingSecret .Values.queue.auth.password) }}
{{- fail "nats.enabled is false: set queue.auth.existingSecret to a Secret with Shoal's credentials for that NATS (or queue.auth.password), or queue.auth.enabled=false if it needs none" }}
{{- end }}
{{- true }}
{{- end }}
{{- end }}

{{/* Whether Shoal connects over TLS ("true" or ""): the bundled NATS's own switch, else `queue.tls.enabled`. */}}
{{- define "shoal.nats.tls" -}}
{{- if .Values.nats.enabled }}
{{- if .Values.nats.config.nats.tls.enabled }}true{{ end }}
{{- else if .Values.queue.tls.enabled }}true{{ end }}
{{- end }}

{{/* The Secret Shoal reads the CA (and a client certificate) from; "" for the system's CAs. */}}
{{- define "shoal.nats.tlsSecret" -}}
{{- if include "shoal.nats.tls" . }}
{{- if .Values.queue.tls.existingSecret }}
{{- .Values.queue.tls.existingSecret }}
{{- else if .Values.nats.enabled }}
{{- include "shoal.nats.tlsSecretName" . }}
{{- end }}
{{- end }}
{{- end }}

{{/* A credentials file from queue.auth.existingSecret: its key ("" for none). */}}
{{- define "shoal.nats.authFileKey" -}}
{{- if and (include "shoal.nats.auth" .) .Values.queue.auth.existingSecret }}
{{- .Values.queue.auth.credsKey | default .Values.queue.auth.nkeySeedKey }}
{{- end }}
{{- end }}

{{/* SHOAL_NATS__* credentials and TLS, for every Shoal container. */}}
{{- define "shoal.nats.env" -}}
{{- $secret := include "shoal.nats.authSecretName" . }}
{{- if include "shoal.nats.auth" . }}
{{- with .Values.queue.auth }}
{{- if and .existingSecret .credsKey }}
- name: SHOAL_NATS__CREDS_FILE
  value: {{ printf "/etc/shoal/nats-auth/%s" .credsKey | quote }}
{{- else if and .existingSecret .nkeySeedKey }}
- name: SHOAL_NATS__NKEY_SEED_FILE
  value: {{ printf "/etc/shoal/nats-auth/%s" .nkeySeedKey | quote }}
{{- else if and .existingSecret .tokenKey }}
- name: SHOAL_NATS__TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ .tokenKey }}
{{- else }}
- name: SHOAL_NATS__USER
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ ternary .userKey "user" (not (empty .existingSecret)) }}
- name: SHOAL_NATS__PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ ternary .passwordKey "password" (not (empty .existingSecret)) }}
{{- end }}
{{- end }}
{{- end }}
{{- if include "shoal.nats.tls" . }}
- name: SHOAL_NATS__TLS
  value: "true"
{{- if include "shoal.nats.tlsSecret" . }}
- name: SHOAL_NATS__TLS_CA_FILE
  value: {{ printf "/etc/shoal/nats-tls/%s" (ternary .Values.queue.tls.caKey "ca.crt" (not (empty .Values.queue.tls.existingSecret))) | quote }}
{{- end }}
{{- if and .Values.queue.tls.existingSecret .Values.queue.tls.certKey }}
- name: SHOAL_NATS__TLS_CERT_FILE
  value: {{ printf "/etc/shoal/nats-tls/%s" .Values.queue.tls.certKey | quote }}
- name: SHOAL_NATS__TLS_KEY_FILE
  value: {{ printf "/etc/shoal/nats-tls/%s" (required "queue.tls.keyKey is required with queue.tls.certKey" .Values.queue.tls.keyKey) | quote }}
{{- end }}
{{- with .Values.queue.tls.serverName }}
- name: SHOAL_NATS__TLS_SERVER_NAME
  value: {{ . | quote }}
{{- end }}
- name: SHOAL_NATS__TLS_HANDSHAKE_FIRST
  value: {{ .Values.queue.tls.handshakeFirst | quote }}
{{- end }}
{{- end }}

{{/* The Secret volumes those files come from (only the keys Shoal reads: never the server's key). */}}
{{- define "shoal.nats.volumes" -}}
{{- with include "shoal.nats.authFileKey" . }}
- name: nats-auth
  secret:
    secretName: {{ include "shoal.nats.authSecretName" $ }}
    items:
      - key: {{ . }}
        path: {{ . }}
{{- end }}
{{- with include "shoal.nats.tlsSecret" . }}
- name: nats-tls
  secret:
    secretName: {{ . }}
    items:
      {{- if $.Values.queue.tls.existingSecret }}
      - key: {{ $.Values.queue.tls.caKey }}
        path: {{ $.Values.queue.tls.caKey }}
      {{- with $.Values.queue.tls.certKey }}
      - key: {{ . }}
        path: {{ . }}
      - key: {{ $.Values.queue.tls.keyKey }}
        path: {{ $.Values.queue.tls.keyKey }}
      {{- end }}
      {{- else }}
      - key: ca.crt
        path: ca.crt
      {{- end }}
{{- end }}
{{- end }}

{{- define "shoal.nats.volumeMounts" -}}
{{- if include "shoal.nats.authFileKey" . }}
- name: nats-auth
  mountPath: /etc/shoal/nats-auth
  readOnly: true
{{- end }}
{{- if include "shoal.nats.tlsSecret" . }}
- name: nats-tls
  mountPath: /etc/shoal/nats-tls
  readOnly: true
{{- end }}
{{- end }}

{{/* The bundled NATS pods' labels (the NATS chart's selector labels). */}}
{{- define "shoal.nats.selectorLabels" -}}
app.kubernetes.io/name: {{ .Values.nats.nameOverride | default "nats" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: nats
{{- end }}
