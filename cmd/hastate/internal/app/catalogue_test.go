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
	"hastate_server_weight_percent", "hastate_ramp_step_due_timestamp_seconds", "hastate_ramp_interval_seconds",
	"hastate_desired_answer", "hastate_desired_changed_timestamp_seconds"}

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
content, not by the fleet; except the two ` + "`hastate_desired_*`" + ` families of the drift
alerts (see [below](#the-drift-alerts-series-and-their-cost)).

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
	b.WriteString(driftSeries)
	return b.String()
}

// driftSeries ends docs/metrics.md: what the drift alerts' series are and
// cost (BenchmarkDesiredMetrics measured the figures).
const driftSeries = `
## The drift alerts' series and their cost

` + "`hastate_desired_answer{proxy,server,state}`" + ` has one series per server the
replica knows: a key of its own, or asked about by an HAProxy (more than
once: a manual probe asks once) within 10 minutes. A server covered only by
a backend-wide key is known once an HAProxy polls it. ` + "`proxy`" + ` and ` + "`server`" + `
are the labels of HAProxy's own exporter (` + "`haproxy_server_status{proxy,server,state}`" + `,
` + "`haproxy_server_weight{proxy,server}`" + `: Debian's 2.6 and 3.0 emit the same), so
PromQL joins them with ` + "`on (proxy, server)`" + ` without relabelling. The series are
per server, not per HAProxy that polls it: the HAProxy instance comes from
HAProxy's series. ` + "`hastate_desired_changed_timestamp_seconds{proxy,server}`" + `
exists for 10 minutes after a server's answer changed.

**Every replica exports them**, for the servers it knows, while it is ready
(one behind or cut off from the leader may hold a stale answer, and exports
none): the answer is from raft (the same on every replica in sync), but
which servers were polled is
each replica's own (the agent load balancer spreads an HAProxy's checks
over the replicas), so the union over replicas, ` + "`max by (proxy, server, ...)`" + `
in every shipped expression, is what the cluster knows. That aggregation
also keeps an alert from counting three times, and the series from
vanishing while a leader changes. Joined with ` + "`on (proxy, server)`" + ` after it,
each HAProxy instance that disagrees gives one alert.

**Cost at 50,000 servers**, measured by ` + "`BenchmarkDesiredMetrics`" + ` (one
replica mirroring the 50,000 keys of the scale benchmark from a real Consul,
against one with ` + "`--desired-metrics=false`" + ` in the same run, two shared
cores; ` + "`go test -run '^$' -bench DesiredMetrics -benchtime 1x ./test/`" + `):

| | per replica | cluster of three |
|---|---|---|
| series at rest (one per server) | 50,000 | 150,000 |
| series with every answer changed within 10 minutes (the benchmark's case: all keys just written) | 100,000 | 300,000 |
| scrape size, per server and scrape | 207 B plain, 8 B gzip (Prometheus asks for gzip) | |
| scrape of /-/metrics (all families) | 3.9 s with, 2.3 s without (x1.7), 22.0 MB plain, 0.8 MB gzip | |
| Prometheus resident memory, measured | 2,826 B per series: 283 MB per 100,000 series | about 425 MB at rest, 850 MB at most |

Storage was not measured: each series is a constant between changes, which
Prometheus' chunk encoding stores in a few bits per sample (its
documentation plans 1 to 2 bytes per sample in general); at a 15 s scrape,
150,000 series are 10,000 samples a second. For comparison, HAProxy's own
exporter serves about 50 ` + "`haproxy_server_*`" + ` series per server per HAProxy
instance (Debian's 2.6: 46 families, ` + "`haproxy_server_status`" + ` alone 5 series).
` + "`--desired-metrics=false`" + ` turns both families off, and the drift alerts
with them.
`
