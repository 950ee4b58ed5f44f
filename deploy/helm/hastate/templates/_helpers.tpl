{{/* Names and labels. */}}
{{- define "hastate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The StatefulSet's and the headless Service's name: pods are <fullname>-<i>.<fullname>.<ns>.svc. */}}
{{- define "hastate.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" -}}
{{- else if contains (include "hastate.name" .) .Release.Name -}}
{{- .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "hastate.name" .) | trunc 52 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "hastate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "hastate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "hastate.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "hastate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "hastate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "hastate.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The raft host name of replica i (an int in .i): <fullname>-<i>.<fullname>.<ns>.svc. */}}
{{- define "hastate.raftHost" -}}
{{- $full := include "hastate.fullname" .root -}}
{{- printf "%s-%d.%s.%s.svc" $full (int .i) $full .root.Release.Namespace -}}
{{- end -}}

{{/* --peers: id=host:9779 for every replica. */}}
{{- define "hastate.peers" -}}
{{- $root := . -}}
{{- $peers := list -}}
{{- range $i := until (int .Values.replicas) -}}
{{- $peers = append $peers (printf "%s-%d=%s:9779" (include "hastate.fullname" $root) $i (include "hastate.raftHost" (dict "root" $root "i" $i))) -}}
{{- end -}}
{{- join "," $peers -}}
{{- end -}}

{{/* The shutdown delay in seconds: given, or the load balancer's health check interval × unhealthy threshold + propagation. */}}
{{- define "hastate.shutdownDelaySeconds" -}}
{{- if kindIs "invalid" .Values.shutdown.delaySeconds -}}
{{- $hc := .Values.agentService.healthCheck -}}
{{- add (mul (int $hc.intervalSeconds) (int $hc.unhealthyThreshold)) (int .Values.shutdown.propagationSeconds) -}}
{{- else -}}
{{- int .Values.shutdown.delaySeconds -}}
{{- end -}}
{{- end -}}

{{- define "hastate.raftTLSSecret" -}}
{{- printf "%s-raft-tls" (include "hastate.fullname" .) -}}
{{- end -}}

{{/*
The chart refuses to start replicas that would read Consul anonymously, as
consul-k8s and vault-helm refuse a missing required secret: the render fails
and says what to set. With ACLs and default deny, Consul lists the prefix as
empty for the anonymous token and does not say it filtered anything.
*/}}
{{- define "hastate.requireConsulToken" -}}
{{- if not (or .Values.consul.token .Values.consul.existingSecret.name .Values.consul.allowAnonymous) -}}
{{- fail "consul: no Consul token. Set consul.existingSecret.name (a Secret holding the replicas' read token, key consul.existingSecret.key; deploy/terraform makes the token, docs/deploy.md) or consul.token. Without a token Consul answers as its anonymous token, which with default deny reads nothing; for a Consul without ACLs set consul.allowAnonymous=true." -}}
{{- end -}}
{{- end -}}

{{- define "hastate.consulTokenSecret" -}}
{{- if .Values.consul.existingSecret.name -}}
{{- .Values.consul.existingSecret.name -}}
{{- else -}}
{{- printf "%s-consul" (include "hastate.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* DNS names of replica i's raft certificate. */}}
{{- define "hastate.raftDNSNames" -}}
{{- $full := include "hastate.fullname" .root -}}
{{- $ns := .root.Release.Namespace -}}
{{- $pod := printf "%s-%d" $full (int .i) -}}
{{- list (printf "%s.%s.%s.svc" $pod $full $ns) (printf "%s.%s.%s.svc.cluster.local" $pod $full $ns) (printf "%s.%s" $pod $full) $pod | toJson -}}
{{- end -}}
