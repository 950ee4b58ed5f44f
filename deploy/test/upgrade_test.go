package deploytest

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// The values file a team running the previous release has: what its
// docs/deploy.md told them to set. Release "hastate", as the docs install it.
const previousValues = `
consul:
  address: consul-server.consul.svc:8500
  existingSecret: {name: hastate-consul}
networkPolicy:
  agentCIDRs: [10.20.0.0/16]
agentService:
  loadBalancerIP: 10.0.0.50
`

// The health check node port Kubernetes allocated to the previous
// release's agent Service (it did not pin one).
const allocatedHealthCheckNodePort = 31822

// upgradeStep is one refusal of a `helm upgrade` with the previous
// release's values, and what docs/deploy.md ("Upgrading from 0.14.0")
// says to do about it.
type upgradeStep struct {
	refusal string                 // in the render's error
	fix     func(v map[string]any) // the values change the message asks for
}

// The refusals a user meets, in order, upgrading the previous release in
// place with its values file, and the change each one asks for.
var upgradeSteps = []upgradeStep{
	{"networkPolicy.agentCIDRs (chart 0.14.0) is now haproxyCIDRs", func(v map[string]any) {
		np := v["networkPolicy"].(map[string]any)
		v["haproxyCIDRs"] = np["agentCIDRs"]
		delete(np, "agentCIDRs")
	}},
	{"its pods present those of Secret hastate-raft-tls (made by chart 0.14.0, kept on upgrade)", func(v map[string]any) {
		v["raftTLS"] = map[string]any{"existingSecret": "hastate-raft-tls"}
	}},
}

// previousRelease renders the previous release's chart (from this
// repository's history) with previousValues, as `helm install` did, and
// returns its render and the objects the cluster holds after it: Kubernetes
// allocated the agent Service's health check node port.
func previousRelease(t *testing.T) (version string, old *Rendered, live *fakeCluster) {
	t.Helper()
	version, dir := previousChart(t)
	ch := loadChart(t, dir)
	manifest, notes, err := renderIn(ch, values(t, previousValues), "hastate", nil, false)
	if err != nil {
		t.Fatalf("render the %s chart: %v", version, err)
	}
	old = renderedIn(t, manifest, notes)
	objs := liveObjects(t, manifest, func(o map[string]any) {
		if o["kind"] == "Service" && o["metadata"].(map[string]any)["name"] == "hastate-agent" {
			o["spec"].(map[string]any)["healthCheckNodePort"] = int64(allocatedHealthCheckNodePort)
		}
	})
	return version, old, newFakeCluster(t, objs...)
}

// The upgrade as a user runs it: the previous release's chart rendered
// with its values file, then `helm upgrade` of this chart with the same
// file against the cluster it made. Each refusal names what to set; the
// test applies exactly that and renders again, until the chart renders.
// The Secret it ends up naming is the one the previous chart made.
func TestChartUpgradeFromPreviousRelease(t *testing.T) {
	version, old, live := previousRelease(t)
	if !old.has("Secret", "hastate-raft-tls") {
		t.Fatalf("the %s chart made no Secret hastate-raft-tls for release hastate: have %v", version, old.keys())
	}
	ch := loadChart(t, chartDir)
	vals := values(t, previousValues)
	for i, step := range upgradeSteps {
		_, _, err := renderIn(ch, vals, "hastate", live, true)
		if err == nil || !strings.Contains(err.Error(), step.refusal) {
			t.Fatalf("step %d: helm upgrade with %s: err %v, want a refusal saying %q", i+1, mustYAML(t, vals), err, step.refusal)
		}
		t.Logf("step %d: refused: %s", i+1, err)
		step.fix(vals)
	}
	manifest, notes, err := renderIn(ch, vals, "hastate", live, true)
	if err != nil {
		t.Fatalf("after the documented steps, helm upgrade with\n%s: %v", mustYAML(t, vals), err)
	}
	t.Logf("renders with the previous values file plus:\n%s", mustYAML(t, vals))
	r := renderedIn(t, manifest, notes)

	// The certificates the pods read are the ones the previous chart
	// generated: every key the new pods mount is in that Secret.
	oldSecret := old.get(t, "Secret", "hastate-raft-tls").(*corev1.Secret)
	ss := r.get(t, "StatefulSet", "hastate").(*appsv1.StatefulSet)
	v := volume(ss, "raft-tls")
	if v == nil || v.Projected == nil {
		t.Fatalf("raft-tls volume %+v", v)
	}
	for _, src := range v.Projected.Sources {
		if src.Secret == nil || src.Secret.Name != "hastate-raft-tls" {
			t.Errorf("raft-tls source %+v: want only the Secret hastate-raft-tls", src)
			continue
		}
		for _, it := range src.Secret.Items {
			if _, ok := oldSecret.Data[it.Key]; !ok {
				t.Errorf("the pods mount key %q, which the %s chart's Secret does not hold (it has %v)", it.Key, version, slices.Sorted(maps.Keys(oldSecret.Data)))
			}
			if it.Key == "ca.key" {
				t.Errorf("the CA's key is mounted")
			}
		}
	}
	if r.count("Certificate") != 0 || r.count("Issuer") != 0 {
		t.Errorf("cert-manager objects rendered while keeping the Secret: a new CA nobody trusts")
	}
}

// What changes between the previous release's render and this one for the
// same values file (plus what the upgrade asks), object by object: each
// change is safe for a running cluster, or the upgrade refuses it (the
// refusals are TestChartUpgradeFromPreviousRelease's). The log is the
// comparison the upgrade section of docs/deploy.md walks.
func TestChartUpgradeComparison(t *testing.T) {
	version, old, live := previousRelease(t)
	ch := loadChart(t, chartDir)
	vals := upgradedValues(t)
	manifest, notes, err := renderIn(ch, vals, "hastate", live, true)
	if err != nil {
		t.Fatal(err)
	}
	r := renderedIn(t, manifest, notes)
	var report []string
	say := func(format string, a ...any) { report = append(report, fmt.Sprintf(format, a...)) }

	// Objects added and removed.
	for _, k := range slices.Sorted(maps.Keys(old.objects)) {
		if _, ok := r.objects[k]; ok {
			continue
		}
		switch k {
		case "Secret/hastate-raft-tls":
			s := old.objects[k].(*corev1.Secret)
			if s.Annotations["helm.sh/resource-policy"] != "keep" {
				t.Errorf("%s leaves the chart without helm.sh/resource-policy: keep: Helm would delete the CA under the running cluster", k)
			}
			say("removed %s: safe, the %s chart annotated it helm.sh/resource-policy=keep, so Helm keeps it, and the pods mount it (raftTLS.existingSecret)", k, version)
		default:
			t.Errorf("%s is in the %s render and not in this one: say whether Helm deleting it is safe", k, version)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(r.objects)) {
		if _, ok := old.objects[k]; !ok {
			say("added %s", k)
		}
	}

	// The StatefulSet: Kubernetes refuses a change of anything but the pod
	// template, replicas, updateStrategy, minReadySeconds,
	// persistentVolumeClaimRetentionPolicy and ordinals
	// (ValidateStatefulSetUpdate): such a change fails the upgrade.
	oss := old.get(t, "StatefulSet", "hastate").(*appsv1.StatefulSet)
	nss := r.get(t, "StatefulSet", "hastate").(*appsv1.StatefulSet)
	immutable := map[string][2]any{
		"selector":             {oss.Spec.Selector, nss.Spec.Selector},
		"serviceName":          {oss.Spec.ServiceName, nss.Spec.ServiceName},
		"podManagementPolicy":  {oss.Spec.PodManagementPolicy, nss.Spec.PodManagementPolicy},
		"volumeClaimTemplates": {claimSpecs(oss), claimSpecs(nss)},
	}
	for _, f := range slices.Sorted(maps.Keys(immutable)) {
		if !reflect.DeepEqual(immutable[f][0], immutable[f][1]) {
			t.Errorf("StatefulSet %s changes (Kubernetes refuses it, the upgrade fails): %s → %s", f, mustYAML(t, immutable[f][0]), mustYAML(t, immutable[f][1]))
		} else {
			say("same StatefulSet spec.%s (immutable)", f)
		}
	}
	// Every other field of the spec that changes must be one Kubernetes
	// updates in place.
	mutable := map[string]bool{"spec.template": true, "spec.replicas": true, "spec.updateStrategy": true,
		"spec.minReadySeconds": true, "spec.persistentVolumeClaimRetentionPolicy": true, "spec.ordinals": true}
	for _, f := range specFields(t, oss, nss) {
		if !mutable[f] {
			t.Errorf("StatefulSet %s changes: Kubernetes refuses it (ValidateStatefulSetUpdate), the upgrade fails", f)
		} else {
			say("changed StatefulSet %s: updated in place (%s)", f, map[bool]string{true: "the pods roll, one at a time, highest ordinal first", false: "no pod restarts"}[f == "spec.template"])
		}
	}
	if !reflect.DeepEqual(oss.Spec.Selector.MatchLabels, nss.Spec.Template.Labels) && !selects(nss.Spec.Selector.MatchLabels, nss.Spec.Template.Labels) {
		t.Errorf("the new pod template's labels %v do not match the selector", nss.Spec.Template.Labels)
	}

	// What raft sees: the same members at the same addresses, the same
	// data directory on the same claim, the same certificate files.
	oc, nc := oss.Spec.Template.Spec.Containers[0], nss.Spec.Template.Spec.Containers[0]
	for _, f := range []string{"node-id", "peers", "raft-advertise", "raft-addr", "data-dir", "kv-prefix", "raft-tls-cert", "raft-tls-key", "raft-tls-ca"} {
		ov, _ := flag(oc.Args, f)
		nv, _ := flag(nc.Args, f)
		if ov != nv {
			t.Errorf("--%s changes: %q → %q: the rolled pod would not be the same raft member", f, ov, nv)
		} else {
			say("same --%s=%s", f, nv)
		}
	}
	if om, nm := mount(&oc, "data"), mount(&nc, "data"); om == nil || nm == nil || om.MountPath != nm.MountPath {
		t.Errorf("data mount %+v → %+v", om, nm)
	}
	ofiles, nfiles := tlsVolumeFiles(volume(oss, "raft-tls")), tlsVolumeFiles(volume(nss, "raft-tls"))
	if !reflect.DeepEqual(ofiles, nfiles) {
		t.Errorf("raft TLS files %v → %v", ofiles, nfiles)
	} else {
		say("same raft TLS files %v, from the same Secret", nfiles)
	}
	for _, a := range nc.Args {
		if !slices.Contains(oc.Args, a) {
			say("StatefulSet pod template: new argument %s (rolled pod by pod; understood by this release only, not sent to %s pods)", a, version)
		}
	}
	if f := specFields(t, oss.Spec.Template, nss.Spec.Template); len(f) > 0 {
		say("pod template fields that change: %v", f)
	}
	if f := specFields(t, map[string]any{"spec": oc}, map[string]any{"spec": nc}); len(f) > 0 {
		say("container fields that change: %v", f)
	}
	if envVar(&oc, "CONSUL_HTTP_TOKEN") != nil && envVar(&nc, "CONSUL_HTTP_TOKEN") == nil {
		say("StatefulSet pod template: the Consul token moves from CONSUL_HTTP_TOKEN to a file (--consul-token-file), same Secret: a rolled pod reads the same token")
	}

	// Services: type, clusterIP and the health check node port are what
	// Kubernetes refuses to change in place (ValidateServiceUpdate:
	// validateUpgradeDowngradeClusterIPs, validateServiceExternalTrafficFieldsUpdate).
	for _, name := range []string{"hastate", "hastate-agent", "hastate-http"} {
		osvc, ns := old.get(t, "Service", name).(*corev1.Service), r.get(t, "Service", name).(*corev1.Service)
		if osvc.Spec.Type != ns.Spec.Type || osvc.Spec.ClusterIP != ns.Spec.ClusterIP || !reflect.DeepEqual(osvc.Spec.Selector, ns.Spec.Selector) ||
			osvc.Spec.ExternalTrafficPolicy != ns.Spec.ExternalTrafficPolicy || ns.Spec.HealthCheckNodePort != 0 {
			t.Errorf("Service %s: type %q→%q clusterIP %q→%q selector %v→%v externalTrafficPolicy %q→%q healthCheckNodePort →%d",
				name, osvc.Spec.Type, ns.Spec.Type, osvc.Spec.ClusterIP, ns.Spec.ClusterIP, osvc.Spec.Selector, ns.Spec.Selector,
				osvc.Spec.ExternalTrafficPolicy, ns.Spec.ExternalTrafficPolicy, ns.Spec.HealthCheckNodePort)
			continue
		}
		say("same Service %s type, clusterIP, selector, externalTrafficPolicy; healthCheckNodePort not rendered (Kubernetes keeps the one it allocated)", name)
		if !reflect.DeepEqual(osvc.Spec.LoadBalancerSourceRanges, ns.Spec.LoadBalancerSourceRanges) {
			say("Service %s loadBalancerSourceRanges %v → %v (haproxyCIDRs): GKE narrows the load balancer's firewall rule to the HAProxy nodes; safe when haproxyCIDRs holds every HAProxy node", name, osvc.Spec.LoadBalancerSourceRanges, ns.Spec.LoadBalancerSourceRanges)
		}
	}
	// The rest: objects Kubernetes updates in place (no immutable field).
	for _, k := range slices.Sorted(maps.Keys(old.objects)) {
		kind := strings.SplitN(k, "/", 2)[0]
		n, ok := r.objects[k]
		if !ok || kind == "StatefulSet" || kind == "Service" {
			continue
		}
		if changed := specFields(t, old.objects[k], n); len(changed) > 0 {
			say("changed %s %v: updated in place (no immutable field in a %s)", k, changed, kind)
		}
	}
	for _, line := range report {
		t.Log(line)
	}
}

// Pinning agentService.healthCheckNodePort on an upgrade: Kubernetes
// refuses to change an allocated port while the policy stays Local
// (pkg/apis/core/validation ValidateServiceUpdate →
// validateServiceExternalTrafficFieldsUpdate: "field is immutable"), Helm
// would go on rolling the StatefulSet and mark the release failed. The
// render refuses a pin that differs from the allocated port, naming it;
// pinning the allocated one renders it.
func TestChartUpgradeHealthCheckNodePort(t *testing.T) {
	_, _, live := previousRelease(t)
	ch := loadChart(t, chartDir)
	vals := upgradedValues(t)
	vals["agentService"].(map[string]any)["healthCheckNodePort"] = 30555
	_, _, err := renderIn(ch, vals, "hastate", live, true)
	want := fmt.Sprintf("agentService.healthCheckNodePort 30555: Kubernetes allocated %d to Service hastate-agent", allocatedHealthCheckNodePort)
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("pin 30555 over the allocated %d: err %v, want %q", allocatedHealthCheckNodePort, err, want)
	}
	t.Logf("refused: %v", err)
	vals["agentService"].(map[string]any)["healthCheckNodePort"] = allocatedHealthCheckNodePort
	manifest, notes, err := renderIn(ch, vals, "hastate", live, true)
	if err != nil {
		t.Fatal(err)
	}
	svc := renderedIn(t, manifest, notes).get(t, "Service", "hastate-agent").(*corev1.Service)
	if svc.Spec.HealthCheckNodePort != allocatedHealthCheckNodePort {
		t.Errorf("healthCheckNodePort %d, want the allocated %d", svc.Spec.HealthCheckNodePort, allocatedHealthCheckNodePort)
	}
}

func claimSpecs(ss *appsv1.StatefulSet) []any {
	var out []any
	for _, c := range ss.Spec.VolumeClaimTemplates {
		out = append(out, []any{c.Name, c.Spec.AccessModes, c.Spec.Resources.Requests.Storage().String(), c.Spec.StorageClassName})
	}
	return out
}

func mustYAML(t *testing.T, v any) string {
	t.Helper()
	b, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// specFields names the top-level fields of spec (or data) that differ.
func specFields(t *testing.T, a, b any) []string {
	t.Helper()
	var ma, mb map[string]any
	if err := yaml.Unmarshal([]byte(mustYAML(t, a)), &ma); err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal([]byte(mustYAML(t, b)), &mb); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, top := range []string{"spec", "data", "rules"} {
		sa, _ := ma[top].(map[string]any)
		sb, _ := mb[top].(map[string]any)
		for _, k := range slices.Sorted(maps.Keys(sa)) {
			if !reflect.DeepEqual(sa[k], sb[k]) {
				out = append(out, top+"."+k)
			}
		}
		for _, k := range slices.Sorted(maps.Keys(sb)) {
			if _, ok := sa[k]; !ok {
				out = append(out, top+"."+k)
			}
		}
	}
	return out
}

// upgradedValues is previousValues with every upgrade step's change made.
func upgradedValues(t *testing.T) map[string]any {
	t.Helper()
	vals := values(t, previousValues)
	for _, step := range upgradeSteps {
		step.fix(vals)
	}
	return vals
}

// Moving the raft CA from the Secret 0.14.0 made to cert-manager is two
// rollouts, each keeping every pod able to talk to every other (docs/
// deploy.md, "Moving the raft CA"): first every pod trusts a bundle of
// both CAs while still presenting the old certificates (cert-manager
// issues the new ones beside them), then the pods present cert-manager's
// with the same bundle. A switch in one rollout, or without the bundle
// rolled out first, is refused; so is an upgrade that cannot see what the
// running pods present and is not told.
func TestChartRaftCAMove(t *testing.T) {
	_, _, live := previousRelease(t)
	ch := loadChart(t, chartDir)
	kept := upgradedValues(t)

	with := func(raftTLS string) map[string]any {
		v := upgradedValues(t)
		v["raftTLS"] = values(t, raftTLS)
		return v
	}
	refused := func(cl *fakeCluster, vals map[string]any, want string) {
		t.Helper()
		_, _, err := renderIn(ch, vals, "hastate", cl, true)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("raftTLS %v: err %v, want a refusal saying %q", vals["raftTLS"], err, want)
		}
	}
	rendered := func(cl *fakeCluster, vals map[string]any) (*Rendered, string) {
		t.Helper()
		manifest, notes, err := renderIn(ch, vals, "hastate", cl, true)
		if err != nil {
			t.Fatalf("raftTLS %v: %v", vals["raftTLS"], err)
		}
		return renderedIn(t, manifest, notes), manifest
	}

	// In one rollout: refused, with or without a bundle the pods do not
	// trust yet.
	refused(live, with(`{certManager: {enabled: true}}`), "the running pods present certificates of secret hastate-raft-tls, these values of certManager")
	refused(live, with(`{certManager: {enabled: true}, trustBundle: {configMap: hastate-raft-trust}}`), "First roll out a trust bundle holding both CAs")

	// Step 1: the bundle, the old certificates, cert-manager issuing.
	r1, m1 := rendered(live, with(`{existingSecret: hastate-raft-tls, certManager: {enabled: true}, trustBundle: {configMap: hastate-raft-trust}}`))
	ss := r1.get(t, "StatefulSet", "hastate").(*appsv1.StatefulSet)
	srcs := volume(ss, "raft-tls").Projected.Sources
	if len(srcs) != 2 || srcs[0].Secret == nil || srcs[0].Secret.Name != "hastate-raft-tls" || srcs[1].ConfigMap == nil || srcs[1].ConfigMap.Name != "hastate-raft-trust" {
		t.Fatalf("step 1 raft-tls sources %+v: want the Secret's certificates and the bundle's ca.crt", srcs)
	}
	if slices.Contains(tlsVolumeFiles(&corev1.Volume{VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: srcs[:1]}}}), "ca.crt") {
		t.Errorf("step 1: ca.crt from the Secret as well as from the bundle")
	}
	if !strings.Contains(r1.Notes, "CA MOVE IN PROGRESS") || !strings.Contains(r1.Notes, "Trusted raft CAs: ConfigMap hastate-raft-trust") {
		t.Errorf("step 1 NOTES do not say the move is in progress and what is trusted:\n%s", r1.Notes)
	}
	for i := range 3 {
		if !r1.has("Certificate", fmt.Sprintf("hastate-raft-%d", i)) {
			t.Errorf("step 1: no Certificate hastate-raft-%d: cert-manager must issue the new certificates before the pods present them", i)
		}
	}

	// Step 2, against the cluster as step 1 left it: the pods present
	// cert-manager's certificates, trusting the same bundle.
	after1 := newFakeCluster(t, liveObjects(t, m1, nil)...)
	refused(after1, with(`{certManager: {enabled: true}}`), "First roll out a trust bundle holding both CAs")
	refused(after1, with(`{certManager: {enabled: true}, trustBundle: {configMap: another}}`), "First roll out a trust bundle holding both CAs")
	r2, m2 := rendered(after1, with(`{certManager: {enabled: true}, trustBundle: {configMap: hastate-raft-trust}}`))
	ss = r2.get(t, "StatefulSet", "hastate").(*appsv1.StatefulSet)
	srcs = volume(ss, "raft-tls").Projected.Sources
	if len(srcs) != 4 || srcs[0].Secret == nil || srcs[0].Secret.Name != "hastate-raft-0" || srcs[3].ConfigMap == nil {
		t.Fatalf("step 2 raft-tls sources %+v: want the three cert-manager Secrets and the bundle", srcs)
	}

	// Step 3, later: the bundle may go (same presented source).
	after2 := newFakeCluster(t, liveObjects(t, m2, nil)...)
	rendered(after2, with(`{certManager: {enabled: true}}`))
	// Not said on a release that presents cert-manager's: it stays.
	r, _ := rendered(after2, with(`{}`))
	if !r.has("Certificate", "hastate-raft-0") || !r.has("Issuer", "hastate-raft-ca") {
		t.Errorf("not said, pods presenting cert-manager's: want cert-manager kept, have %v", r.keys())
	}

	// An upgrade that cannot see the running pods and is not told.
	refused(newFakeClusterEmpty(), with(`{}`), "the chart cannot see which raft certificates the running replicas use")
	// Keeping the Secret needs nothing more.
	rendered(live, kept)
	// TLS off under a TLS cluster, in one rollout: refused.
	refused(live, with(`{enabled: false}`), "raftTLS.enabled=false, and the running replicas use raft TLS")
}

// A 0.14.0 release that used cert-manager (its values said
// raftTLS.certManager.enabled: true) keeps it: the same values file,
// agentCIDRs moved, renders against the cluster it made, with the same
// Certificates and Issuers by name (the same CA Secret, the same issuer of
// every replica's certificate) and the same Secrets mounted; what changes
// in them is logged.
func TestChartUpgradeFromPreviousReleaseWithCertManager(t *testing.T) {
	version, dir := previousChart(t)
	oldVals := previousValues + "raftTLS: {certManager: {enabled: true}}\n"
	manifest, notes, err := renderIn(loadChart(t, dir), values(t, oldVals), "hastate", nil, false)
	if err != nil {
		t.Fatalf("render the %s chart with cert-manager: %v", version, err)
	}
	old := renderedIn(t, manifest, notes)
	live := newFakeCluster(t, liveObjects(t, manifest, nil)...)
	vals := values(t, oldVals)
	upgradeSteps[0].fix(vals) // agentCIDRs → haproxyCIDRs; nothing about certificates
	manifest, notes, err = renderIn(loadChart(t, chartDir), vals, "hastate", live, true)
	if err != nil {
		t.Fatalf("helm upgrade of a %s release on cert-manager: %v", version, err)
	}
	r := renderedIn(t, manifest, notes)
	for _, kind := range []string{"Certificate", "Issuer"} {
		for k := range old.objects {
			if !strings.HasPrefix(k, kind+"/") {
				continue
			}
			n, ok := r.objects[k]
			if !ok {
				t.Errorf("%s is gone: cert-manager would lose the CA or a replica's certificate", k)
				continue
			}
			if changed := specFields(t, old.objects[k], n); len(changed) > 0 {
				t.Logf("changed %s %v", k, changed)
			}
			if kind == "Certificate" {
				oc, nc := old.objects[k].(*certificate), n.(*certificate)
				// A new key algorithm or size makes cert-manager issue anew: for
				// the CA, a new CA nobody trusts. rotationPolicy only says what
				// the next renewal does (0.15.0: Never for the CA, keep its key).
				if oc.Spec.PrivateKey.Algorithm != nc.Spec.PrivateKey.Algorithm || oc.Spec.PrivateKey.Size != nc.Spec.PrivateKey.Size || oc.Spec.IsCA != nc.Spec.IsCA || oc.Spec.CommonName != nc.Spec.CommonName {
					t.Errorf("%s: key %+v → %+v, isCA %v → %v, commonName %q → %q: cert-manager would issue anew", k, oc.Spec.PrivateKey, nc.Spec.PrivateKey, oc.Spec.IsCA, nc.Spec.IsCA, oc.Spec.CommonName, nc.Spec.CommonName)
				}
				if oc.Spec.SecretName != nc.Spec.SecretName || oc.Spec.IssuerRef != nc.Spec.IssuerRef || !slices.Equal(oc.Spec.DNSNames, nc.Spec.DNSNames) {
					t.Errorf("%s: secretName %q→%q issuerRef %+v→%+v dnsNames %v→%v", k, oc.Spec.SecretName, nc.Spec.SecretName, oc.Spec.IssuerRef, nc.Spec.IssuerRef, oc.Spec.DNSNames, nc.Spec.DNSNames)
				}
			}
		}
	}
	ofiles := tlsVolumeFiles(volume(old.get(t, "StatefulSet", "hastate").(*appsv1.StatefulSet), "raft-tls"))
	nfiles := tlsVolumeFiles(volume(r.get(t, "StatefulSet", "hastate").(*appsv1.StatefulSet), "raft-tls"))
	if !slices.Equal(ofiles, nfiles) {
		t.Errorf("raft TLS files %v → %v", ofiles, nfiles)
	}
}
