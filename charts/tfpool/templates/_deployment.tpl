{{/* The Deployment of one control-plane service (`tfctl serve <component>`), Pod Security "restricted".
     Takes: root, component, values (the component's values), replicas, portName, port, scheme,
     priorityClassName, and optionally env, mounts, volumes (YAML lists), spread, recreate. */}}
{{- define "tfpool.deployment" -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: tfpool-{{ .component }}
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "tfpool.componentLabels" . | nindent 4 }}
spec:
  replicas: {{ .replicas }}
  {{- if .recreate }}
  strategy:
    type: Recreate
  {{- end }}
  selector:
    matchLabels:
      {{- include "tfpool.selector" . | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "tfpool.componentLabels" . | nindent 8 }}
      annotations:
        checksum/config: {{ include "tfpool.configYaml" .root | sha256sum }}
    spec:
      serviceAccountName: tfpool-{{ .component }}
      priorityClassName: {{ .priorityClassName }}
      {{- with .root.Values.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      securityContext:
        {{- include "tfpool.restrictedPodSecurity" . | nindent 8 }}
      terminationGracePeriodSeconds: 30
      {{- include "tfpool.waitForSchema" .root | nindent 6 }}
      containers:
      - name: {{ .component }}
        image: {{ include "tfpool.image" .root }}
        imagePullPolicy: {{ .root.Values.image.pullPolicy }}
        args:
        - serve
        - {{ .component }}
        ports:
        - name: {{ .portName }}
          containerPort: {{ .port }}
          protocol: TCP
        env:
        {{- include "tfpool.serviceEnv" (dict "root" .root "service" .component) | nindent 8 }}
        {{- with .env }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
        {{- include "tfpool.probes" . | nindent 8 }}
        resources:
          {{- toYaml .values.resources | nindent 10 }}
        securityContext:
          {{- include "tfpool.containerSecurity" . | nindent 10 }}
        volumeMounts:
        {{- include "tfpool.serviceMounts" . | nindent 8 }}
        {{- with .mounts }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      volumes:
      {{- include "tfpool.serviceVolumes" . | nindent 6 }}
      {{- with .volumes }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
      {{- include "tfpool.placement" .values | nindent 6 }}
      {{- if .spread }}
      topologySpreadConstraints:
      - maxSkew: 1
        topologyKey: kubernetes.io/hostname
        whenUnsatisfiable: ScheduleAnyway
        labelSelector:
          matchLabels:
            {{- include "tfpool.selector" . | nindent 12 }}
      {{- end }}
{{- end -}}
