{{/* The chart's name, truncated for label values. */}}
{{- define "tokentap.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The objects' name: the release name, with the chart's name unless the release already has it. */}}
{{- define "tokentap.fullname" -}}
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

{{- define "tokentap.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tokentap.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tokentap.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "tokentap.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "tokentap.configName" -}}
{{- printf "%s-config" (include "tokentap.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
The sidecar's configuration file: tokentap.config, with energy.source set
from tokentap.energy.source when that is given.
*/}}
{{- define "tokentap.config" -}}
{{- $cfg := deepCopy .Values.tokentap.config -}}
{{- with .Values.tokentap.energy.source -}}
{{- $energy := deepCopy (default (dict) (get $cfg "energy")) -}}
{{- $_ := set $energy "source" . -}}
{{- $_ := set $cfg "energy" $energy -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/*
The sidecar's energy environment (docs/deploy.md, "Energy"). With
energy.visibleDevices, NVIDIA_VISIBLE_DEVICES makes the engine's GPUs
visible to the sidecar for NVML (the NVIDIA container toolkit honours it
in a container that requests no GPU only while its
accept-nvidia-visible-devices-envvar-when-unprivileged is true), with
the utility capability alone (NVML, no CUDA). With energy.source dcgm or
auto, the node's dcgm-exporter URL comes from the downward API
(status.hostIP) and the pod's name and namespace select its GPUs there.
*/}}
{{- define "tokentap.energyEnv" -}}
{{- $e := .Values.tokentap.energy -}}
{{- with $e.visibleDevices }}
- name: NVIDIA_VISIBLE_DEVICES
  value: {{ . | quote }}
- name: NVIDIA_DRIVER_CAPABILITIES
  value: utility
{{- end }}
{{- if has $e.source (list "dcgm" "auto") }}
- name: NODE_IP
  valueFrom:
    fieldRef:
      fieldPath: status.hostIP
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: TOKENTAP_DCGM_URL
  value: {{ printf "http://$(NODE_IP):%v%s" $e.dcgm.port $e.dcgm.path | quote }}
{{- end }}
{{- end -}}

{{/*
The sidecar: a native sidecar (Kubernetes 1.29+), that is an init
container with restartPolicy: Always. It starts before the engine, runs
beside it and stops after it. It forwards to the engine on
127.0.0.1:<engine.port>.
*/}}
{{- define "tokentap.sidecar" -}}
{{- $t := .Values.tokentap -}}
- name: tokentap
  image: {{ printf "%s:%s" $t.image.repository (toString (default .Chart.AppVersion $t.image.tag)) | quote }}
  imagePullPolicy: {{ $t.image.pullPolicy }}
  restartPolicy: Always
  args:
    - --upstream=http://127.0.0.1:{{ .Values.engine.port }}
    - --listen=0.0.0.0:{{ $t.ports.http }}
    - --admin-listen=0.0.0.0:{{ $t.ports.metrics }}
    - --config=/etc/tokentap/tokentap.yaml
    {{- if $t.capture.enabled }}
    - --capture=/var/lib/tokentap/capture.jsonl
    - --capture.ids={{ $t.capture.ids }}
    - --capture.secret-file=/run/tokentap/capture.key
    {{- with $t.capture.sessionHeader }}
    - --capture.session-header={{ . }}
    {{- end }}
    {{- end }}
    {{- range $t.extraArgs }}
    - {{ . | quote }}
    {{- end }}
  {{- $energyEnv := include "tokentap.energyEnv" . }}
  {{- $captureEnv := include "tokentap.captureEnv" . }}
  {{- if or $t.env $energyEnv $captureEnv }}
  env:
    {{- with $energyEnv }}
    {{- . | trim | nindent 4 }}
    {{- end }}
    {{- with $captureEnv }}
    {{- . | trim | nindent 4 }}
    {{- end }}
    {{- with $t.env }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- end }}
  ports:
    - name: http
      containerPort: {{ $t.ports.http }}
      protocol: TCP
    - name: metrics
      containerPort: {{ $t.ports.metrics }}
      protocol: TCP
  readinessProbe:
    {{- toYaml $t.readinessProbe | nindent 4 }}
  livenessProbe:
    {{- toYaml $t.livenessProbe | nindent 4 }}
  {{- with $t.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $t.securityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  volumeMounts:
    - name: tokentap-config
      mountPath: /etc/tokentap
      readOnly: true
    {{- if $t.capture.enabled }}
    - name: tokentap-capture-key
      mountPath: /run/tokentap
      readOnly: true
    - name: tokentap-capture
      mountPath: /var/lib/tokentap
    {{- end }}
{{- end -}}

{{/* The capture's Secret: tokentap.capture.existingSecret, or the chart's. */}}
{{- define "tokentap.captureSecret" -}}
{{- .Values.tokentap.capture.existingSecret | default (printf "%s-capture" (include "tokentap.fullname" .) | trunc 63 | trimSuffix "-") -}}
{{- end -}}

{{/*
POD_NAME names the replica on the capture's fleet lines (capture.replica's
default), unless the energy variables set it already.
*/}}
{{- define "tokentap.captureEnv" -}}
{{- if and .Values.tokentap.capture.enabled (not (has .Values.tokentap.energy.source (list "dcgm" "auto"))) }}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
{{- end }}
{{- end -}}

{{/*
The capture key's init step (a plain init container, before the sidecar):
a Secret volume's file belongs to root (group-readable at best, under
fsGroup), and the capture's key must be a 0600 file of the sidecar's own
user (internal/secret's rules), so the sidecar's image, as that user,
copies it into a memory-backed emptyDir that the sidecar mounts read-only
(`sidecar capture install-key`). Only this container mounts the Secret.
*/}}
{{- define "tokentap.captureKeyInit" -}}
{{- $t := .Values.tokentap -}}
- name: tokentap-capture-key
  image: {{ printf "%s:%s" $t.image.repository (toString (default .Chart.AppVersion $t.image.tag)) | quote }}
  imagePullPolicy: {{ $t.image.pullPolicy }}
  args:
    - capture
    - install-key
    - --from=/etc/tokentap-capture-secret/{{ $t.capture.secretKey }}
    - --to=/run/tokentap/capture.key
  resources:
    requests:
      cpu: 10m
      memory: 16Mi
    limits:
      memory: 32Mi
  {{- with $t.securityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  volumeMounts:
    - name: tokentap-capture-secret
      mountPath: /etc/tokentap-capture-secret
      readOnly: true
    - name: tokentap-capture-key
      mountPath: /run/tokentap
{{- end -}}
