package app

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hastate/hastate/cluster/raftport"
	"github.com/hastate/hastate/internal/testenv"
	"github.com/hastate/hastate/state"
	dto "github.com/prometheus/client_model/go"
)

var update = flag.Bool("update", false, "rewrite docs/metrics.md from the registry (make docs)")

const cataloguePath = "../../../../docs/metrics.md"

// TestMetricsCatalogue builds the registry of a running replica, with every
// family showing (a drain, a weight, a ramp, an invalid key, a probe), and
// compares docs/metrics.md with it. Regenerate with `make docs`.
func TestMetricsCatalogue(t *testing.T) {
	a := startShowcase(t)
	var fams []*dto.MetricFamily
	testenv.Eventually(t, 15*time.Second, func() error {
		var err error
		if fams, err = a.o.Registry.Gather(); err != nil {
			t.Fatal(err)
		}
		return testenv.Expect(missingFamilies(fams) == nil, "families never showed")
	})
	got := renderCatalogue(fams)
	if *update {
		if err := os.WriteFile(cataloguePath, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(cataloguePath)
	if err != nil {
		t.Fatalf("%v: run `make docs` to write it", err)
	}
	if string(want) != got {
		t.Fatalf("docs/metrics.md is stale: run `make docs` (go test ./cmd/hastate/internal/app -run TestMetricsCatalogue -update) and commit it.\n--- generated:\n%s", got)
	}
}

// showcaseFamilies only show with a non-default state or a ramp.
var showcaseFamilies = []string{"hastate_server_state", "hastate_server_state_since_timestamp_seconds",
	"hastate_server_weight_percent", "hastate_ramp_step_due_timestamp_seconds", "hastate_ramp_interval_seconds"}

func missingFamilies(fams []*dto.MetricFamily) []string {
	var missing []string
	for _, name := range showcaseFamilies {
		if !slices.ContainsFunc(fams, func(f *dto.MetricFamily) bool { return f.GetName() == name && len(f.GetMetric()) > 0 }) {
			missing = append(missing, name)
		}
	}
	return missing
}

// startShowcase starts a one-node replica against a real Consul and gives
// it a drain, a weight, a ramp in progress and an invalid key, and asks it
// one probe.
func startShowcase(t *testing.T) *App {
	t.Helper()
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	consul.Put(t, "hastate/state/web/a", `{"state":"drain","by":"alice","reason":"zonal maintenance"}`)
	consul.Put(t, "hastate/state/web/b", "50%")
	consul.Put(t, "hastate/state/web/r", "drain")
	consul.Put(t, "hastate/state/web/x", "drian")
	// With raft TLS, so that its metrics (expiry, reloads) show.
	rt, err := raftport.LoadRaftTLS(func() raftport.TLSFiles {
		c, k, ca := testenv.WriteRaftTLS(t, t.TempDir())
		return raftport.TLSFiles{Cert: c, Key: k, CA: ca}
	}())
	if err != nil {
		t.Fatal(err)
	}
	a := startApp(t, consul.Addr(), "n1", func(o *Options) {
		o.Ramp = state.RampPolicy{Start: 10, Duration: time.Hour, Interval: 10 * time.Second, Aggression: 1}
		o.RaftTLS = rt
	})
	testenv.Eventually(t, 10*time.Second, func() error { return testenv.Expect(ask(t, a, "web/r") == "drain\n", "replica never answered drain") })
	consul.Delete(t, "hastate/state/web/r")
	testenv.Eventually(t, 10*time.Second, func() error { return testenv.Expect(ask(t, a, "web/r") == "ready 10%\n", "web/r never ramped") })
	return a
}

// renderCatalogue writes the hastate_* families as a Markdown table.
func renderCatalogue(fams []*dto.MetricFamily) string {
	var b strings.Builder
	b.WriteString(`# hastate metrics

Generated from the registry of a running replica by
` + "`go test ./cmd/hastate/internal/app -run TestMetricsCatalogue -update`" + ` (` + "`make docs`" + `);
a test fails when this file is stale. Every replica serves them on
` + "`/-/metrics`" + ` (port 9778), with the Go runtime's ` + "`go_*`" + ` and the process's
` + "`process_*`" + ` metrics.

Where a metric is meaningful: **per replica** (sum or compare over
replicas), **cluster-wide** (the same on every replica: use ` + "`min`" + ` or ` + "`max`" + `
over replicas), **from raft** (the same on every replica in sync), or
**leader only** (followers keep the values of the last time they led: use
the cluster-wide ones for alerts). Per-server series exist only for servers
with a non-default state or a ramp, so their number is bounded by the KV
content, not by the fleet.

| name | type | labels | meaning |
|---|---|---|---|
`)
	for _, f := range fams {
		name := f.GetName()
		if !strings.HasPrefix(name, "hastate_") {
			continue
		}
		var labels []string
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if !slices.Contains(labels, l.GetName()) {
					labels = append(labels, l.GetName())
				}
			}
		}
		slices.Sort(labels)
		ls := ""
		if len(labels) > 0 {
			ls = "`" + strings.Join(labels, "`, `") + "`"
		}
		help := strings.NewReplacer("|", `\|`, "<", "&lt;", ">", "&gt;").Replace(f.GetHelp())
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", name, strings.ToLower(f.GetType().String()), ls, help)
	}
	return b.String()
}
