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
Where the raft certificates the pods present come from: "existingSecret"
(raftTLS.existingSecret names a Secret made outside the chart) or
"certManager". The chart never makes a CA itself: a CA made at render time
differs at every render of a GitOps tool (no lookup there), and its key
would be stored in every release revision.

raftTLS.certManager.enabled is null by default: "not said". A new install
that says nothing gets cert-manager. A release that already runs (its
StatefulSet is found) must say, unless it already presents cert-manager's
certificates: chart 0.14.0 generated its own CA into the Secret
<fullname>-raft-tls, and a new CA rolled out pod by pod is refused by the
pods not yet rolled (the rollout stalls with no fault tolerance). The render
fails and says what to set (docs/deploy.md, \"Upgrading from 0.14.0\").
*/}}
{{- define "hastate.raftTLSSource" -}}
{{- $t := .Values.raftTLS -}}
{{- $said := toString $t.certManager.enabled -}}
{{- if $t.existingSecret -}}
existingSecret
{{- else if eq $said "true" -}}
certManager
{{- else if eq $said "false" -}}
{{- fail "raftTLS: the raft port needs certificates: set raftTLS.certManager.enabled=true (cert-manager), or raftTLS.existingSecret to a Secret holding ca.crt and <fullname>-<i>.crt/.key for every replica (docs/deploy.md, Certificates), or turn TLS off with raftTLS.enabled=false (development only)" -}}
{{- else -}}
{{- $running := include "hastate.runningRaftTLS" . | fromJson -}}
{{- if not $running.found -}}
{{- if .Release.IsUpgrade -}}
{{- fail (printf "raftTLS: helm upgrade, and the chart cannot see which raft certificates the running replicas use (no StatefulSet %s found: helm template and a client-side dry run cannot look). Say it: raftTLS.existingSecret=<the Secret the pods mount> or raftTLS.certManager.enabled=true, as the running release does (docs/deploy.md, \"Upgrading from 0.14.0\")" (include "hastate.fullname" .)) -}}
{{- end -}}
certManager
{{- else if eq $running.present "certManager" -}}
certManager
{{- else if eq $running.present "none" -}}
certManager
{{- else -}}
{{- fail (printf "raftTLS: this release already has raft certificates: its pods present those of Secret %s%s. Say which source to use, or the first pod to roll would present a certificate of a new CA that the others refuse (the rollout stalls at %d of %d, with no fault tolerance). Keep them: raftTLS.existingSecret=%s (docs/deploy.md, \"Upgrading from 0.14.0\"). Or move to cert-manager afterwards in two steps with both CAs trusted during the move (docs/deploy.md, \"Moving the raft CA\"), never in one rollout" $running.secret (ternary " (made by chart 0.14.0, kept on upgrade)" "" (eq $running.secret (printf "%s-raft-tls" (include "hastate.fullname" .)))) (sub (int .Values.replicas) 1) (int .Values.replicas) $running.secret) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
What the running StatefulSet's pods present and trust on the raft port, as
JSON: found (a StatefulSet of this name exists; never with helm template or
a client-side dry run, which cannot look), present ("none", "certManager",
"secret"), secret (its name), trust ("" or "bundle:<kind>/<name>").
*/}}
{{- define "hastate.runningRaftTLS" -}}
{{- $full := include "hastate.fullname" . -}}
{{- $ss := lookup "apps/v1" "StatefulSet" .Release.Namespace $full -}}
{{- $out := dict "found" false "present" "none" "secret" "" "trust" "" -}}
{{- if $ss -}}
{{- $_ := set $out "found" true -}}
{{- range $v := $ss.spec.template.spec.volumes -}}
{{- if eq $v.name "raft-tls" -}}
{{- if and $v.csi (hasPrefix "csi.cert-manager.io" (toString $v.csi.driver)) -}}
{{- $_ := set $out "present" "certManager" -}}
{{- else if $v.secret -}}
{{- $_ := set $out "present" "secret" -}}
{{- $_ := set $out "secret" $v.secret.secretName -}}
{{- else if $v.projected -}}
{{- range $src := $v.projected.sources -}}
{{- if and $src.secret (eq $src.secret.name (printf "%s-raft-0" $full)) -}}
{{- $_ := set $out "present" "certManager" -}}
{{- else if and $src.secret (hasKey $src.secret "items") (gt (len $src.secret.items) 1) (eq $out.present "none") -}}
{{- $_ := set $out "present" "secret" -}}
{{- $_ := set $out "secret" $src.secret.name -}}
{{- end -}}
{{- range $kind := list "configMap" "secret" -}}
{{- $b := index $src $kind -}}
{{- if and $b (eq (len $b.items) 1) (eq (index $b.items 0).path "ca.crt") (not (eq $b.name (printf "%s-raft-0" $full))) (not (eq $b.name $out.secret)) -}}
{{- $_ := set $out "trust" (printf "bundle:%s/%s" $kind $b.name) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $out | toJson -}}
{{- end -}}

{{/* The trust bundle of these values, as runningRaftTLS names it ("" when none). */}}
{{- define "hastate.raftTrustBundle" -}}
{{- $b := .Values.raftTLS.trustBundle -}}
{{- if and $b.configMap $b.secret -}}
{{- fail "raftTLS.trustBundle: set configMap or secret, not both" -}}
{{- else if $b.configMap -}}
{{- printf "bundle:configMap/%s" $b.configMap -}}
{{- else if $b.secret -}}
{{- printf "bundle:secret/%s" $b.secret -}}
{{- end -}}
{{- end -}}

{{/*
The CA move guard: a rollout that changes which certificates the pods
present (another Secret, or between a Secret and cert-manager) keeps the
cluster whole only if every pod, rolled or not, trusts both CAs all along:
that is, the running pods already trust the bundle these values trust
(step 1 of docs/deploy.md, "Moving the raft CA", rolled out before).
Fails otherwise; silent when the chart cannot look (helm template).
*/}}
{{- define "hastate.checkRaftTLSMove" -}}
{{- $running := include "hastate.runningRaftTLS" . | fromJson -}}
{{- if and $running.found (not .Values.raftTLS.enabled) (ne $running.present "none") -}}
{{- fail "raftTLS.enabled=false, and the running replicas use raft TLS: rolled pod by pod, the first plain-TCP pod and the TLS pods refuse each other and the cluster loses fault tolerance. Keep raftTLS.enabled=true (turning TLS off is a restart of every replica at once, development only)" -}}
{{- end -}}
{{- if and $running.found .Values.raftTLS.enabled (eq $running.present "none") -}}
{{- fail "raftTLS: the running replicas have no raft TLS, and TLS on in one rollout would split the cluster (the first pod rolled refuses the others). Keep raftTLS.enabled=false for this upgrade; turning TLS on is a restart of every replica at once (docs/deploy.md, Certificates)" -}}
{{- end -}}
{{- if and $running.found .Values.raftTLS.enabled (ne $running.present "none") -}}
{{- $src := include "hastate.raftTLSSource" . -}}
{{- $now := ternary "certManager" (printf "secret %s" $running.secret) (eq $running.present "certManager") -}}
{{- $next := ternary "certManager" (printf "secret %s" .Values.raftTLS.existingSecret) (eq $src "certManager") -}}
{{- $bundle := include "hastate.raftTrustBundle" . -}}
{{- if and (ne $now $next) (or (not $bundle) (ne $bundle $running.trust)) -}}
{{- fail (printf "raftTLS: the running pods present certificates of %s, these values of %s: rolled pod by pod, the first rolled pod presents a CA the others do not trust and the cluster loses fault tolerance. First roll out a trust bundle holding both CAs (raftTLS.trustBundle, pods still presenting %s), then switch with the same bundle (docs/deploy.md, \"Moving the raft CA\")" $now $next $now) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The HAProxy CIDRs, required: they make both the load balancer's source ranges (GKE's firewall rule) and the NetworkPolicy. */}}
{{- define "hastate.haproxyCIDRs" -}}
{{- include "hastate.refuseRemovedValues" . -}}
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

{{/*
A capability check, as consul-k8s does: an object of a CRD the cluster does
not serve fails the render naming what is missing, rather than failing the
apply half-way. helm template without a cluster: pass --api-versions
<group/version/Kind> (GitOps tools pass the cluster's).
*/}}
{{- define "hastate.requireAPI" -}}
{{- if not (.root.Capabilities.APIVersions.Has .api) -}}
{{- fail (printf "%s needs the API %s, which this cluster does not serve: %s. (helm template without a cluster: pass --api-versions %s)" .what .api .instead .api) -}}
{{- end -}}
{{- end -}}

{{/*
Values of chart 0.14.0 that this chart no longer reads: a 0.14.0 values
file given to `helm upgrade` fails naming what replaces each, rather than
being ignored (docs/deploy.md, "Upgrading from 0.14.0").
*/}}
{{- define "hastate.refuseRemovedValues" -}}
{{- $full := include "hastate.fullname" . -}}
{{- if hasKey .Values.raftTLS "generated" -}}
{{- fail (printf "raftTLS.generated (chart 0.14.0) is gone: the chart no longer makes a CA. Remove it and keep the certificates 0.14.0 generated with raftTLS.existingSecret=%s-raft-tls (the Secret it made and kept; docs/deploy.md, \"Upgrading from 0.14.0\")" $full) -}}
{{- end -}}
{{- if hasKey .Values.networkPolicy "agentCIDRs" -}}
{{- fail (printf "networkPolicy.agentCIDRs (chart 0.14.0) is now haproxyCIDRs, which also makes the load balancer's source ranges: move the list there (haproxyCIDRs: %s) and remove networkPolicy.agentCIDRs" (toJson .Values.networkPolicy.agentCIDRs)) -}}
{{- end -}}
{{- if hasKey .Values.agentService "loadBalancerSourceRanges" -}}
{{- fail (printf "agentService.loadBalancerSourceRanges (chart 0.14.0) is now haproxyCIDRs (the load balancer's source ranges and the NetworkPolicy's agent rule): move the list there (haproxyCIDRs: %s) and remove agentService.loadBalancerSourceRanges" (toJson .Values.agentService.loadBalancerSourceRanges)) -}}
{{- end -}}
{{- end -}}

{{/* The issuer of the raft certificates, as JSON: raftTLS.certManager.issuerRef, else the chart's own CA Issuer. */}}
{{- define "hastate.raftIssuer" -}}
{{- $ref := .Values.raftTLS.certManager.issuerRef -}}
{{- if $ref.name -}}
{{- dict "name" $ref.name "kind" $ref.kind "group" $ref.group | toJson -}}
{{- else -}}
{{- dict "name" (printf "%s-raft-ca" (include "hastate.fullname" .)) "kind" "Issuer" "group" "cert-manager.io" | toJson -}}
{{- end -}}
{{- end -}}

{{/*
cert-manager's csi-driver must be installed for raftTLS.certManager.csiDriver:
without it every pod waits in ContainerCreating. Checked when the chart can
look at the cluster (its namespace is found); helm template cannot.
*/}}
{{- define "hastate.requireCSIDriver" -}}
{{- $driver := .Values.raftTLS.certManager.csiDriver.driver -}}
{{- if and .Values.raftTLS.certManager.csiDriver.checkInstalled (lookup "v1" "Namespace" "" .Release.Namespace) (not (lookup "storage.k8s.io/v1" "CSIDriver" "" $driver)) -}}
{{- fail (printf "raftTLS.certManager.csiDriver: the cluster has no CSIDriver %s: install cert-manager's csi-driver (https://cert-manager.io/docs/usage/csi-driver/), or set raftTLS.certManager.csiDriver.enabled=false (per-replica Certificates, every pod mounting every replica's key)" $driver) -}}
{{- end -}}
{{- end -}}
