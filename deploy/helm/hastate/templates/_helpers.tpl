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
app.kubernetes.io/version: {{ include "hastate.imageTag" . | quote }}
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

{{/* The image tag: image.tag, else the chart's appVersion (VERSION at release; "+" is not allowed in a tag). */}}
{{- define "hastate.imageTag" -}}
{{- .Values.image.tag | default (.Chart.AppVersion | replace "+" "-") -}}
{{- end -}}

{{/*
Where the raft certificates come from: "existingSecret" (raftTLS.existingSecret
names a Secret made outside the chart) or "certManager". The chart never
makes a CA itself: a CA made at render time differs at every render of a
GitOps tool (no lookup there), and its key would be stored in every release
revision. Fails with what to set when TLS is on and neither is given.
*/}}
{{- define "hastate.raftTLSSource" -}}
{{- if .Values.raftTLS.existingSecret -}}
existingSecret
{{- else if .Values.raftTLS.certManager.enabled -}}
certManager
{{- else -}}
{{- fail "raftTLS: the raft port needs certificates: keep raftTLS.certManager.enabled=true (cert-manager, the default), or set raftTLS.existingSecret to a Secret holding ca.crt and <fullname>-<i>.crt/.key for every replica (docs/deploy.md, Certificates), or turn TLS off with raftTLS.enabled=false (development only)" -}}
{{- end -}}
{{- end -}}

{{/* The HAProxy CIDRs, required: they make both the load balancer's source ranges (GKE's firewall rule) and the NetworkPolicy. */}}
{{- define "hastate.haproxyCIDRs" -}}
{{- if not .Values.haproxyCIDRs -}}
{{- fail "haproxyCIDRs is empty: list the CIDRs of the HAProxy nodes that poll port 9777 (e.g. --set 'haproxyCIDRs={10.20.0.0/16}'). They become the agent Service's loadBalancerSourceRanges, from which GKE makes the firewall rule that actually filters (empty would be 0.0.0.0/0), and the NetworkPolicy's agent rule" -}}
{{- end -}}
{{- toJson .Values.haproxyCIDRs -}}
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

{{/* GOMEMLIMIT: 90% of resources.limits.memory (Ki, Mi, Gi, k, M, G or bytes), in MiB. */}}
{{- define "hastate.goMemLimit" -}}
{{- $m := .Values.resources.limits.memory | toString -}}
{{- $digits := regexFind "^[0-9]+" $m -}}
{{- $unit := trimPrefix $digits $m -}}
{{- $mult := dict "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "" 1 "k" 1000 "M" 1000000 "G" 1000000000 -}}
{{- if or (not $digits) (not (hasKey $mult $unit)) -}}
{{- fail (printf "resources.limits.memory %q: write it as a whole number with Ki, Mi, Gi, k, M or G (GOMEMLIMIT is derived from it)" $m) -}}
{{- end -}}
{{- printf "%dMiB" (div (mul (int64 $digits) (index $mult $unit) 9) (mul 10 1048576)) -}}
{{- end -}}

{{/* The scrape job of this release: metrics.job, else the full name (contains "hastate" unless overridden, as HastateReplicaDown's selector expects). */}}
{{- define "hastate.metricsJob" -}}
{{- .Values.metrics.job | default (include "hastate.fullname" .) -}}
{{- end -}}

{{/* Labels of the `helm test` pod: not the replicas' selector. */}}
{{- define "hastate.testLabels" -}}
app.kubernetes.io/name: {{ include "hastate.name" . }}-test
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: helm-test
{{- end -}}
