package observability

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
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

// haproxyPrefix starts the names of HAProxy's own exporter, which the
// drift alerts and panel join with hastate's: they must exist on a real
// HAProxy instead.
const haproxyPrefix = "haproxy_"

// TestEveryUsedMetricExists starts a real hastate (one replica, a real
// Consul dev agent), gives it a drain, a weight, a ramp and an invalid key so
// that every family shows, scrapes /-/metrics, and fails when an alert or a
// dashboard panel names a metric that is not there (a rename, a typo).
func TestEveryUsedMetricExists(t *testing.T) {
	used := usedMetrics(t)
	exported := scrapeShowcase(t)
	haproxy := scrapeHAProxy(t)
	var missing []string
	for _, name := range slices.Sorted(maps.Keys(used)) {
		if slices.Contains(synthetic, name) || exported[name] || (strings.HasPrefix(name, haproxyPrefix) && haproxy[name]) {
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
		"hastate_server_weight_percent", "hastate_ramp_step_due_timestamp_seconds", "hastate_ramp_interval_seconds",
		"hastate_desired_answer", "hastate_desired_changed_timestamp_seconds"}
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

// scrapeHAProxy returns every series name the built-in Prometheus
// exporter of a real HAProxy serves ($HAPROXY_BIN, else Debian's
// /usr/sbin/haproxy), with one backend server.
func scrapeHAProxy(t *testing.T) map[string]bool {
	t.Helper()
	bin := cmp.Or(os.Getenv("HAPROXY_BIN"), "/usr/sbin/haproxy")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("no HAProxy at %s (%v): set HAPROXY_BIN, or run `make deps` (scripts/ensure-haproxy.sh installs Debian's)", bin, err)
	}
	dir := t.TempDir()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(testenv.FreePort(t)))
	cfg := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`global
    nbthread 1
defaults
    mode http
    timeout connect 1s
    timeout client 5s
    timeout server 5s
frontend exporter
    bind %s
    http-request use-service prometheus-exporter if { path /metrics }
backend web
    server a 127.0.0.1:9 weight 100
`, addr)), 0o644); err != nil {
		t.Fatal(err)
	}
	p := &testenv.Process{Bin: bin, LogPath: filepath.Join(dir, "haproxy.log")}
	p.Start(t, "-db", "-f", cfg)
	t.Cleanup(p.Kill)
	names := map[string]bool{}
	testenv.Eventually(t, 10*time.Second, func() error {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return fmt.Errorf("HAProxy's exporter at %s: %w", addr, err)
		}
		resp.Body.Close()
		return nil
	})
	for name := range scrape(t, "http://"+addr+"/metrics") {
		names[name] = true
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
