package observability

import (
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hastate/hastate/internal/testenv"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// synthetic are the names Prometheus makes itself when it scrapes.
var synthetic = []string{"up"}

// TestEveryUsedMetricExists starts a real hastate (one replica, a real
// Consul dev agent), gives it a drain, a weight, a ramp and an invalid key so
// that every family shows, scrapes /-/metrics, and fails when an alert or a
// dashboard panel names a metric that is not there (a rename, a typo).
func TestEveryUsedMetricExists(t *testing.T) {
	used := usedMetrics(t)
	exported := scrapeShowcase(t)
	var missing []string
	for _, name := range slices.Sorted(maps.Keys(used)) {
		if slices.Contains(synthetic, name) || exported[name] {
			continue
		}
		missing = append(missing, fmt.Sprintf("%s (used by %s)", name, strings.Join(slices.Compact(used[name]), "; ")))
	}
	if len(missing) > 0 {
		t.Fatalf("metrics used by the alerts or the dashboard that a running hastate does not export:\n  %s", strings.Join(missing, "\n  "))
	}
	t.Logf("%d metric names used by the alerts and the dashboard, all exported", len(used))
}

// scrapeShowcase returns every series name a running replica exports, a
// histogram's _bucket, _sum and _count included.
func scrapeShowcase(t *testing.T) map[string]bool {
	t.Helper()
	bin := testenv.BuildHastate(t, "../..")
	// With raft TLS, as the chart runs it: its metrics show then.
	cert, key, ca := testenv.WriteRaftTLS(t, t.TempDir())
	_, hastate := testenv.StartShowcase(t, bin, "n1", map[string]string{
		"hastate/state/web/a": `{"state":"drain","by":"alice","reason":"zonal maintenance"}`,
		"hastate/state/web/b": "50%",
		"hastate/state/web/x": "drian",
	}, "--ramp-duration", "1h", "--ramp-interval", "10s",
		"--raft-tls-cert", cert, "--raft-tls-key", key, "--raft-tls-ca", ca)
	web := hastate.HTTP

	var fams map[string]*dto.MetricFamily
	showcase := []string{"hastate_server_state", "hastate_server_state_since_timestamp_seconds",
		"hastate_server_weight_percent", "hastate_ramp_step_due_timestamp_seconds", "hastate_ramp_interval_seconds"}
	testenv.Eventually(t, 10*time.Second, func() error {
		fams = scrape(t, "http://"+web+"/-/metrics")
		for _, n := range showcase {
			if f := fams[n]; f == nil || len(f.GetMetric()) == 0 {
				return errors.New("the per-server families never showed")
			}
		}
		return nil
	})
	names := map[string]bool{}
	for name, f := range fams {
		names[name] = true
		if f.GetType() == dto.MetricType_HISTOGRAM || f.GetType() == dto.MetricType_SUMMARY {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				names[name+s] = true
			}
		}
	}
	return names
}

func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	return fams
}
