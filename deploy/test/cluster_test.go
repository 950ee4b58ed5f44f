package deploytest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"sigs.k8s.io/yaml"
)

// A render against a cluster: what `helm install` or `helm upgrade` does
// with a live cluster behind it, lookup included, without one. The
// cluster is a fake dynamic client holding the objects a test gives it
// (a previous release's, as Kubernetes stored them); an API group it does
// not serve fails a lookup as discovery would.

// fakeCluster serves lookup from objects.
type fakeCluster struct {
	client dynamic.Interface
	served map[string]bool // apiVersion
}

var _ engine.ClientProvider = (*fakeCluster)(nil)

// clusterScoped are the kinds the chart looks up that have no namespace.
var clusterScoped = map[string]bool{"Namespace": true, "CSIDriver": true}

// newFakeCluster holds objs (each a decoded YAML document).
func newFakeCluster(t *testing.T, objs ...map[string]any) *fakeCluster {
	t.Helper()
	var rs []runtime.Object
	for _, o := range objs {
		rs = append(rs, &unstructured.Unstructured{Object: o})
	}
	served := map[string]bool{"v1": true, "apps/v1": true, "policy/v1": true, "networking.k8s.io/v1": true, "storage.k8s.io/v1": true}
	for _, v := range extraAPIs {
		served[v] = true
	}
	return &fakeCluster{client: dynamicfake.NewSimpleDynamicClient(runtime.NewScheme(), rs...), served: served}
}

func (c *fakeCluster) GetClientFor(apiVersion, kind string) (dynamic.NamespaceableResourceInterface, bool, error) {
	if !c.served[apiVersion] {
		return nil, false, fmt.Errorf("the server could not find the requested resource (%s)", apiVersion)
	}
	gvr, _ := meta.UnsafeGuessKindToResource(schema.FromAPIVersionAndKind(apiVersion, kind))
	return c.client.Resource(gvr), !clusterScoped[kind], nil
}

// renderIn renders ch for release into namespace ops against cl (nil: no
// cluster, as helm template), as an install or an upgrade. Schema
// validation included, as Helm does.
func renderIn(ch *chart.Chart, vals map[string]any, release string, cl *fakeCluster, upgrade bool) (manifest, notes string, err error) {
	caps := chartutil.DefaultCapabilities.Copy()
	kv, err := chartutil.ParseKubeVersion(kubeVersion)
	if err != nil {
		return "", "", err
	}
	caps.KubeVersion = *kv
	caps.APIVersions = append(caps.APIVersions, extraAPIs...)
	rev := 1
	if upgrade {
		rev = 2
	}
	top, err := chartutil.ToRenderValues(ch, vals, chartutil.ReleaseOptions{Name: release, Namespace: "ops", Revision: rev, IsInstall: !upgrade, IsUpgrade: upgrade}, caps)
	if err != nil {
		return "", "", err
	}
	if cl == nil {
		cl = newFakeClusterEmpty()
	}
	files, err := engine.RenderWithClientProvider(ch, top, cl)
	if err != nil {
		return "", "", err
	}
	var names []string
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, name := range names {
		switch {
		case strings.HasSuffix(name, "NOTES.txt"):
			notes = files[name]
		case strings.HasPrefix(filepath.Base(name), "_"), strings.TrimSpace(files[name]) == "":
		default:
			fmt.Fprintf(&b, "---\n# Source: %s\n%s\n", name, files[name])
		}
	}
	return b.String(), notes, nil
}

func newFakeClusterEmpty() *fakeCluster {
	return &fakeCluster{client: dynamicfake.NewSimpleDynamicClient(runtime.NewScheme()), served: map[string]bool{"v1": true, "apps/v1": true, "storage.k8s.io/v1": true}}
}

// renderedIn decodes a renderIn manifest strictly, as render does.
func renderedIn(t *testing.T, manifest, notes string) *Rendered {
	t.Helper()
	r := &Rendered{Notes: notes, Manifest: manifest, objects: map[string]any{}, hooks: map[string][]string{}}
	r.decode(t, manifest, nil)
	return r
}

// liveObjects turns a manifest into the objects a cluster would hold
// after applying it; edit, when set, changes each one as Kubernetes
// would (defaults it fills in, a port it allocates).
func liveObjects(t *testing.T, manifest string, edit func(o map[string]any)) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, doc := range strings.Split(manifest, "\n---") {
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		o := map[string]any{}
		if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
			t.Fatalf("live object: %v\n%s", err, doc)
		}
		if edit != nil {
			edit(o)
		}
		out = append(out, o)
	}
	return out
}

// previousChart extracts the previous release's chart from this
// repository's history: the release test/testdata/previous-release names
// (the one the upgrade test runs as binaries), at its commit.
func previousChart(t *testing.T) (version, dir string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "test", "testdata", "previous-release"))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		t.Fatalf("test/testdata/previous-release: %q, want \"<version> <commit>\"", b)
	}
	version, commit := f[0], f[1]
	tmp := t.TempDir()
	archive := exec.Command("git", "archive", "--format=tar", commit, "deploy/helm/hastate")
	archive.Dir = repoRoot
	tarball, err := archive.Output()
	if err != nil {
		t.Fatalf("git archive %s deploy/helm/hastate (the previous release must be in this clone's history; a shallow clone lacks it: git fetch --unshallow): %v", commit, err)
	}
	untar := exec.Command("tar", "-x", "-C", tmp)
	untar.Stdin = bytes.NewReader(tarball)
	if out, err := untar.CombinedOutput(); err != nil {
		t.Fatalf("tar: %v\n%s", err, out)
	}
	return version, filepath.Join(tmp, "deploy", "helm", "hastate")
}
