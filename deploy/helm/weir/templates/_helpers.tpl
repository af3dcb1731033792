{{/* The labels every object of the release carries. */}}
{{- define "weir.labels" -}}
app.kubernetes.io/part-of: weir
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The agent's image: the tag defaults to the chart's appVersion. */}}
{{- define "weir.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The agent's flags, one file each in the weir-config ConfigMap. */}}
{{- define "weir.agentConfig" -}}
mode: {{ .Values.routingMode | quote }}
tunnel-port: {{ .Values.tunnelPort | quote }}
mtu: {{ .Values.mtu | quote }}
cluster-cidr: {{ .Values.clusterCIDR | quote }}
kube-proxy-replacement: {{ .Values.kubeProxyReplacement | quote }}
state-dir: {{ .Values.agent.paths.state | quote }}
socket: {{ .Values.agent.paths.socket | quote }}
bpf-pin-dir: {{ .Values.agent.paths.bpfPin | quote }}
cgroup-root: {{ .Values.agent.paths.cgroupRoot | quote }}
{{- /* Only a privileged agent's mount reaches the node; the others rely on mount-fs. */}}
mount-bpffs: {{ ternary "true" "false" .Values.agent.privileged | quote }}
sysctl-dir: "/host/proc/sys"
cni-conf-dir: {{ .Values.agent.paths.cniConf | quote }}
cni-exclusive: {{ .Values.cni.exclusive | quote }}
health-addr: {{ printf "127.0.0.1:%d" (int .Values.health.port) | quote }}
{{- if .Values.metrics.port }}
{{- $host := .Values.metrics.bindAddress }}
{{- if contains ":" $host }}{{ $host = printf "[%s]" $host }}{{ end }}
metrics-addr: {{ printf "%s:%d" $host (int .Values.metrics.port) | quote }}
{{- end }}
flow-events: {{ .Values.flows.events | quote }}
flow-max-bytes: {{ .Values.flows.maxBytes | int64 | quote }}
{{- end -}}
