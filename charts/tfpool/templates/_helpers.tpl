{{/* Shared pieces of the tfpool templates. */}}

{{/* The node agent's namespace: nodeAgent.namespace, else "<release namespace>-node-agent". */}}
{{- define "tfpool.agentNamespace" -}}
{{- default (printf "%s-node-agent" .Release.Namespace) .Values.nodeAgent.namespace -}}
{{- end -}}

{{/* The name of a cluster-wide object of a component: "<release name>-<component>". */}}
{{- define "tfpool.clusterName" -}}
{{- printf "%s-%s" .root.Release.Name .component | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "tfpool.labels" -}}
app.kubernetes.io/part-of: tfpool
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Labels of one component; the selector is its first two. */}}
{{- define "tfpool.componentLabels" -}}
app.kubernetes.io/name: tfpool
app.kubernetes.io/component: {{ .component }}
{{ include "tfpool.labels" .root }}
{{- end -}}

{{- define "tfpool.selector" -}}
app.kubernetes.io/name: tfpool
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "tfpool.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "tfpool.natsSecret" -}}
{{- default "tfpool-nats" .Values.nats.existingSecret -}}
{{- end -}}

{{- define "tfpool.databaseSecret" -}}
{{- default "tfpool-database" .Values.postgres.existingSecret -}}
{{- end -}}

{{/* Pod security of every unprivileged pod (Pod Security "restricted"). */}}
{{- define "tfpool.restrictedPodSecurity" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "tfpool.containerSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop:
  - ALL
{{- end -}}

{{/* The environment every service shares: NATS as its own user, the ledger (not the node agent's: it
     holds no database credential and asks the scheduler over NATS), the token, the config. */}}
{{- define "tfpool.serviceEnv" -}}
- name: TF_NATS_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "tfpool.natsSecret" .root }}
      key: url
{{- if eq .service "node-agent" }}
{{- /* A node agent is node:<its node> and proves it with its pod's service-account token (the projected
       volume nats-token, audience tfpool-nats), read again at each reconnection; the auth callout grants
       that node's subjects only. */}}
- name: TF_NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
- name: TF_NATS_USER
  value: node:$(TF_NODE_NAME)
- name: TF_NATS_PASSWORD_FILE
  value: /var/run/secrets/tfpool/nats/token
{{- else }}
- name: TF_NATS_USER
  value: {{ .service }}
- name: TF_NATS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "tfpool.natsSecret" .root }}
      key: {{ .service }}-password
{{- end }}
- name: TF_NATS_STREAM_REPLICAS
  value: {{ .root.Values.nats.streamReplicas | quote }}
{{- if .root.Values.nats.tls.enabled }}
- name: TF_NATS_TLS_CA_FILE
  value: /etc/tfpool/nats-ca/ca.crt
{{- end }}
{{- if ne .service "node-agent" }}
- name: TF_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "tfpool.databaseSecret" .root }}
      key: app-url
{{- end }}
{{- if .root.Values.apiTokenSecret }}
- name: TF_API_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ .root.Values.apiTokenSecret }}
      key: token
{{- end }}
- name: TF_CONFIG_FILE
  value: /etc/tfpool/config.yaml
- name: TF_LOG_LEVEL
  value: {{ .root.Values.logLevel | quote }}
{{- end -}}

{{/* The init container that holds a service back until the migration Job has brought the schema to the
     image's newest revision (tfctl migrate --wait), instead of the service restarting until then. */}}
{{- define "tfpool.waitForSchema" -}}
{{- if .Values.migration.enabled }}
initContainers:
- name: wait-for-schema
  image: {{ include "tfpool.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  args:
  - migrate
  - --wait
  - --timeout
  - {{ .Values.migration.timeoutSeconds | quote }}
  env:
  - name: TF_DATABASE_URL
    valueFrom:
      secretKeyRef:
        name: {{ include "tfpool.databaseSecret" . }}
        key: app-url
  resources:
    requests:
      cpu: 10m
      memory: 64Mi
    limits:
      memory: 128Mi
  securityContext:
    {{- include "tfpool.containerSecurity" . | nindent 4 }}
  volumeMounts:
  - name: tmp
    mountPath: /tmp
{{- end }}
{{- end -}}

{{- define "tfpool.probes" -}}
readinessProbe:
  httpGet:
    path: /readyz
    port: {{ .port }}
    scheme: {{ .scheme }}
  periodSeconds: 5
  timeoutSeconds: 2
  failureThreshold: 3
livenessProbe:
  httpGet:
    path: /healthz
    port: {{ .port }}
    scheme: {{ .scheme }}
  periodSeconds: 10
  timeoutSeconds: 2
  failureThreshold: 3
startupProbe:
  httpGet:
    path: /healthz
    port: {{ .port }}
    scheme: {{ .scheme }}
  periodSeconds: 2
  timeoutSeconds: 2
  failureThreshold: 60
{{- end -}}

{{/* Takes the root context, or a dict with it as root. */}}
{{- define "tfpool.serviceMounts" -}}
{{- $root := .root | default . -}}
- name: config
  mountPath: /etc/tfpool/config.yaml
  subPath: config.yaml
  readOnly: true
- name: tmp
  mountPath: /tmp
- name: state
  mountPath: /var/lib/tfpool
{{- if $root.Values.nats.tls.enabled }}
- name: nats-ca
  mountPath: /etc/tfpool/nats-ca
  readOnly: true
{{- end }}
{{- end -}}

{{- define "tfpool.serviceVolumes" -}}
{{- $root := .root | default . -}}
- name: config
  configMap:
    name: tfpool-config
- name: tmp
  emptyDir: {}
- name: state
  emptyDir: {}
{{- if $root.Values.nats.tls.enabled }}
- name: nats-ca
  secret:
    secretName: {{ include "tfpool.natsCaSecret" $root }}
    items:
    - key: ca.crt
      path: ca.crt
{{- end }}
{{- end -}}

{{/* The Secret with the CA of NATS's certificate (key ca.crt), in the release and agent namespaces. */}}
{{- define "tfpool.natsCaSecret" -}}
{{- default "tfpool-nats-ca" .Values.nats.tls.caSecret -}}
{{- end -}}

{{/* nodeSelector, tolerations and affinity of one component's values, when set. */}}
{{- define "tfpool.placement" -}}
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
{{- end -}}

{{/* A component's ServiceAccount, ClusterRole and ClusterRoleBinding (and Role and RoleBinding when
     k8s/base has one), with the rules of files/rbac.yaml (generated from k8s/base). */}}
{{- define "tfpool.rbac" -}}
{{- $rules := index (.root.Files.Get "files/rbac.yaml" | fromYaml) .component -}}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: tfpool-{{ .component }}
  namespace: {{ .namespace }}
  labels:
    {{- include "tfpool.labels" .root | nindent 4 }}
{{- with $rules.clusterRole }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: {{ include "tfpool.clusterName" (dict "root" $.root "component" $.component) }}
  labels:
    {{- include "tfpool.labels" $.root | nindent 4 }}
rules:
  {{- toYaml . | nindent 2 }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: {{ include "tfpool.clusterName" (dict "root" $.root "component" $.component) }}
  labels:
    {{- include "tfpool.labels" $.root | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: {{ include "tfpool.clusterName" (dict "root" $.root "component" $.component) }}
subjects:
- kind: ServiceAccount
  name: tfpool-{{ $.component }}
  namespace: {{ $.namespace }}
{{- end }}
{{- with $rules.role }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: tfpool-{{ $.component }}
  namespace: {{ $.namespace }}
  labels:
    {{- include "tfpool.labels" $.root | nindent 4 }}
rules:
  {{- toYaml . | nindent 2 }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: tfpool-{{ $.component }}
  namespace: {{ $.namespace }}
  labels:
    {{- include "tfpool.labels" $.root | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: tfpool-{{ $.component }}
subjects:
- kind: ServiceAccount
  name: tfpool-{{ $.component }}
  namespace: {{ $.namespace }}
{{- end }}
{{- end -}}

{{/* The bundled NATS servers' routes: every server of the StatefulSet by its own DNS name. */}}
{{- define "tfpool.natsRoutes" -}}
{{- $routes := list -}}
{{- range $index := until .replicas -}}
{{- $routes = append $routes (printf "nats://tfpool-nats-%d.tfpool-nats-cluster.%s.svc:6222" $index $.root.Release.Namespace) -}}
{{- end -}}
{{- join "," $routes -}}
{{- end -}}

{{/* A PodDisruptionBudget of one component. */}}
{{- define "tfpool.pdb" -}}
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: tfpool-{{ .component }}
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "tfpool.componentLabels" . | nindent 4 }}
spec:
  {{- if .minAvailable }}
  minAvailable: {{ .minAvailable }}
  {{- else }}
  maxUnavailable: 1
  {{- end }}
  selector:
    matchLabels:
      {{- include "tfpool.selector" . | nindent 6 }}
{{- end -}}

{{/* A ClusterIP Service of one component on one named port. */}}
{{- define "tfpool.service" -}}
apiVersion: v1
kind: Service
metadata:
  name: tfpool-{{ .component }}
  namespace: {{ .namespace }}
  labels:
    {{- include "tfpool.componentLabels" . | nindent 4 }}
spec:
  selector:
    {{- include "tfpool.selector" . | nindent 4 }}
  {{- if .headless }}
  clusterIP: None
  {{- end }}
  ports:
  - name: {{ .portName }}
    port: {{ .port }}
    targetPort: {{ .portName }}
    protocol: TCP
{{- end -}}

{{/* "true" when automatic migration is on: autoMigration.enabled, or dynamicConfig.autoMigration.enable
as TensorFusion's chart and the migration guide set it (top level or under config). */}}
{{- define "tfpool.autoMigrationEnabled" -}}
{{- $top := dig "autoMigration" "enable" false (default dict .Values.dynamicConfig) -}}
{{- $underConfig := dig "dynamicConfig" "autoMigration" "enable" false (default dict .Values.config) -}}
{{- or .Values.autoMigration.enabled $top $underConfig | toString -}}
{{- end -}}
