{{/* Image of a latch binary: latch.image (dict "root" $ "binary" "csi-attacher") */}}
{{- define "latch.image" -}}
{{- $tag := .root.Values.image.tag | default .root.Chart.AppVersion -}}
{{- printf "%s/%s:%s" .root.Values.image.registry .binary $tag -}}
{{- end -}}

{{/* Labels every object carries. */}}
{{- define "latch.labels" -}}
app.kubernetes.io/part-of: latch
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* Pod annotations: scrape annotations (metrics.podAnnotations, unless
"scrape" is given and false, or a PodMonitor scrapes the Pods) plus extra
ones. */}}
{{- define "latch.podAnnotations" -}}
{{- $a := dict -}}
{{- if and .root.Values.metrics.podAnnotations (not .root.Values.metrics.podMonitor.enabled) (ternary (get . "scrape") true (hasKey . "scrape")) -}}
{{- $_ := set $a "prometheus.io/scrape" "true" -}}
{{- $_ := set $a "prometheus.io/port" (toString .root.Values.httpPort) -}}
{{- $_ := set $a "prometheus.io/path" "/metrics" -}}
{{- end -}}
{{- range $k, $v := .extra -}}
{{- $_ := set $a $k $v -}}
{{- end -}}
{{- if $a -}}
annotations:
{{- toYaml $a | nindent 2 }}
{{- end -}}
{{- end -}}

{{/* Scheduling fields shared by the Deployments: latch.scheduling .Values.<part> */}}
{{- define "latch.scheduling" -}}
{{- with .nodeSelector }}
nodeSelector:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- with .topologySpreadConstraints }}
topologySpreadConstraints:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/*
The csi-attacher sidecar container. It talks to the driver over the socket
in driver.socketDir and, with csiAttacher.httpEndpoint, serves metrics and
/healthz/leader-election on httpPort.
*/}}
{{- define "latch.csiAttacher.container" -}}
{{- $a := .Values.csiAttacher -}}
- name: csi-attacher
  image: {{ include "latch.image" (dict "root" . "binary" "csi-attacher") }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  args:
    - --csi-address={{ .Values.driver.socketDir }}/{{ .Values.driver.socketName }}
    - --leader-election={{ $a.leaderElection }}
    {{- if $a.httpEndpoint }}
    - --http-endpoint=:{{ .Values.httpPort }}
    {{- end }}
    - --timeout={{ $a.timeout }}
    - --worker-threads={{ $a.workerThreads }}
    - --retry-interval-start={{ $a.retryIntervalStart }}
    - --retry-interval-max={{ $a.retryIntervalMax }}
    - --reconcile-sync={{ $a.reconcileSync }}
    - --kube-api-qps={{ $a.kubeAPIQPS }}
    - --kube-api-burst={{ $a.kubeAPIBurst }}
    - --logging-format={{ $a.loggingFormat }}
    - --v={{ $a.logVerbosity }}
    {{- range $a.extraArgs }}
    - {{ . | quote }}
    {{- end }}
  {{- if $a.httpEndpoint }}
  ports:
    # Not "http": the driver's other sidecars (csi-provisioner, ...) in
    # the same Pod name their ports too, and names must be unique in a Pod.
    - name: {{ include "latch.csiAttacher.portName" . }}
      containerPort: {{ .Values.httpPort }}
  {{- end }}
  env:
    # Without --leader-election a restarted container recognises the Lease
    # its previous process held by the Pod's UID and resumes at once
    # (docs/csi-attacher.md, "Leader election").
    - name: POD_UID
      valueFrom:
        fieldRef:
          fieldPath: metadata.uid
  {{- if and $a.leaderElection $a.httpEndpoint }}
  livenessProbe:
    httpGet:
      path: /healthz/leader-election
      port: {{ include "latch.csiAttacher.portName" . }}
    periodSeconds: 20
  {{- end }}
  securityContext:
    {{- toYaml .Values.containerSecurityContext | nindent 4 }}
  resources:
    {{- toYaml $a.resources | nindent 4 }}
  volumeMounts:
    - name: socket-dir
      mountPath: {{ .Values.driver.socketDir }}
{{- end -}}

{{/* Name of the csi-attacher sidecar's HTTP port (metrics, health). */}}
{{- define "latch.csiAttacher.portName" -}}
attacher-http
{{- end -}}

{{/*
Scheduling fields of the driver Deployment: driver.nodeSelector,
tolerations, affinity and topologySpreadConstraints, plus, with
driver.spread and more than one replica, a preferred podAntiAffinity on
the host name (unless affinity has a podAntiAffinity of its own) and a
ScheduleAnyway spread over zones (unless topologySpreadConstraints is set).
Rendered as YAML for latch.scheduling.
*/}}
{{- define "latch.driver.scheduling" -}}
{{- $d := .Values.driver -}}
{{- $s := pick $d "nodeSelector" "tolerations" "topologySpreadConstraints" -}}
{{- $affinity := deepCopy (default dict $d.affinity) -}}
{{- if and $d.spread (gt (int $d.replicas) 1) -}}
{{- $selector := dict "matchLabels" (dict "app.kubernetes.io/name" $d.name "app.kubernetes.io/instance" .Release.Name) -}}
{{- if not (hasKey $affinity "podAntiAffinity") -}}
{{- $term := dict "weight" 100 "podAffinityTerm" (dict "topologyKey" "kubernetes.io/hostname" "labelSelector" $selector) -}}
{{- $_ := set $affinity "podAntiAffinity" (dict "preferredDuringSchedulingIgnoredDuringExecution" (list $term)) -}}
{{- end -}}
{{- if not $d.topologySpreadConstraints -}}
{{- $_ := set $s "topologySpreadConstraints" (list (dict "maxSkew" 1 "topologyKey" "topology.kubernetes.io/zone" "whenUnsatisfiable" "ScheduleAnyway" "labelSelector" $selector)) -}}
{{- end -}}
{{- end -}}
{{- $_ := set $s "affinity" $affinity -}}
{{- toYaml $s -}}
{{- end -}}

{{/*
A CSI driver name as csi-attacher puts it in object names (the Lease
external-attacher-leader-<this>, the ConfigMap external-attacher-orphans-<this>):
every character outside [a-zA-Z0-9-] becomes "-", a trailing "-" gets an
"X", and the result is lower-cased (kube.LeaseName).
*/}}
{{- define "latch.sanitizedDriver" -}}
{{- $s := regexReplaceAll "[^a-zA-Z0-9-]" . "-" -}}
{{- if or (eq $s "") (hasSuffix "-" $s) }}{{ $s = printf "%sX" $s }}{{ end -}}
{{- lower $s -}}
{{- end -}}
