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
    - name: http
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
      port: http
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
