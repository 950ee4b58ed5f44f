package deploytest

import (
	"fmt"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"helm.sh/helm/v3/pkg/chartutil"
	networkingv1 "k8s.io/api/networking/v1"
	"sigs.k8s.io/yaml"
)

// ingressFrom returns the peers the NetworkPolicy admits on port.
func ingressFrom(t *testing.T, r *Rendered, port int) []networkingv1.NetworkPolicyPeer {
	t.Helper()
	np := r.get(t, "NetworkPolicy", full).(*networkingv1.NetworkPolicy)
	var out []networkingv1.NetworkPolicyPeer
	for _, in := range np.Spec.Ingress {
		if len(in.Ports) == 1 && in.Ports[0].Port.IntValue() == port {
			out = append(out, in.From...)
		}
	}
	return out
}

// agentRuleCIDRs returns the ipBlock CIDRs the NetworkPolicy admits on 9777.
func agentRuleCIDRs(t *testing.T, r *Rendered) []string {
	t.Helper()
	var out []string
	for _, f := range ingressFrom(t, r, 9777) {
		if f.IPBlock != nil {
			out = append(out, f.IPBlock.CIDR)
		}
	}
	return out
}

// httpRuleNamespaces returns the namespaces the NetworkPolicy admits on 9778.
func httpRuleNamespaces(t *testing.T, r *Rendered) []string {
	t.Helper()
	var out []string
	for _, f := range ingressFrom(t, r, 9778) {
		if f.NamespaceSelector != nil {
			out = append(out, f.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"])
		}
	}
	return out
}

// externalTrafficPolicy Cluster makes every agent check arrive from a
// node's address: with the NetworkPolicy admitting only haproxyCIDRs every
// check would be dropped. The render fails naming the ways out; with the
// node CIDRs given, the policy admits them too.
func TestChartClusterTrafficPolicyNeedsNodeCIDRs(t *testing.T) {
	ch := loadChart(t, chartDir)
	_, _, err := renderValues(ch, values(t, requiredValues+`agentService: {externalTrafficPolicy: Cluster}`))
	if err == nil || !strings.Contains(err.Error(), "networkPolicy.agentNodeCIDRs") || !strings.Contains(err.Error(), "every agent check would be dropped") {
		t.Fatalf("Cluster with the NetworkPolicy and no node CIDRs: err %v, want a refusal naming networkPolicy.agentNodeCIDRs", err)
	}
	r := render(t, ch, values(t, `{agentService: {externalTrafficPolicy: Cluster}, networkPolicy: {agentNodeCIDRs: [10.128.0.0/20]}}`))
	if got := agentRuleCIDRs(t, r); !slices.Equal(got, []string{"10.20.0.0/16", "10.128.0.0/20"}) {
		t.Errorf("agent rule admits %v, want haproxyCIDRs and the node CIDRs", got)
	}
	// Local (the default) admits haproxyCIDRs only, node CIDRs or not.
	r = render(t, ch, values(t, `{networkPolicy: {agentNodeCIDRs: [10.128.0.0/20]}}`))
	if got := agentRuleCIDRs(t, r); !slices.Equal(got, []string{"10.20.0.0/16"}) {
		t.Errorf("Local: agent rule admits %v, want haproxyCIDRs only", got)
	}
	// Without the NetworkPolicy, Cluster renders.
	render(t, ch, values(t, `{agentService: {externalTrafficPolicy: Cluster}, networkPolicy: {enabled: false}}`))
}

// Managed Service for Prometheus: with a PodMonitoring, its collectors'
// namespaces reach 9778; its rule evaluator gets the same alert rules as
// the PrometheusRule, from the one file.
func TestChartManagedPrometheus(t *testing.T) {
	ch := loadChart(t, chartDir)
	r := render(t, ch, values(t, `{metrics: {podMonitoring: {enabled: true}, gmpRules: {enabled: true}, prometheusRule: {enabled: true}}}`))
	if got := httpRuleNamespaces(t, r); !slices.Equal(got, []string{"monitoring", "gmp-system", "gke-gmp-system"}) {
		t.Errorf("HTTP rule admits namespaces %v, want monitoring, gmp-system, gke-gmp-system", got)
	}
	gmp := r.get(t, "Rules", full).(*gmpRules)
	pr := r.get(t, "PrometheusRule", full).(*monitoringv1.PrometheusRule)
	if len(gmp.Spec.Groups) == 0 || len(gmp.Spec.Groups) != len(pr.Spec.Groups) {
		t.Fatalf("Rules has %d groups, PrometheusRule %d", len(gmp.Spec.Groups), len(pr.Spec.Groups))
	}
	// The same rules, rule by rule.
	for i, g := range pr.Spec.Groups {
		gg := gmp.Spec.Groups[i]
		if gg.Name != g.Name || len(gg.Rules) != len(g.Rules) {
			t.Fatalf("group %d: Rules %q with %d rules, PrometheusRule %q with %d", i, gg.Name, len(gg.Rules), g.Name, len(g.Rules))
		}
		for j, rule := range g.Rules {
			got := gg.Rules[j]
			if got.Alert != rule.Alert || got.Record != rule.Record || got.Expr != rule.Expr.String() || !reflect.DeepEqual(got.Annotations, rule.Annotations) {
				t.Errorf("group %s rule %d differs:\nRules: %+v\nPrometheusRule: %+v", g.Name, j, got, rule)
			}
		}
	}
	// The file the rules come from is deploy/prometheus/alerts.yaml's copy
	// (TestChartFilesMatchSources): count its alerts.
	var src struct {
		Groups []struct {
			Rules []map[string]any `json:"rules"`
		} `json:"groups"`
	}
	b, err := os.ReadFile(chartDir + "/files/alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &src); err != nil {
		t.Fatal(err)
	}
	n, m := 0, 0
	for _, g := range src.Groups {
		n += len(g.Rules)
	}
	for _, g := range gmp.Spec.Groups {
		m += len(g.Rules)
	}
	if n != m {
		t.Errorf("Rules carries %d rules, files/alerts.yaml has %d", m, n)
	}
	// Without a PodMonitoring, the monitoring namespace only.
	r = render(t, ch, nil)
	if got := httpRuleNamespaces(t, r); !slices.Equal(got, []string{"monitoring"}) {
		t.Errorf("HTTP rule admits namespaces %v without PodMonitoring", got)
	}
}

// A CRD the cluster does not serve fails the render naming it and what to
// do, as consul-k8s checks its capabilities, instead of an apply failing
// half-way.
func TestChartCapabilityChecks(t *testing.T) {
	ch := loadChart(t, chartDir)
	for _, c := range []struct{ vals, api string }{
		{`{}`, "cert-manager.io/v1"},
		{`{raftTLS: {existingSecret: s}, metrics: {serviceMonitor: {enabled: true}}}`, "monitoring.coreos.com/v1"},
		{`{raftTLS: {existingSecret: s}, metrics: {prometheusRule: {enabled: true}}}`, "monitoring.coreos.com/v1"},
		{`{raftTLS: {existingSecret: s}, metrics: {podMonitoring: {enabled: true}}}`, "monitoring.googleapis.com/v1"},
		{`{raftTLS: {existingSecret: s}, metrics: {gmpRules: {enabled: true}}}`, "monitoring.googleapis.com/v1"},
	} {
		inst := withoutAPI(c.api)
		vals := values(t, requiredValues)
		for k, v := range values(t, c.vals) {
			vals[k] = v
		}
		_, err := renderFor(ch, vals, kubeVersion, inst)
		if err == nil || !strings.Contains(err.Error(), "needs the API "+c.api) || !strings.Contains(err.Error(), "--api-versions "+c.api) {
			t.Errorf("values %s without %s: err %v, want a refusal naming the API and --api-versions", c.vals, c.api, err)
		}
		if _, err := renderFor(ch, vals, kubeVersion, extraAPIs); err != nil {
			t.Errorf("values %s with every API: %v", c.vals, err)
		}
	}
}

func withoutAPI(api string) chartutil.VersionSet {
	var out chartutil.VersionSet
	for _, v := range extraAPIs {
		if v != api {
			out = append(out, v)
		}
	}
	return out
}

// extraVolumes and extraVolumeMounts reach the pod and the container
// (Consul over HTTPS with a client certificate needs them);
// minReadySeconds the StatefulSet.
func TestChartExtraVolumesAndMinReady(t *testing.T) {
	r := render(t, loadChart(t, chartDir), values(t, `
extraVolumes: [{name: consul-client, secret: {secretName: consul-client-tls}}]
extraVolumeMounts: [{name: consul-client, mountPath: /etc/hastate/consul-client, readOnly: true}]
minReadySeconds: 15`))
	ss, c := statefulSet(t, r)
	v := volume(ss, "consul-client")
	if v == nil || v.Secret == nil || v.Secret.SecretName != "consul-client-tls" {
		t.Errorf("extra volume %+v", v)
	}
	m := mount(c, "consul-client")
	if m == nil || m.MountPath != "/etc/hastate/consul-client" || !m.ReadOnly {
		t.Errorf("extra mount %+v", m)
	}
	if ss.Spec.MinReadySeconds != 15 {
		t.Errorf("minReadySeconds %d, want 15", ss.Spec.MinReadySeconds)
	}
	ss, _ = statefulSet(t, render(t, loadChart(t, chartDir), nil))
	if ss.Spec.MinReadySeconds != 10 {
		t.Errorf("default minReadySeconds %d, want 10", ss.Spec.MinReadySeconds)
	}
}

// Per-pod keys: with raftTLS.certManager.csiDriver each pod mounts one
// csi-driver volume that cert-manager fills with that pod's own key and
// certificate (for its raft names), not every replica's Secret; no
// per-replica Certificate is rendered. Against a cluster without the
// driver the render fails naming it. Moving a running release from
// per-replica Certificates to the driver is the same issuer, the same CA:
// no CA move, an ordinary rollout.
func TestChartPerPodKeys(t *testing.T) {
	ch := loadChart(t, chartDir)
	r := render(t, ch, values(t, `raftTLS: {certManager: {enabled: true, csiDriver: {enabled: true}}}`))
	ss, c := statefulSet(t, r)
	for i := range 3 {
		if r.has("Certificate", fmt.Sprintf("%s-raft-%d", full, i)) {
			t.Errorf("Certificate %s-raft-%d rendered with the csi-driver", full, i)
		}
	}
	if !r.has("Issuer", full+"-raft-ca") {
		t.Errorf("the chart's CA Issuer is gone with the csi-driver: %v", r.keys())
	}
	v := volume(ss, "raft-tls")
	if v == nil || v.CSI == nil || v.CSI.Driver != "csi.cert-manager.io" || v.Projected != nil {
		t.Fatalf("raft-tls volume %+v: want one csi.cert-manager.io volume", v)
	}
	attr := v.CSI.VolumeAttributes
	want := map[string]string{
		"csi.cert-manager.io/issuer-name": full + "-raft-ca",
		"csi.cert-manager.io/issuer-kind": "Issuer",
		"csi.cert-manager.io/common-name": "${POD_NAME}." + full + ".${POD_NAMESPACE}.svc",
		"csi.cert-manager.io/key-usages":  "server auth,client auth,digital signature",
		"csi.cert-manager.io/fs-group":    "65532",
	}
	for k, w := range want {
		if attr[k] != w {
			t.Errorf("volume attribute %s = %q, want %q", k, attr[k], w)
		}
	}
	// The pinned peer name (the host of --peers) is the first SAN.
	if names := strings.Split(attr["csi.cert-manager.io/dns-names"], ","); names[0] != "${POD_NAME}."+full+".${POD_NAMESPACE}.svc" {
		t.Errorf("dns-names %v: the first must be the raft host of --peers", names)
	}
	for _, f := range []string{"raft-tls-cert", "raft-tls-key", "raft-tls-ca"} {
		got, _ := flag(c.Args, f)
		if !strings.HasPrefix(got, "/etc/hastate/raft-tls/") || strings.Contains(got, "POD_NAME") {
			t.Errorf("--%s=%s: want the csi volume's own file", f, got)
		}
	}
	for _, vol := range ss.Spec.Template.Spec.Volumes {
		if vol.Projected != nil || (vol.Secret != nil && strings.Contains(vol.Secret.SecretName, "raft")) {
			t.Errorf("volume %s still projects Secrets: %+v", vol.Name, vol)
		}
	}

	// With a trust bundle, ca.crt comes from it, mounted beside.
	r = render(t, ch, values(t, `raftTLS: {certManager: {enabled: true, csiDriver: {enabled: true}}, trustBundle: {configMap: raft-trust}}`))
	ss, c = statefulSet(t, r)
	if got, _ := flag(c.Args, "raft-tls-ca"); got != "/etc/hastate/raft-trust/ca.crt" {
		t.Errorf("--raft-tls-ca=%s with a bundle", got)
	}
	if v := volume(ss, "raft-trust"); v == nil || v.ConfigMap == nil || v.ConfigMap.Name != "raft-trust" || mount(c, "raft-trust") == nil {
		t.Errorf("raft-trust volume %+v", v)
	}

	// Against a cluster: without the driver, refused; with it, rendered.
	vals := func() map[string]any {
		v := values(t, requiredValues)
		v["raftTLS"] = values(t, `{certManager: {enabled: true, csiDriver: {enabled: true}}}`)
		return v
	}
	ns := map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": "ops"}}
	driver := map[string]any{"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver", "metadata": map[string]any{"name": "csi.cert-manager.io"}}
	_, _, err := renderIn(ch, vals(), "t", newFakeCluster(t, ns), false)
	if err == nil || !strings.Contains(err.Error(), "no CSIDriver csi.cert-manager.io") {
		t.Fatalf("csi-driver not installed: err %v, want a refusal naming it", err)
	}
	if _, _, err := renderIn(ch, vals(), "t", newFakeCluster(t, ns, driver), false); err != nil {
		t.Fatalf("csi-driver installed: %v", err)
	}
	// Not checked when told (a deployer that may not read cluster-scoped
	// objects): no lookup, no refusal.
	unchecked := vals()
	unchecked["raftTLS"].(map[string]any)["certManager"].(map[string]any)["csiDriver"].(map[string]any)["checkInstalled"] = false
	if _, _, err := renderIn(ch, unchecked, "t", newFakeCluster(t, ns), false); err != nil {
		t.Fatalf("csiDriver.checkInstalled=false: %v", err)
	}

	// A release presenting per-replica Certificates moves to the driver
	// in one ordinary rollout (same issuer), and back.
	perReplica, _, err := renderIn(ch, values(t, requiredValues), "t", nil, false)
	if err != nil {
		t.Fatal(err)
	}
	live := newFakeCluster(t, append(liveObjects(t, perReplica, nil), ns, driver)...)
	manifest, _, err := renderIn(ch, vals(), "t", live, true)
	if err != nil {
		t.Fatalf("per-replica Certificates → csi-driver: %v", err)
	}
	live = newFakeCluster(t, append(liveObjects(t, manifest, nil), ns, driver)...)
	if _, _, err := renderIn(ch, values(t, requiredValues), "t", live, true); err != nil {
		t.Fatalf("csi-driver → per-replica Certificates, not said: %v", err)
	}
}
