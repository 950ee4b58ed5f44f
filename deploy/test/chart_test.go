package deploytest

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
)

// tokenOnly is the token's Secret, which an install must give besides the
// HAProxy CIDRs (requiredValues has both).
const tokenOnly = `consul: {existingSecret: {name: hastate-consul}}`

// The defaults are what production gets with only the required values
// (requiredValues: the HAProxy CIDRs and the token's Secret; without the
// token the chart refuses to render: TestChartRefusesAnonymousConsul):
// check every fact the deploy guide promises.
func TestChartDefaults(t *testing.T) {
	r := render(t, loadChart(t, chartDir), values(t, tokenOnly))
	ss, c := statefulSet(t, r)

	if got := *ss.Spec.Replicas; got != 3 {
		t.Errorf("replicas = %d, want 3", got)
	}
	if ss.Spec.PodManagementPolicy != appsv1.ParallelPodManagement {
		t.Errorf("podManagementPolicy = %q, want Parallel", ss.Spec.PodManagementPolicy)
	}
	if ss.Spec.ServiceName != headless {
		t.Errorf("serviceName = %q, want the headless Service %q", ss.Spec.ServiceName, headless)
	}
	wantArgs := map[string]string{
		"node-id":        "$(POD_NAME)",
		"raft-advertise": "$(POD_NAME).t-hastate.$(POD_NAMESPACE).svc:9779",
		"peers":          wantPeers(3),
		"data-dir":       "/var/lib/hastate",
		"kv-prefix":      "hastate/",
		"shutdown-delay": "29s", // 8 s × 3 + 5 s
		// Serving while terminating: docs/deploy.md "One rollout step",
		// TestE2ERolloutStepExternalTrafficPolicyLocal.
		"ready-while-stopping": "true",
		"raft-tls-cert":        "/etc/hastate/raft-tls/$(POD_NAME).crt",
		"raft-tls-key":         "/etc/hastate/raft-tls/$(POD_NAME).key",
		"raft-tls-ca":          "/etc/hastate/raft-tls/ca.crt",
		"agent-addr":           ":9777",
		"http-addr":            ":9778",
		"raft-addr":            ":9779",
	}
	if c.Args[0] != "serve" {
		t.Errorf("args[0] = %q, want serve", c.Args[0])
	}
	for name, want := range wantArgs {
		if got, ok := flag(c.Args, name); !ok || got != want {
			t.Errorf("--%s = %q (given: %v), want %q", name, got, ok, want)
		}
	}
	if got := *ss.Spec.Template.Spec.TerminationGracePeriodSeconds; got != 59 {
		t.Errorf("terminationGracePeriodSeconds = %d, want 59 (29 s delay + 30 s stop)", got)
	}
	if got := ss.Spec.Template.Annotations["hastate.io/shutdown-delay-seconds"]; got != "29" {
		t.Errorf("pod annotation shutdown-delay-seconds = %q, want 29", got)
	}
	for _, e := range []string{"POD_NAME", "POD_NAMESPACE"} {
		if v := envVar(c, e); v == nil || v.ValueFrom == nil || v.ValueFrom.FieldRef == nil {
			t.Errorf("env %s: want a fieldRef, got %+v", e, v)
		}
	}
	if v := envVar(c, "CONSUL_HTTP_ADDR"); v == nil || v.Value == "" {
		t.Errorf("env CONSUL_HTTP_ADDR missing")
	}
	checkTokenFile(t, ss, c, "hastate-consul", "token")

	// Probes: readiness on /-/readiness, no liveness.
	rp := c.ReadinessProbe
	if rp == nil || rp.HTTPGet == nil || rp.HTTPGet.Path != "/-/readiness" || rp.HTTPGet.Port.String() != "http" {
		t.Errorf("readinessProbe = %+v, want GET /-/readiness on port http", rp)
	}
	// A replica cut off from its leader fails readiness after the grace
	// (3s); it must leave the endpoints within a few seconds more.
	if rp != nil && (rp.PeriodSeconds*rp.FailureThreshold > 3 || rp.TimeoutSeconds > rp.PeriodSeconds) {
		t.Errorf("readinessProbe every %ds, %d failures, timeout %ds: a cut-off replica stays in the endpoints over 3 s after it fails readiness",
			rp.PeriodSeconds, rp.FailureThreshold, rp.TimeoutSeconds)
	}
	if !slices.Contains(c.Args, "--leaderless-grace=3s") {
		t.Errorf("args %q lack --leaderless-grace=3s", c.Args)
	}
	if !slices.Contains(c.Args, "--confirm-timeout=500ms") {
		t.Errorf("args %q lack --confirm-timeout=500ms", c.Args)
	}
	if c.LivenessProbe != nil {
		t.Errorf("livenessProbe = %+v, want none by default", c.LivenessProbe)
	}
	checkPorts(t, c)
	checkSecurityContext(t, ss, c)

	// Zone spread.
	tsc := ss.Spec.Template.Spec.TopologySpreadConstraints
	if len(tsc) == 0 || tsc[0].TopologyKey != "topology.kubernetes.io/zone" || tsc[0].MaxSkew != 1 || tsc[0].WhenUnsatisfiable != corev1.DoNotSchedule {
		t.Errorf("topologySpreadConstraints = %+v, want zone first, maxSkew 1, DoNotSchedule", tsc)
	}
	// PVC for raft data, mounted at --data-dir.
	if len(ss.Spec.VolumeClaimTemplates) != 1 || ss.Spec.VolumeClaimTemplates[0].Name != "data" {
		t.Fatalf("volumeClaimTemplates = %+v, want one named data", ss.Spec.VolumeClaimTemplates)
	}
	if got := ss.Spec.VolumeClaimTemplates[0].Spec.Resources.Requests.Storage().String(); got != "1Gi" {
		t.Errorf("data PVC size = %s, want 1Gi", got)
	}
	if m := mount(c, "data"); m == nil || m.MountPath != "/var/lib/hastate" {
		t.Errorf("data mount = %+v, want /var/lib/hastate", m)
	}
	if ss.Spec.Template.Spec.AutomountServiceAccountToken == nil || *ss.Spec.Template.Spec.AutomountServiceAccountToken {
		t.Errorf("automountServiceAccountToken must be false: hastate never calls the API")
	}

	checkServices(t, r, agentWant{etp: corev1.ServiceExternalTrafficPolicyLocal})

	pdb := r.get(t, "PodDisruptionBudget", full).(*policyv1.PodDisruptionBudget)
	if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 || pdb.Spec.MinAvailable != nil {
		t.Errorf("PDB = %+v, want maxUnavailable 1", pdb.Spec)
	}
	if !selects(pdb.Spec.Selector.MatchLabels, ss.Spec.Template.Labels) {
		t.Errorf("PDB selector %v does not select the pods %v", pdb.Spec.Selector.MatchLabels, ss.Spec.Template.Labels)
	}

	checkNetworkPolicy(t, r, ss, []string{"10.20.0.0/16"}, []string{"monitoring"})
	checkChartCA(t, r)
	checkTLSFiles(t, c, tlsVolumeFiles(volume(ss, "raft-tls")), 3)

	// Monitoring is off by default; raft certificates come from
	// cert-manager, and no Secret is rendered.
	for _, k := range []string{"ServiceMonitor", "PodMonitoring", "PrometheusRule", "ConfigMap", "Secret"} {
		if n := r.count(k); n != 0 {
			t.Errorf("%d %s rendered by default, want none", n, k)
		}
	}
	for _, want := range []string{"agent-check agent-addr <ILB-IP> agent-port 9777", "Raft mutual TLS: certificates from cert-manager"} {
		if !strings.Contains(r.Notes, want) {
			t.Errorf("NOTES.txt lacks %q:\n%s", want, r.Notes)
		}
	}
}

// Production with everything from outside: cert-manager with a given
// issuer, five replicas, a reserved address, global access, a subnet,
// an existing token Secret and Consul CA Secret, monitoring on, a liveness
// probe, extra flags.
func TestChartProduction(t *testing.T) {
	ch := loadChart(t, chartCopy(t, map[string]string{"alerts.yaml": sampleAlerts, "hastate.json": sampleDashboard}))
	r := render(t, ch, values(t, `
replicas: 5
image: {repository: registry.example/hastate, tag: "1.2.3"}
consul:
  address: https://consul.example:8501
  kvPrefix: gitlab-haproxy-agent/
  existingSecret: {name: hastate-consul, key: acl-token}
  existingCASecret: {name: consul-ca, key: ca.pem}
raftTLS:
  certManager:
    enabled: true
    issuerRef: {name: ops-raft-ca, kind: ClusterIssuer}
agentService:
  loadBalancerIP: 10.1.2.3
  globalAccess: true
  subnet: ops-ilb
  healthCheck: {intervalSeconds: 10, unhealthyThreshold: 2}
livenessProbe: {enabled: true}
extraArgs: ["--pollers-max=400000"]
haproxyCIDRs: [10.20.0.0/16, 10.30.0.0/16]
networkPolicy:
  httpNamespaces: [monitoring, ops-tools]
metrics:
  serviceMonitor: {enabled: true}
  prometheusRule: {enabled: true}
  grafanaDashboard: {enabled: true}
`))
	ss, c := statefulSet(t, r)
	if *ss.Spec.Replicas != 5 {
		t.Errorf("replicas = %d, want 5", *ss.Spec.Replicas)
	}
	if got, _ := flag(c.Args, "peers"); got != wantPeers(5) {
		t.Errorf("--peers = %q, want %q", got, wantPeers(5))
	}
	if got, _ := flag(c.Args, "kv-prefix"); got != "gitlab-haproxy-agent/" {
		t.Errorf("--kv-prefix = %q", got)
	}
	if got, _ := flag(c.Args, "shutdown-delay"); got != "25s" {
		t.Errorf("--shutdown-delay = %q, want 25s (10 s × 2 + 5 s)", got)
	}
	if got := *ss.Spec.Template.Spec.TerminationGracePeriodSeconds; got != 55 {
		t.Errorf("terminationGracePeriodSeconds = %d, want 55", got)
	}
	if !slices.Contains(c.Args, "--pollers-max=400000") {
		t.Errorf("extraArgs missing from %v", c.Args)
	}
	if c.Image != "registry.example/hastate:1.2.3" {
		t.Errorf("image = %q", c.Image)
	}
	checkTokenFile(t, ss, c, "hastate-consul", "acl-token")
	if r.count("Secret") != 0 {
		t.Errorf("Secrets rendered with cert-manager and an existing token Secret: %v", r.keys())
	}
	if v := envVar(c, "CONSUL_CACERT"); v == nil || v.Value != "/etc/hastate/consul-ca/ca.crt" {
		t.Errorf("CONSUL_CACERT = %+v", v)
	}
	if v := volume(ss, "consul-ca"); v == nil || v.Secret == nil || v.Secret.SecretName != "consul-ca" || v.Secret.Items[0].Key != "ca.pem" {
		t.Errorf("consul-ca volume = %+v", v)
	}
	if lp := c.LivenessProbe; lp == nil || lp.HTTPGet == nil || lp.HTTPGet.Path != "/-/liveness" {
		t.Errorf("livenessProbe = %+v, want GET /-/liveness when enabled", lp)
	}
	checkServices(t, r, agentWant{etp: corev1.ServiceExternalTrafficPolicyLocal, ip: "10.1.2.3", global: true, subnet: "ops-ilb"})
	checkNetworkPolicy(t, r, ss, []string{"10.20.0.0/16", "10.30.0.0/16"}, []string{"monitoring", "ops-tools"})

	// One Certificate per replica from the given issuer, no chart CA.
	if r.count("Issuer") != 0 || r.count("Certificate") != 5 {
		t.Errorf("cert-manager objects: %v, want 5 Certificates and no Issuer", r.keys())
	}
	for i := range 5 {
		crt := r.get(t, "Certificate", fmt.Sprintf("t-hastate-raft-%d", i)).(*certificate)
		host := fmt.Sprintf("t-hastate-%d.t-hastate.ops.svc", i)
		if !slices.Contains(crt.Spec.DNSNames, host) || crt.Spec.IssuerRef.Name != "ops-raft-ca" || crt.Spec.IssuerRef.Kind != "ClusterIssuer" {
			t.Errorf("Certificate %d = %+v, want SAN %s from ClusterIssuer ops-raft-ca", i, crt.Spec, host)
		}
		if !slices.Contains(crt.Spec.Usages, "server auth") || !slices.Contains(crt.Spec.Usages, "client auth") {
			t.Errorf("Certificate %d usages = %v, want server and client auth", i, crt.Spec.Usages)
		}
	}
	tls := volume(ss, "raft-tls")
	if tls == nil || tls.Projected == nil || len(tls.Projected.Sources) != 5 {
		t.Fatalf("raft-tls volume = %+v, want a projection of 5 Secrets", tls)
	}
	checkTLSFiles(t, c, tlsVolumeFiles(tls), 5)

	sm := r.get(t, "ServiceMonitor", full)
	if sm == nil {
		t.Fatal("no ServiceMonitor")
	}
	// One job per release: the alert rules aggregate by (namespace, job).
	if eps := sm.(*monitoringv1.ServiceMonitor).Spec.Endpoints; len(eps) != 1 || len(eps[0].RelabelConfigs) != 1 ||
		eps[0].RelabelConfigs[0].TargetLabel != "job" || fmt.Sprint(deref(eps[0].RelabelConfigs[0].Replacement)) != full {
		t.Errorf("ServiceMonitor endpoints %+v: want the job label set to the release's %s", eps, full)
	}
	pr := r.get(t, "PrometheusRule", full)
	if pr == nil {
		t.Fatal("no PrometheusRule")
	}
	dash := r.get(t, "ConfigMap", full+"-dashboard").(*corev1.ConfigMap)
	if dash.Labels["grafana_dashboard"] != "1" || dash.Data["hastate.json"] != sampleDashboard {
		t.Errorf("dashboard ConfigMap = labels %v, data %q; want grafana_dashboard=1 and the file byte for byte", dash.Labels, dash.Data["hastate.json"])
	}
	if !strings.Contains(r.Notes, "agent-addr 10.1.2.3 agent-port 9777") {
		t.Errorf("NOTES.txt lacks the server line with the address:\n%s", r.Notes)
	}
}

// With neither consul.token nor consul.existingSecret the chart refuses to
// render, as consul-k8s and vault-helm refuse a missing required secret:
// replicas reading a default-deny Consul anonymously would see an empty
// prefix. Only consul.allowAnonymous=true, said explicitly, runs without a
// token, and NOTES.txt warns.
func TestChartRefusesAnonymousConsul(t *testing.T) {
	ch := loadChart(t, chartDir)
	for _, vals := range []string{"", `consul: {token: ""}`, `consul: {existingSecret: {name: ""}}`, `consul: {allowAnonymous: false}`} {
		_, _, err := renderValues(ch, values(t, vals))
		if err == nil || !strings.Contains(err.Error(), "no Consul token") || !strings.Contains(err.Error(), "consul.existingSecret.name") ||
			!strings.Contains(err.Error(), "consul.allowAnonymous=true") {
			t.Errorf("render with %q: err = %v, want the refusal naming consul.existingSecret.name and consul.allowAnonymous", vals, err)
		}
	}
	r := render(t, ch, values(t, `consul: {allowAnonymous: true}`))
	ss, c := statefulSet(t, r)
	if _, ok := flag(c.Args, "consul-token-file"); ok || volume(ss, "consul-token") != nil || mount(c, "consul-token") != nil || envVar(c, "CONSUL_HTTP_TOKEN") != nil {
		t.Errorf("a token is passed with allowAnonymous and no token: %v", c.Args)
	}
	if !strings.Contains(r.Notes, "WARNING: no Consul token") {
		t.Errorf("NOTES.txt does not warn of the anonymous token:\n%s", r.Notes)
	}
	if _, _, err := renderValues(ch, values(t, `consul: {allowAnonymous: "yes"}`)); err == nil || !strings.Contains(err.Error(), "/consul/allowAnonymous") {
		t.Errorf("allowAnonymous as a string: %v, want a schema error", err)
	}
}

// checkTokenFile: the token's Secret key is mounted as a directory (no
// subPath: Kubernetes updates it in place on rotation) and hastate reads
// it with --consul-token-file; no CONSUL_HTTP_TOKEN (read once).
func checkTokenFile(t *testing.T, ss *appsv1.StatefulSet, c *corev1.Container, secret, key string) {
	t.Helper()
	v := volume(ss, "consul-token")
	if v == nil || v.Secret == nil || v.Secret.SecretName != secret || len(v.Secret.Items) != 1 ||
		v.Secret.Items[0].Key != key || v.Secret.Items[0].Path != "token" {
		t.Errorf("consul-token volume = %+v, want Secret %s key %s as token", v, secret, key)
	}
	m := mount(c, "consul-token")
	if m == nil || m.SubPath != "" || !m.ReadOnly || m.MountPath != "/etc/hastate/consul-token" {
		t.Errorf("consul-token mount = %+v, want /etc/hastate/consul-token read-only, no subPath", m)
	}
	if got, _ := flag(c.Args, "consul-token-file"); got != "/etc/hastate/consul-token/token" {
		t.Errorf("--consul-token-file = %q", got)
	}
	if v := envVar(c, "CONSUL_HTTP_TOKEN"); v != nil {
		t.Errorf("CONSUL_HTTP_TOKEN set (read once, never rotated): %+v", v)
	}
}

// Development: one replica, TLS turned off explicitly, no NetworkPolicy,
// no PDB, no spread, externalTrafficPolicy Cluster, a fixed delay.
func TestChartMinimal(t *testing.T) {
	r := render(t, loadChart(t, chartDir), values(t, `
replicas: 1
consul: {allowAnonymous: true}
raftTLS: {enabled: false}
networkPolicy: {enabled: false}
podDisruptionBudget: {enabled: false}
topologySpread: {enabled: false}
agentService: {externalTrafficPolicy: Cluster}
shutdown: {delaySeconds: 3}
`))
	ss, c := statefulSet(t, r)
	if got, _ := flag(c.Args, "peers"); got != wantPeers(1) {
		t.Errorf("--peers = %q, want %q", got, wantPeers(1))
	}
	for _, f := range []string{"raft-tls-cert", "raft-tls-key", "raft-tls-ca"} {
		if _, ok := flag(c.Args, f); ok {
			t.Errorf("--%s given with raftTLS.enabled=false", f)
		}
	}
	if volume(ss, "raft-tls") != nil || mount(c, "raft-tls") != nil || r.count("Secret") != 0 {
		t.Errorf("raft TLS material rendered with TLS off: %v", r.keys())
	}
	if got, _ := flag(c.Args, "shutdown-delay"); got != "3s" {
		t.Errorf("--shutdown-delay = %q, want 3s", got)
	}
	if got := *ss.Spec.Template.Spec.TerminationGracePeriodSeconds; got != 33 {
		t.Errorf("terminationGracePeriodSeconds = %d, want 33", got)
	}
	if r.has("NetworkPolicy", full) || r.has("PodDisruptionBudget", full) || len(ss.Spec.Template.Spec.TopologySpreadConstraints) != 0 {
		t.Errorf("disabled objects rendered: %v", r.keys())
	}
	checkServices(t, r, agentWant{etp: corev1.ServiceExternalTrafficPolicyCluster})
	if !strings.Contains(r.Notes, "WARNING: raft mutual TLS is off") {
		t.Errorf("NOTES.txt does not warn about TLS off:\n%s", r.Notes)
	}
}

// Inline Consul token and CA, cert-manager with no issuer given (the chart
// makes the cluster's own CA), and monitoring on while the chart has no
// copies of the rules and the dashboard: those render nothing.
func TestChartInlineConsulAndChartCA(t *testing.T) {
	r := render(t, loadChart(t, chartCopy(t, nil)), values(t, `
consul:
  token: s3cr3t
  caCert: |
    -----BEGIN CERTIFICATE-----
    MIIB
    -----END CERTIFICATE-----
raftTLS: {certManager: {enabled: true}}
metrics:
  serviceMonitor: {enabled: true}
  prometheusRule: {enabled: true}
  grafanaDashboard: {enabled: true}
`))
	ss, c := statefulSet(t, r)
	sec := r.get(t, "Secret", "t-hastate-consul").(*corev1.Secret)
	if string(sec.Data["token"]) != "s3cr3t" {
		t.Errorf("token Secret = %q", sec.Data["token"])
	}
	checkTokenFile(t, ss, c, "t-hastate-consul", "token")
	ca := r.get(t, "ConfigMap", "t-hastate-consul-ca").(*corev1.ConfigMap)
	if !strings.HasPrefix(ca.Data["ca.crt"], "-----BEGIN CERTIFICATE-----") {
		t.Errorf("consul CA ConfigMap = %q", ca.Data["ca.crt"])
	}
	if v := volume(ss, "consul-ca"); v == nil || v.ConfigMap == nil || v.ConfigMap.Name != "t-hastate-consul-ca" {
		t.Errorf("consul-ca volume = %+v", v)
	}
	// self-signed root → CA Certificate → CA Issuer → replica Certificates.
	root := r.get(t, "Issuer", "t-hastate-raft-selfsigned").(*issuer)
	caIss := r.get(t, "Issuer", "t-hastate-raft-ca").(*issuer)
	caCrt := r.get(t, "Certificate", "t-hastate-raft-ca").(*certificate)
	if root.Spec.SelfSigned == nil || caIss.Spec.CA == nil || caIss.Spec.CA.SecretName != caCrt.Spec.SecretName || !caCrt.Spec.IsCA {
		t.Errorf("chart CA chain wrong: root %+v, CA issuer %+v, CA cert %+v", root.Spec, caIss.Spec, caCrt.Spec)
	}
	for i := range 3 {
		crt := r.get(t, "Certificate", fmt.Sprintf("t-hastate-raft-%d", i)).(*certificate)
		if crt.Spec.IssuerRef.Name != "t-hastate-raft-ca" || crt.Spec.IssuerRef.Kind != "Issuer" {
			t.Errorf("Certificate %d issuer = %+v, want the chart's CA Issuer", i, crt.Spec.IssuerRef)
		}
	}
	checkTLSFiles(t, c, tlsVolumeFiles(volume(ss, "raft-tls")), 3)
	if !r.has("ServiceMonitor", full) {
		t.Errorf("ServiceMonitor not rendered (it needs no file)")
	}
	if r.count("PrometheusRule") != 0 || r.has("ConfigMap", full+"-dashboard") {
		t.Errorf("rules or dashboard rendered without the chart's copies: %v", r.keys())
	}
}

// values.schema.json refuses wrongly typed values before anything renders.
func TestChartSchemaRejectsWrongTypes(t *testing.T) {
	ch := loadChart(t, chartDir)
	for _, tc := range []struct{ name, values, want string }{
		{"replicas as a string", `replicas: "3"`, "/replicas"},
		{"even replicas", `replicas: 4`, "/replicas"},
		{"TLS switch as a string", `raftTLS: {enabled: "false"}`, "/raftTLS/enabled"},
		{"health check interval as a duration", `agentService: {healthCheck: {intervalSeconds: 8s}}`, "/agentService/healthCheck/intervalSeconds"},
		{"prefix without a slash", `consul: {kvPrefix: hastate}`, "/consul/kvPrefix"},
		{"unknown top-level key", `replica: 3`, "replica"},
		{"bad traffic policy", `agentService: {externalTrafficPolicy: local}`, "/agentService/externalTrafficPolicy"},
		{"CIDRs as a string", `haproxyCIDRs: 10.0.0.0/8`, "/haproxyCIDRs"},
		{"a CIDR without its length", `haproxyCIDRs: [10.0.0.1]`, "/haproxyCIDRs/0"},
		{"the removed generated CA", `raftTLS: {generated: {caValidityDays: 10}}`, "generated"},
		{"a partition below 0", `updateStrategy: {partition: -1}`, "/updateStrategy/partition"},
		{"an unknown update strategy", `updateStrategy: {type: Recreate}`, "/updateStrategy/type"},
		{"a health check port outside the node ports", `agentService: {healthCheckNodePort: 8080}`, "/agentService/healthCheckNodePort"},
		{"ramp duration as a number", `ramp: {duration: 300}`, "/ramp/duration"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := renderValues(ch, values(t, tc.values))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("render with %s: err = %v, want a schema error naming %s", tc.values, err, tc.want)
			}
		})
	}
}

func checkPorts(t *testing.T, c *corev1.Container) {
	t.Helper()
	want := map[string]int32{"agent": 9777, "http": 9778, "raft": 9779}
	if len(c.Ports) != len(want) {
		t.Errorf("container ports = %+v", c.Ports)
	}
	for _, p := range c.Ports {
		if want[p.Name] != p.ContainerPort {
			t.Errorf("container port %s = %d, want %d", p.Name, p.ContainerPort, want[p.Name])
		}
	}
}

func checkSecurityContext(t *testing.T, ss *appsv1.StatefulSet, c *corev1.Container) {
	t.Helper()
	ps := ss.Spec.Template.Spec.SecurityContext
	if ps == nil || ps.RunAsNonRoot == nil || !*ps.RunAsNonRoot || ps.RunAsUser == nil || *ps.RunAsUser != 65532 ||
		ps.SeccompProfile == nil || ps.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod securityContext = %+v, want non-root 65532 and seccomp RuntimeDefault", ps)
	}
	sc := c.SecurityContext
	if sc == nil {
		t.Fatal("no container securityContext")
	}
	if sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Errorf("runAsNonRoot not true")
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("readOnlyRootFilesystem not true")
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("allowPrivilegeEscalation not false")
	}
	if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) != 0 {
		t.Errorf("capabilities = %+v, want drop [ALL] and nothing added", sc.Capabilities)
	}
	if sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("container seccompProfile = %+v, want RuntimeDefault", sc.SeccompProfile)
	}
}

type agentWant struct {
	etp        corev1.ServiceExternalTrafficPolicy
	ip, subnet string
	global     bool
}

func checkServices(t *testing.T, r *Rendered, want agentWant) {
	t.Helper()
	h := r.get(t, "Service", headless).(*corev1.Service)
	if h.Spec.ClusterIP != "None" || !h.Spec.PublishNotReadyAddresses {
		t.Errorf("headless Service: clusterIP %q, publishNotReadyAddresses %v; want None and true", h.Spec.ClusterIP, h.Spec.PublishNotReadyAddresses)
	}
	if len(h.Spec.Ports) != 1 || h.Spec.Ports[0].Port != 9779 {
		t.Errorf("headless Service ports = %+v, want raft 9779", h.Spec.Ports)
	}

	a := r.get(t, "Service", agentSvc).(*corev1.Service)
	if a.Spec.Type != corev1.ServiceTypeLoadBalancer {
		t.Errorf("agent Service type = %q, want LoadBalancer", a.Spec.Type)
	}
	if len(a.Spec.Ports) != 1 || a.Spec.Ports[0].Port != 9777 || a.Spec.Ports[0].Protocol != corev1.ProtocolTCP {
		t.Errorf("agent Service ports = %+v, want only 9777/TCP", a.Spec.Ports)
	}
	if got := a.Annotations["networking.gke.io/load-balancer-type"]; got != "Internal" {
		t.Errorf("agent Service load-balancer-type = %q, want Internal", got)
	}
	if got, ok := a.Annotations["networking.gke.io/internal-load-balancer-allow-global-access"]; want.global != (ok && got == "true") {
		t.Errorf("global access annotation = %q (%v), want %v", got, ok, want.global)
	}
	if got := a.Annotations["networking.gke.io/internal-load-balancer-subnet"]; got != want.subnet {
		t.Errorf("subnet annotation = %q, want %q", got, want.subnet)
	}
	// No ClientIP affinity: it would pin HAProxy nodes to a replica that
	// withholds (values.yaml, docs/deploy.md).
	if a.Spec.SessionAffinity != "" && a.Spec.SessionAffinity != corev1.ServiceAffinityNone {
		t.Errorf("agent Service sessionAffinity = %q, want none", a.Spec.SessionAffinity)
	}
	if a.Spec.ExternalTrafficPolicy != want.etp {
		t.Errorf("externalTrafficPolicy = %q, want %q", a.Spec.ExternalTrafficPolicy, want.etp)
	}
	if a.Spec.LoadBalancerIP != want.ip {
		t.Errorf("loadBalancerIP = %q, want %q", a.Spec.LoadBalancerIP, want.ip)
	}

	hs := r.get(t, "Service", httpSvc).(*corev1.Service)
	if hs.Spec.Type != corev1.ServiceTypeClusterIP || len(hs.Spec.Ports) != 1 || hs.Spec.Ports[0].Port != 9778 {
		t.Errorf("HTTP Service = %s %+v, want ClusterIP with 9778 only", hs.Spec.Type, hs.Spec.Ports)
	}
	if n := r.count("Service"); n != 3 {
		t.Errorf("%d Services, want 3 (headless, agent, http)", n)
	}
}

func checkNetworkPolicy(t *testing.T, r *Rendered, ss *appsv1.StatefulSet, cidrs, namespaces []string) {
	t.Helper()
	np := r.get(t, "NetworkPolicy", full).(*networkingv1.NetworkPolicy)
	if !selects(np.Spec.PodSelector.MatchLabels, ss.Spec.Template.Labels) {
		t.Errorf("NetworkPolicy selects %v, not the pods %v", np.Spec.PodSelector.MatchLabels, ss.Spec.Template.Labels)
	}
	if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) {
		t.Errorf("policyTypes = %v, want [Ingress]", np.Spec.PolicyTypes)
	}
	byPort := map[int]networkingv1.NetworkPolicyIngressRule{}
	for _, rule := range np.Spec.Ingress {
		if len(rule.Ports) != 1 || rule.Ports[0].Port == nil {
			t.Fatalf("ingress rule %+v: want exactly one port", rule)
		}
		if len(rule.From) == 0 {
			t.Errorf("ingress rule for port %s has no from: it would allow everyone", rule.Ports[0].Port)
		}
		byPort[rule.Ports[0].Port.IntValue()] = rule
	}
	if len(byPort) != 3 {
		t.Fatalf("ingress rules for ports %v, want 9777, 9778, 9779", byPort)
	}
	raft := byPort[9779].From
	if len(raft) != 1 || raft[0].PodSelector == nil || raft[0].NamespaceSelector != nil || raft[0].IPBlock != nil ||
		!selects(raft[0].PodSelector.MatchLabels, ss.Spec.Template.Labels) {
		t.Errorf("raft rule from = %+v, want only the StatefulSet's pods", raft)
	}
	var gotNS []string
	for _, f := range byPort[9778].From {
		if f.NamespaceSelector == nil || f.PodSelector != nil || f.IPBlock != nil {
			t.Errorf("HTTP rule peer %+v, want a namespaceSelector only", f)
			continue
		}
		gotNS = append(gotNS, f.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"])
	}
	if !slices.Equal(gotNS, namespaces) {
		t.Errorf("HTTP allowed from namespaces %v, want %v", gotNS, namespaces)
	}
	var gotCIDR []string
	var testPods int
	for _, f := range byPort[9777].From {
		switch {
		case f.IPBlock != nil && f.PodSelector == nil && f.NamespaceSelector == nil:
			gotCIDR = append(gotCIDR, f.IPBlock.CIDR)
		case f.IPBlock == nil && f.PodSelector != nil && f.NamespaceSelector == nil &&
			f.PodSelector.MatchLabels["app.kubernetes.io/component"] == "helm-test" && !selects(f.PodSelector.MatchLabels, ss.Spec.Template.Labels):
			testPods++ // the `helm test` pod, not a replica's labels
		default:
			t.Errorf("agent rule peer %+v, want an ipBlock or the helm test pod", f)
		}
	}
	if testPods != 1 {
		t.Errorf("agent rule admits the helm test pod %d times, want once", testPods)
	}
	if !slices.Equal(gotCIDR, cidrs) {
		t.Errorf("agent port allowed from %v, want %v", gotCIDR, cidrs)
	}
}

// checkChartCA: with cert-manager and no issuer given, a self-signed root
// makes the cluster's own CA Certificate, a CA Issuer signs one Certificate
// per replica with it, for server and client auth, named as the peers dial
// it; no certificate or key is in the manifest itself.
func checkChartCA(t *testing.T, r *Rendered) {
	t.Helper()
	root := r.get(t, "Issuer", "t-hastate-raft-selfsigned").(*issuer)
	caIss := r.get(t, "Issuer", "t-hastate-raft-ca").(*issuer)
	caCrt := r.get(t, "Certificate", "t-hastate-raft-ca").(*certificate)
	if root.Spec.SelfSigned == nil || caIss.Spec.CA == nil || caIss.Spec.CA.SecretName != caCrt.Spec.SecretName || !caCrt.Spec.IsCA {
		t.Errorf("chart CA chain wrong: root %+v, CA issuer %+v, CA cert %+v", root.Spec, caIss.Spec, caCrt.Spec)
	}
	// A renewal of the CA with a new key would be a CA rotation that every
	// replica's certificate fails, one Secret at a time.
	if caCrt.Spec.PrivateKey.RotationPolicy != "Never" {
		t.Errorf("the chart's CA Certificate rotationPolicy = %q, want Never (its renewal keeps the key)", caCrt.Spec.PrivateKey.RotationPolicy)
	}
	ss, _ := statefulSet(t, r)
	for i := range int(*ss.Spec.Replicas) {
		crt := r.get(t, "Certificate", fmt.Sprintf("t-hastate-raft-%d", i)).(*certificate)
		host := fmt.Sprintf("t-hastate-%d.t-hastate.ops.svc", i)
		if crt.Spec.IssuerRef.Name != "t-hastate-raft-ca" || crt.Spec.IssuerRef.Kind != "Issuer" || !slices.Contains(crt.Spec.DNSNames, host) {
			t.Errorf("Certificate %d = %+v, want SAN %s from the chart's CA Issuer", i, crt.Spec, host)
		}
		if !slices.Contains(crt.Spec.Usages, "server auth") || !slices.Contains(crt.Spec.Usages, "client auth") {
			t.Errorf("Certificate %d usages = %v, want server and client auth", i, crt.Spec.Usages)
		}
	}
	for _, pemType := range []string{"BEGIN CERTIFICATE", "PRIVATE KEY"} {
		if strings.Contains(r.Manifest, pemType) {
			t.Errorf("the manifest holds a %q block: no certificate or key may be rendered (every release revision would store it)", pemType)
		}
	}
}

// tlsVolumeFiles lists the file names the raft-tls volume puts in place.
func tlsVolumeFiles(v *corev1.Volume) []string {
	var files []string
	if v == nil {
		return nil
	}
	if v.Secret != nil {
		for _, it := range v.Secret.Items {
			files = append(files, it.Path)
		}
	}
	if v.Projected != nil {
		for _, s := range v.Projected.Sources {
			if s.Secret != nil {
				for _, it := range s.Secret.Items {
					files = append(files, it.Path)
				}
			}
			if s.ConfigMap != nil {
				for _, it := range s.ConfigMap.Items {
					files = append(files, it.Path)
				}
			}
		}
	}
	return files
}

// checkTLSFiles: every replica finds the files its --raft-tls-* flags name.
func checkTLSFiles(t *testing.T, c *corev1.Container, files []string, n int) {
	t.Helper()
	m := mount(c, "raft-tls")
	if m == nil || !m.ReadOnly {
		t.Fatalf("raft-tls mount = %+v, want read-only", m)
	}
	for i := range n {
		pod := fmt.Sprintf("t-hastate-%d", i)
		for _, f := range []string{"raft-tls-cert", "raft-tls-key", "raft-tls-ca"} {
			v, _ := flag(c.Args, f)
			v = strings.ReplaceAll(v, "$(POD_NAME)", pod)
			name, ok := strings.CutPrefix(v, m.MountPath+"/")
			if !ok || !slices.Contains(files, name) {
				t.Errorf("replica %s: --%s=%s is not a file of the mounted volume (%s: %v)", pod, f, v, m.MountPath, files)
			}
		}
	}
}

// selects reports whether selector labels all match the pod's.
func selects(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

const sampleAlerts = `# Sample rules for the test.
groups:
  - name: hastate
    rules:
      - alert: HastateRaftTLSDisabled
        expr: hastate_raft_tls_enabled == 0
        for: 10m
        labels: {severity: warning}
        annotations:
          summary: "raft TLS is off on {{ $labels.pod }}"
`

const sampleDashboard = `{"title": "hastate", "panels": [], "schemaVersion": 39}
`

func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}
