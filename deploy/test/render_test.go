package deploytest

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/release"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// Where the chart and the repository are, from this package's directory.
const (
	repoRoot = "../.."
	chartDir = "../helm/hastate"
)

// The Kubernetes the chart is rendered for, and the API groups it may use
// beyond the built-in ones.
const kubeVersion = "v1.30.0"

var extraAPIs = chartutil.VersionSet{"monitoring.coreos.com/v1", "cert-manager.io/v1", "monitoring.googleapis.com/v1"}

// requiredValues are the values the chart cannot default: the HAProxy
// CIDRs (TestChartNeedsHAProxyCIDRs shows a render without them fails)
// and the Consul token (TestChartRefusesAnonymousConsul).
// render adds them when a test's values do not set them.
const requiredValues = "haproxyCIDRs: [10.20.0.0/16]\nconsul: {existingSecret: {name: hastate-consul}}\n"

// Rendered is a chart rendered and strictly decoded, one typed object per
// document, by kind and name.
type Rendered struct {
	Notes    string
	Manifest string              // the documents, hooks excluded, as Helm applies them
	objects  map[string]any      // "Kind/name", hooks included
	hooks    map[string][]string // "Kind/name" of a hook → its events (test, pre-install, ...)
}

func (r *Rendered) get(t *testing.T, kind, name string) any {
	t.Helper()
	o, ok := r.objects[kind+"/"+name]
	if !ok {
		t.Fatalf("no %s %q rendered; have %v", kind, name, r.keys())
	}
	return o
}

func (r *Rendered) has(kind, name string) bool {
	_, ok := r.objects[kind+"/"+name]
	return ok
}

func (r *Rendered) count(kind string) int {
	n := 0
	for k := range r.objects {
		if strings.HasPrefix(k, kind+"/") {
			n++
		}
	}
	return n
}

func (r *Rendered) keys() []string {
	var ks []string
	for k := range r.objects {
		ks = append(ks, k)
	}
	return ks
}

// The typed objects the chart may render. A kind not listed here fails the
// test: every document is decoded strictly into its API type.
func newObject(kind string) (any, error) {
	switch kind {
	case "StatefulSet":
		return &appsv1.StatefulSet{}, nil
	case "Service":
		return &corev1.Service{}, nil
	case "ServiceAccount":
		return &corev1.ServiceAccount{}, nil
	case "Secret":
		return &corev1.Secret{}, nil
	case "ConfigMap":
		return &corev1.ConfigMap{}, nil
	case "PodDisruptionBudget":
		return &policyv1.PodDisruptionBudget{}, nil
	case "NetworkPolicy":
		return &networkingv1.NetworkPolicy{}, nil
	case "ServiceMonitor":
		return &monitoringv1.ServiceMonitor{}, nil
	case "PrometheusRule":
		return &monitoringv1.PrometheusRule{}, nil
	case "Certificate":
		return &certificate{}, nil
	case "Issuer":
		return &issuer{}, nil
	case "Pod":
		return &corev1.Pod{}, nil
	case "PodMonitoring":
		return &podMonitoring{}, nil
	case "Rules":
		return &gmpRules{}, nil
	}
	return nil, fmt.Errorf("kind %q: the test knows no API type for it (add one)", kind)
}

// cert-manager's types are not in k8s.io/api, and its Go module is large:
// these mirror the fields of cert-manager.io/v1 the chart uses, so a typo
// in the chart still fails the strict decode.
type certificate struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		IsCA        bool     `json:"isCA,omitempty"`
		CommonName  string   `json:"commonName,omitempty"`
		SecretName  string   `json:"secretName"`
		DNSNames    []string `json:"dnsNames,omitempty"`
		Duration    string   `json:"duration,omitempty"`
		RenewBefore string   `json:"renewBefore,omitempty"`
		Usages      []string `json:"usages,omitempty"`
		PrivateKey  struct {
			Algorithm      string `json:"algorithm"`
			Size           int    `json:"size"`
			RotationPolicy string `json:"rotationPolicy,omitempty"`
		} `json:"privateKey"`
		IssuerRef struct {
			Name  string `json:"name"`
			Kind  string `json:"kind"`
			Group string `json:"group"`
		} `json:"issuerRef"`
	} `json:"spec"`
}

// podMonitoring mirrors the fields of monitoring.googleapis.com/v1
// PodMonitoring (Google Cloud Managed Service for Prometheus) the chart uses.
type podMonitoring struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector  metav1.LabelSelector `json:"selector"`
		Endpoints []struct {
			Port     string `json:"port"`
			Path     string `json:"path"`
			Interval string `json:"interval"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// gmpRules mirrors monitoring.googleapis.com/v1 Rules (Managed Service for
// Prometheus's rule evaluator): Prometheus rule groups.
type gmpRules struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Groups []struct {
			Name     string `json:"name"`
			Interval string `json:"interval,omitempty"`
			Rules    []struct {
				Record      string            `json:"record,omitempty"`
				Alert       string            `json:"alert,omitempty"`
				Expr        string            `json:"expr"`
				For         string            `json:"for,omitempty"`
				Labels      map[string]string `json:"labels,omitempty"`
				Annotations map[string]string `json:"annotations,omitempty"`
			} `json:"rules"`
		} `json:"groups"`
	} `json:"spec"`
}

type issuer struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		SelfSigned *struct{} `json:"selfSigned,omitempty"`
		CA         *struct {
			SecretName string `json:"secretName"`
		} `json:"ca,omitempty"`
	} `json:"spec"`
}

// loadChart loads the chart from dir (the real one unless a test made a copy).
func loadChart(t *testing.T, dir string) *chart.Chart {
	t.Helper()
	ch, err := loader.Load(dir)
	if err != nil {
		t.Fatalf("load chart %s: %v", dir, err)
	}
	return ch
}

// renderValues renders the chart as `helm install --dry-run` would without
// a cluster (client only: fixed Kubernetes version, monitoring.coreos.com/v1
// and cert-manager.io/v1 available) into release "t" in namespace "ops".
func renderValues(ch *chart.Chart, vals map[string]any) (string, string, error) {
	rel, err := renderRelease(ch, vals)
	if err != nil {
		return "", "", err
	}
	return rel.Manifest, rel.Info.Notes, nil
}

// renderRelease renders as renderValues does and returns the release,
// hooks included.
func renderRelease(ch *chart.Chart, vals map[string]any) (*release.Release, error) {
	return renderWithKube(ch, vals, kubeVersion)
}

// renderWithKube renders for the Kubernetes version kube.
func renderWithKube(ch *chart.Chart, vals map[string]any, kube string) (*release.Release, error) {
	return renderFor(ch, vals, kube, extraAPIs)
}

// renderFor renders for the Kubernetes version kube serving the API
// groups apis beyond the built-in ones.
func renderFor(ch *chart.Chart, vals map[string]any, kube string, apis chartutil.VersionSet) (*release.Release, error) {
	inst := action.NewInstall(&action.Configuration{})
	inst.ClientOnly = true
	inst.DryRun = true
	inst.ReleaseName = "t"
	inst.Namespace = "ops"
	kv, err := chartutil.ParseKubeVersion(kube)
	if err != nil {
		return nil, err
	}
	inst.KubeVersion = kv
	inst.APIVersions = apis
	return inst.Run(ch, vals)
}

// render renders ch with vals (requiredValues added where vals lacks
// them) and decodes every document, hooks included, strictly.
func render(t *testing.T, ch *chart.Chart, vals map[string]any) *Rendered {
	t.Helper()
	if vals == nil {
		vals = map[string]any{}
	}
	for k, v := range values(t, requiredValues) {
		if _, ok := vals[k]; !ok {
			vals[k] = v
		}
	}
	rel, err := renderRelease(ch, vals)
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	r := &Rendered{Notes: rel.Info.Notes, Manifest: rel.Manifest, objects: map[string]any{}, hooks: map[string][]string{}}
	r.decode(t, rel.Manifest, nil)
	for _, h := range rel.Hooks {
		var events []string
		for _, e := range h.Events {
			events = append(events, string(e))
		}
		r.decode(t, h.Manifest, events)
	}
	return r
}

// decode adds the documents of manifest; events, for a hook's.
func (r *Rendered) decode(t *testing.T, manifest string, events []string) {
	t.Helper()
	for _, doc := range strings.Split(manifest, "\n---") {
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		var meta metav1.TypeMeta
		var om struct {
			Metadata metav1.ObjectMeta `json:"metadata"`
		}
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatalf("document is not YAML: %v\n%s", err, doc)
		}
		_ = yaml.Unmarshal([]byte(doc), &om)
		obj, err := newObject(meta.Kind)
		if err != nil {
			t.Fatalf("%v\n%s", err, doc)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			t.Fatalf("%s %s does not decode strictly into its API type: %v\n%s", meta.Kind, om.Metadata.Name, err, doc)
		}
		key := meta.Kind + "/" + om.Metadata.Name
		if _, dup := r.objects[key]; dup {
			t.Fatalf("%s rendered twice", key)
		}
		if om.Metadata.Namespace != "ops" {
			t.Errorf("%s: namespace %q, want the release's (ops)", key, om.Metadata.Namespace)
		}
		r.objects[key] = obj
		if events != nil {
			r.hooks[key] = events
		}
	}
}

func stripComments(doc string) string {
	var b bytes.Buffer
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// values parses a YAML values snippet.
func values(t *testing.T, y string) map[string]any {
	t.Helper()
	v := map[string]any{}
	if err := yaml.Unmarshal([]byte(y), &v); err != nil {
		t.Fatalf("values: %v", err)
	}
	return v
}

// chartCopy copies the chart to a temporary directory; with files, the
// generated copies under files/ are replaced by these (name → content;
// nil: no copies at all).
func chartCopy(t *testing.T, files map[string]string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "hastate")
	err := filepath.Walk(chartDir, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(chartDir, p)
		if info.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		if filepath.Dir(rel) == "files" && rel != filepath.Join("files", "README.md") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dst, "files", name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

// The chart's objects for release "t" (fullname t-hastate).
const (
	full     = "t-hastate"
	headless = "t-hastate"
	agentSvc = "t-hastate-agent"
	httpSvc  = "t-hastate-http"
)

func statefulSet(t *testing.T, r *Rendered) (*appsv1.StatefulSet, *corev1.Container) {
	t.Helper()
	ss := r.get(t, "StatefulSet", full).(*appsv1.StatefulSet)
	if len(ss.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("StatefulSet has %d containers, want 1", len(ss.Spec.Template.Spec.Containers))
	}
	return ss, &ss.Spec.Template.Spec.Containers[0]
}

// flag returns the value of --name=value in args ("" and false if absent).
func flag(args []string, name string) (string, bool) {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
	}
	return "", false
}

func wantPeers(n int) string {
	var ps []string
	for i := range n {
		ps = append(ps, fmt.Sprintf("t-hastate-%d=t-hastate-%d.t-hastate.ops.svc:9779", i, i))
	}
	return strings.Join(ps, ",")
}

func envVar(c *corev1.Container, name string) *corev1.EnvVar {
	for i := range c.Env {
		if c.Env[i].Name == name {
			return &c.Env[i]
		}
	}
	return nil
}

func volume(ss *appsv1.StatefulSet, name string) *corev1.Volume {
	for i := range ss.Spec.Template.Spec.Volumes {
		if ss.Spec.Template.Spec.Volumes[i].Name == name {
			return &ss.Spec.Template.Spec.Volumes[i]
		}
	}
	return nil
}

func mount(c *corev1.Container, name string) *corev1.VolumeMount {
	for i := range c.VolumeMounts {
		if c.VolumeMounts[i].Name == name {
			return &c.VolumeMounts[i]
		}
	}
	return nil
}

func yamlMarshal(o any) ([]byte, error) { return yaml.Marshal(o) }
