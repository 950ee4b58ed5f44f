package deploytest

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// The chart renders no CA, certificate or key, whatever the values: two
// renders (a GitOps tool's, without lookup) are the same, and no release
// revision stores a private key. With cert-manager (the default) the
// certificates are Certificates; with existingSecret, a Secret made
// outside the chart, mounted without any key it may hold besides the
// replicas' files; with neither, the render fails saying what to set.
func TestChartRendersNoCA(t *testing.T) {
	ch := loadChart(t, chartDir)
	for _, vals := range []string{"{}", `raftTLS: {existingSecret: raft-certs}`, `replicas: 5`} {
		a, b := render(t, ch, values(t, vals)), render(t, ch, values(t, vals))
		if a.Manifest != b.Manifest {
			t.Errorf("values %s: two renders differ", vals)
		}
		for _, pemType := range []string{"BEGIN CERTIFICATE", "PRIVATE KEY"} {
			if strings.Contains(a.Manifest, pemType) {
				t.Errorf("values %s: the manifest holds a %q block", vals, pemType)
			}
		}
		if n := a.count("Secret"); n != 0 {
			t.Errorf("values %s: %d Secrets rendered, want none", vals, n)
		}
	}

	r := render(t, ch, values(t, `raftTLS: {existingSecret: raft-certs}`))
	ss, c := statefulSet(t, r)
	if r.count("Certificate") != 0 || r.count("Issuer") != 0 {
		t.Errorf("cert-manager objects rendered with existingSecret: %v", r.keys())
	}
	v := volume(ss, "raft-tls")
	if v == nil || v.Projected == nil || len(v.Projected.Sources) != 1 || v.Projected.Sources[0].Secret == nil || v.Projected.Sources[0].Secret.Name != "raft-certs" {
		t.Fatalf("raft-tls volume = %+v, want the Secret raft-certs (projected)", v)
	}
	files := tlsVolumeFiles(v)
	if slices.Contains(files, "ca.key") || len(files) != 1+2*3 {
		t.Errorf("raft-tls items %v, want ca.crt and each replica's .crt and .key only", files)
	}
	checkTLSFiles(t, c, files, 3)
	if !strings.Contains(r.Notes, "certificates from Secret raft-certs") {
		t.Errorf("NOTES.txt does not name the Secret:\n%s", r.Notes)
	}

	_, _, err := renderValues(ch, values(t, requiredValues+`raftTLS: {certManager: {enabled: false}}`))
	if err == nil || !strings.Contains(err.Error(), "raftTLS.existingSecret") || !strings.Contains(err.Error(), "raftTLS.enabled=false") {
		t.Fatalf("TLS on without a certificate source: err %v, want a failure naming raftTLS.existingSecret and raftTLS.enabled=false", err)
	}
}

// Chart.yaml's version and appVersion are VERSION, and the image the chart
// runs without image.tag is VERSION's: a `helm upgrade` of this chart rolls
// this release's binary, nothing older. `make chart-files` stamps them.
func TestChartVersionIsVERSION(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(repoRoot, "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	version := strings.TrimSpace(string(raw))
	var meta struct {
		Version, AppVersion, KubeVersion string
	}
	b, err := os.ReadFile(filepath.Join(chartDir, "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &meta); err != nil {
		t.Fatal(err)
	}
	if meta.Version != version || meta.AppVersion != version {
		t.Fatalf("Chart.yaml version %q, appVersion %q; VERSION is %q: run `make chart-files`", meta.Version, meta.AppVersion, version)
	}
	if meta.KubeVersion == "" {
		t.Errorf("Chart.yaml has no kubeVersion")
	}
	r := render(t, loadChart(t, chartDir), nil)
	ss, c := statefulSet(t, r)
	tag := strings.ReplaceAll(version, "+", "-")
	if c.Image != "hastate:"+tag {
		t.Errorf("default image = %q, want hastate:%s (VERSION)", c.Image, tag)
	}
	if got := ss.Labels["app.kubernetes.io/version"]; got != tag {
		t.Errorf("app.kubernetes.io/version = %q, want %q", got, tag)
	}
	// An older Kubernetes is refused before anything is applied.
	if _, err := renderWithKube(loadChart(t, chartDir), values(t, requiredValues), "v1.25.0"); err == nil || !strings.Contains(err.Error(), "kubeVersion") {
		t.Errorf("render for Kubernetes 1.25: err %v, want the kubeVersion refusal", err)
	}
}

// The upgrade gate: updateStrategy.partition holds pods below it at the old
// revision (docs/deploy.md, "Upgrading pod by pod"); OnDelete holds every
// pod until it is deleted; a partition above the replicas, which would
// hold every pod without saying so, fails.
func TestChartUpgradeGate(t *testing.T) {
	ch := loadChart(t, chartDir)
	ss, _ := statefulSet(t, render(t, ch, nil))
	if u := ss.Spec.UpdateStrategy; u.Type != appsv1.RollingUpdateStatefulSetStrategyType || u.RollingUpdate == nil || deref(u.RollingUpdate.Partition) != int32(0) {
		t.Errorf("default updateStrategy = %+v, want RollingUpdate with partition 0", u)
	}
	r := render(t, ch, values(t, `updateStrategy: {partition: 2}`))
	ss, _ = statefulSet(t, r)
	if u := ss.Spec.UpdateStrategy; u.RollingUpdate == nil || deref(u.RollingUpdate.Partition) != int32(2) {
		t.Errorf("updateStrategy with partition 2 = %+v", u)
	}
	if !strings.Contains(r.Notes, "UPGRADE GATE") || !strings.Contains(r.Notes, "ordinal >= 2") {
		t.Errorf("NOTES.txt does not explain the gate:\n%s", r.Notes)
	}
	ss, _ = statefulSet(t, render(t, ch, values(t, `updateStrategy: {type: OnDelete}`)))
	if u := ss.Spec.UpdateStrategy; u.Type != appsv1.OnDeleteStatefulSetStrategyType || u.RollingUpdate != nil {
		t.Errorf("updateStrategy OnDelete = %+v", u)
	}
	_, _, err := renderValues(ch, values(t, requiredValues+`updateStrategy: {partition: 4}`))
	if err == nil || !strings.Contains(err.Error(), "updateStrategy.partition 4 is above replicas (3)") {
		t.Errorf("partition 4 of 3 replicas: err %v, want a failure saying so", err)
	}
}

// A change of what the chart holds for Consul (token, CA) changes the pod
// template, so the pods restart, through the gate; the same values keep it.
func TestChartChecksumRestartsOnConsulChange(t *testing.T) {
	ch := loadChart(t, chartDir)
	sum := func(vals string) string {
		ss, _ := statefulSet(t, render(t, ch, values(t, vals)))
		s := ss.Spec.Template.Annotations["checksum/consul"]
		if len(s) != 64 {
			t.Fatalf("checksum/consul = %q, want a sha256", s)
		}
		return s
	}
	a, a2, b := sum(`consul: {token: one}`), sum(`consul: {token: one}`), sum(`consul: {token: two}`)
	if a != a2 || a == b {
		t.Errorf("checksum/consul: token one %s, again %s, token two %s: want equal, then different", a, a2, b)
	}
	if sum(`consul: {token: one, caCert: "x"}`) == sum(`consul: {token: one, caCert: "y"}`) {
		t.Errorf("checksum/consul does not follow the Consul CA")
	}
}

// haproxyCIDRs become the agent Service's loadBalancerSourceRanges (GKE's
// firewall rule for the load balancer, the one that filters) and the
// NetworkPolicy's agent sources; a render without them fails with a message
// that says what to set and why; a pinned health check node port renders,
// and only with externalTrafficPolicy Local.
func TestChartFirewallRanges(t *testing.T) {
	ch := loadChart(t, chartDir)
	cidrs := []string{"10.20.0.0/16", "10.30.4.0/24"}
	r := render(t, ch, values(t, `
haproxyCIDRs: [10.20.0.0/16, 10.30.4.0/24]
agentService: {healthCheckNodePort: 32123}
`))
	a := r.get(t, "Service", agentSvc).(*corev1.Service)
	if !slices.Equal(a.Spec.LoadBalancerSourceRanges, cidrs) {
		t.Errorf("loadBalancerSourceRanges = %v, want %v", a.Spec.LoadBalancerSourceRanges, cidrs)
	}
	if a.Spec.HealthCheckNodePort != 32123 {
		t.Errorf("healthCheckNodePort = %d, want 32123", a.Spec.HealthCheckNodePort)
	}
	ss, _ := statefulSet(t, r)
	checkNetworkPolicy(t, r, ss, cidrs, []string{"monitoring"})

	for _, vals := range []map[string]any{values(t, tokenOnly), values(t, tokenOnly+"\nhaproxyCIDRs: []")} {
		_, _, err := renderValues(ch, vals)
		if err == nil || !strings.Contains(err.Error(), "haproxyCIDRs is empty") || !strings.Contains(err.Error(), "loadBalancerSourceRanges") {
			t.Errorf("render with haproxyCIDRs %v: err %v, want a failure naming haproxyCIDRs and what it is for", vals, err)
		}
	}
	_, _, err := renderValues(ch, values(t, requiredValues+`agentService: {externalTrafficPolicy: Cluster, healthCheckNodePort: 32123}`))
	if err == nil || !strings.Contains(err.Error(), "healthCheckNodePort is only for externalTrafficPolicy Local") {
		t.Errorf("healthCheckNodePort with Cluster: err %v, want a refusal", err)
	}
}

// Placement and resources: never two replicas on a node, three zones at
// least for the spread, memory requested as limited, GOMEMLIMIT at 90% of
// the limit, a priority class when given.
func TestChartPlacementAndResources(t *testing.T) {
	ch := loadChart(t, chartDir)
	ss, c := statefulSet(t, render(t, ch, nil))
	spec := ss.Spec.Template.Spec
	aa := spec.Affinity
	if aa == nil || aa.PodAntiAffinity == nil || len(aa.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution) != 1 {
		t.Fatalf("affinity = %+v, want one required pod anti-affinity term", aa)
	}
	term := aa.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution[0]
	if term.TopologyKey != "kubernetes.io/hostname" || !selects(term.LabelSelector.MatchLabels, ss.Spec.Template.Labels) {
		t.Errorf("anti-affinity term %+v, want the replicas' labels per hostname", term)
	}
	if z := spec.TopologySpreadConstraints[0]; z.MinDomains == nil || *z.MinDomains != 3 {
		t.Errorf("zone spread minDomains = %v, want 3", z.MinDomains)
	}
	req, lim := c.Resources.Requests.Memory(), c.Resources.Limits.Memory()
	if req.Cmp(*lim) != 0 {
		t.Errorf("memory request %s, limit %s: want equal", req, lim)
	}
	if v := envVar(c, "GOMEMLIMIT"); v == nil || v.Value != "460MiB" {
		t.Errorf("GOMEMLIMIT = %+v, want 460MiB (90%% of 512Mi)", v)
	}
	_, c = statefulSet(t, render(t, ch, values(t, `resources: {limits: {memory: 2Gi}, requests: {memory: 2Gi}}`)))
	if v := envVar(c, "GOMEMLIMIT"); v == nil || v.Value != "1843MiB" {
		t.Errorf("GOMEMLIMIT with 2Gi = %+v, want 1843MiB", v)
	}
	if _, _, err := renderValues(ch, values(t, requiredValues+`resources: {limits: {memory: 0.5Gi}}`)); err == nil || !strings.Contains(err.Error(), "GOMEMLIMIT") {
		t.Errorf("a fractional memory limit: err %v, want a refusal naming GOMEMLIMIT", err)
	}
	ss, _ = statefulSet(t, render(t, ch, values(t, `{priorityClassName: hastate-critical, podAntiAffinity: {required: false}}`)))
	if ss.Spec.Template.Spec.PriorityClassName != "hastate-critical" || ss.Spec.Template.Spec.Affinity != nil {
		t.Errorf("priorityClassName %q, affinity %+v; want hastate-critical and none", ss.Spec.Template.Spec.PriorityClassName, ss.Spec.Template.Spec.Affinity)
	}
}

// Monitoring per release: the ServiceMonitor and the PodMonitoring (GMP)
// name the job after the release, so that two releases in one namespace
// are two clusters to the alerts; the PodMonitoring selects the replicas.
func TestChartMonitoringPerRelease(t *testing.T) {
	ch := loadChart(t, chartDir)
	r := render(t, ch, values(t, `metrics: {podMonitoring: {enabled: true}}`))
	pm := r.get(t, "PodMonitoring", full).(*podMonitoring)
	ss, _ := statefulSet(t, r)
	if !selects(pm.Spec.Selector.MatchLabels, ss.Spec.Template.Labels) || len(pm.Spec.Endpoints) != 1 ||
		pm.Spec.Endpoints[0].Port != "http" || pm.Spec.Endpoints[0].Path != "/-/metrics" {
		t.Errorf("PodMonitoring spec = %+v, want the replicas' /-/metrics on port http", pm.Spec)
	}
	r = render(t, ch, values(t, `metrics: {job: hastate-gstg, podMonitoring: {enabled: true}}`))
	if !r.has("PodMonitoring", "hastate-gstg") {
		t.Errorf("metrics.job does not name the PodMonitoring (GMP's job): %v", r.keys())
	}
}

// `helm test`: a hook pod that asks the agent Service for one answer with
// hastate probe (exit 1 without one); the NetworkPolicy lets it in; the
// replicas' Services and PDB do not count it.
func TestChartHelmTest(t *testing.T) {
	r := render(t, loadChart(t, chartDir), nil)
	key := "Pod/t-hastate-test-agent-check"
	if ev := r.hooks[key]; !slices.Equal(ev, []string{"test"}) {
		t.Fatalf("%s hook events %v, want [test]", key, ev)
	}
	pod := r.get(t, "Pod", "t-hastate-test-agent-check").(*corev1.Pod)
	c := pod.Spec.Containers[0]
	if !slices.Equal(c.Args[:2], []string{"probe", "helm-test/probe"}) || !slices.Contains(c.Args, "--addr=t-hastate-agent.ops.svc:9777") {
		t.Errorf("test pod args %v, want hastate probe through the agent Service", c.Args)
	}
	ss, sc := statefulSet(t, r)
	if c.Image != sc.Image || pod.Spec.RestartPolicy != corev1.RestartPolicyNever {
		t.Errorf("test pod image %q restart %q, want the replicas' image and Never", c.Image, pod.Spec.RestartPolicy)
	}
	if selects(ss.Spec.Selector.MatchLabels, pod.Labels) {
		t.Errorf("the test pod's labels %v are selected by the StatefulSet's selector", pod.Labels)
	}
	checkNetworkPolicy(t, r, ss, []string{"10.20.0.0/16"}, []string{"monitoring"})
}

// The image's base is pinned by digest, the same in the Dockerfile and the
// Makefile (`make image`'s BASE), so that a build takes the reviewed base
// and not whatever the tag points at that day.
func TestImageBasePinnedByDigest(t *testing.T) {
	pinned := regexp.MustCompile(`^gcr\.io/distroless/static-debian12:nonroot@sha256:[0-9a-f]{64}$`)
	read := func(name, re string) string {
		b, err := os.ReadFile(filepath.Join(repoRoot, name))
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(re).FindSubmatch(b)
		if m == nil {
			t.Fatalf("%s: no default base found (%s)", name, re)
		}
		return string(m[1])
	}
	docker := read("Dockerfile", `(?m)^ARG BASE=(\S+)$`)
	mk := read("Makefile", `(?m)^BASE\s+\?=\s*(\S+)$`)
	if !pinned.MatchString(docker) {
		t.Errorf("Dockerfile's default BASE %q is not pinned by digest", docker)
	}
	if docker != mk {
		t.Errorf("Dockerfile's BASE %q and the Makefile's %q differ", docker, mk)
	}
}
