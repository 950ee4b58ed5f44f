package deploytest

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// The chart's copies of the single sources (`make chart-files`).
var chartFiles = []struct{ src, copy string }{
	{"deploy/prometheus/alerts.yaml", "deploy/helm/hastate/files/alerts.yaml"},
	{"deploy/grafana/hastate.json", "deploy/helm/hastate/files/hastate.json"},
}

// TestChartFilesMatchSources fails on drift: a copy that differs from its
// source, a source without a copy, a copy without a source, and, in a git
// checkout, a copy that git does not have as it is on disk (make test runs
// `make chart-files` first, so a stale committed copy shows up here).
func TestChartFilesMatchSources(t *testing.T) {
	inGit := exec.Command("git", "-C", repoRoot, "rev-parse", "--git-dir").Run() == nil
	for _, f := range chartFiles {
		src, srcErr := os.ReadFile(filepath.Join(repoRoot, f.src))
		cp, cpErr := os.ReadFile(filepath.Join(repoRoot, f.copy))
		switch {
		case errors.Is(srcErr, fs.ErrNotExist) && errors.Is(cpErr, fs.ErrNotExist):
			t.Logf("%s does not exist yet: the chart renders nothing from it", f.src)
			continue
		case errors.Is(srcErr, fs.ErrNotExist):
			t.Errorf("%s has no source %s: run `make chart-files` (it removes the copy)", f.copy, f.src)
			continue
		case errors.Is(cpErr, fs.ErrNotExist):
			t.Errorf("%s has no copy in the chart: run `make chart-files` and commit %s", f.src, f.copy)
			continue
		case srcErr != nil || cpErr != nil:
			t.Fatalf("read %s / %s: %v %v", f.src, f.copy, srcErr, cpErr)
		}
		if !bytes.Equal(src, cp) {
			t.Errorf("%s differs from its source %s: run `make chart-files` and commit the copy (never edit it by hand)", f.copy, f.src)
		}
		if !inGit {
			continue
		}
		if err := exec.Command("git", "-C", repoRoot, "ls-files", "--error-unmatch", f.copy).Run(); err != nil {
			t.Errorf("%s is not tracked by git: `git add` it (the chart must install from a checkout)", f.copy)
			continue
		}
		if out, err := exec.Command("git", "-C", repoRoot, "diff", "--name-only", "--", f.copy).Output(); err != nil || len(out) > 0 {
			t.Errorf("%s on disk differs from what git has (%v): `git add` the output of `make chart-files`", f.copy, err)
		}
	}
}

// With the copies present and monitoring on, the PrometheusRule carries the
// source's groups and the ConfigMap the dashboard byte for byte (see also
// TestChartProduction); without them, nothing (TestChartInlineConsulAndChartCA).
func TestChartRulesFromFile(t *testing.T) {
	ch := loadChart(t, chartCopy(t, map[string]string{"alerts.yaml": sampleAlerts}))
	r := render(t, ch, values(t, `{metrics: {prometheusRule: {enabled: true}, grafanaDashboard: {enabled: true}}, consul: {existingSecret: {name: hastate-consul}}}`))
	if r.has("ConfigMap", full+"-dashboard") {
		t.Errorf("dashboard rendered without its file")
	}
	pr := r.get(t, "PrometheusRule", full)
	b, err := yamlMarshal(pr)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"HastateRaftTLSDisabled", "hastate_raft_tls_enabled == 0", "{{ $labels.pod }}"} {
		if !bytes.Contains(b, []byte(want)) {
			t.Errorf("PrometheusRule lacks %q:\n%s", want, b)
		}
	}
	// Off by value: nothing even with the file.
	r = render(t, ch, values(t, tokenOnly))
	if r.count("PrometheusRule") != 0 {
		t.Errorf("PrometheusRule rendered while metrics.prometheusRule.enabled is false")
	}
}
