package test

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hastate/hastate/internal/testenv"
)

// BenchmarkDesiredMetrics reports what the drift alerts' series
// (hastate_desired_answer, hastate_desired_changed_timestamp_seconds) cost
// at 50,000 servers: two one-replica clusters mirror the same 50,000 keys
// (scaleKV) of a real Consul, one with --desired-metrics (the default),
// one with --desired-metrics=false, as the baseline of the same run. For
// each it reports the series and bytes of one /-/metrics scrape (plain and
// gzip, which Prometheus asks for) and the scrape's time; then a real
// Prometheus scrapes each every promInterval until it holds promSamples
// samples of every series, and its head series and resident memory are
// read from its own metrics. The keys are written a moment before, so
// every server's change time is exported too: the worst case, two series
// per server; at rest it is one. Not part of make test (about 6 minutes):
//
//	go test -run '^$' -bench DesiredMetrics -benchtime 1x -timeout 20m ./test/
func BenchmarkDesiredMetrics(b *testing.B) {
	const n = 50000
	kv := scaleKV(n)
	consul := testenv.StartConsul(b, testenv.ConsulOptions{})
	loadKV(b, consul, kv)
	on := StartHastate(b, HastateOptions{ConsulAddr: consul.Addr(), NodeID: "on"})
	off := StartHastate(b, HastateOptions{ConsulAddr: consul.Addr(), NodeID: "off", Args: []string{"--desired-metrics=false"}})
	waitMirror(b, 3*time.Minute, kv, on, off)
	var son, soff scrapeCost
	for b.Loop() {
		son, soff = measureScrape(b, on), measureScrape(b, off)
	}
	desired := son.series - soff.series
	b.ReportMetric(float64(desired), "desired_series")
	b.ReportMetric(float64(son.plain-soff.plain)/float64(n), "plain_B/server")
	b.ReportMetric(float64(son.gzip-soff.gzip)/float64(n), "gzip_B/server")
	b.ReportMetric(float64(son.took)/float64(soff.took), "scrape_time_ratio")
	b.Logf("scrape with: %+v; without: %+v", son, soff)
	pon, poff := measurePrometheus(b, on), measurePrometheus(b, off)
	perSeries := float64(pon.rss-poff.rss) / float64(pon.series-poff.series)
	b.ReportMetric(perSeries, "prom_rss_B/series")
	fmt.Printf("desired metrics at %d servers (one replica; a cluster of three exports them three times):\n"+
		"  scrape with:    %7d series, %6.1f MB plain, %5.1f MB gzip, %s (median of %d)\n"+
		"  scrape without: %7d series, %6.1f MB plain, %5.1f MB gzip, %s\n"+
		"  desired series %d (%.2f per server), %.0f B plain and %.0f B gzip per server and scrape, scrape time x%.2f\n"+
		"  Prometheus scraping each every %s (%d samples of each series): head series %d against %d, RSS %.0f MB against %.0f MB (%.0f B per series)\n",
		n, son.series, mbf(son.plain), mbf(son.gzip), son.took.Round(time.Millisecond), scrapes,
		soff.series, mbf(soff.plain), mbf(soff.gzip), soff.took.Round(time.Millisecond),
		desired, float64(desired)/n, float64(son.plain-soff.plain)/n, float64(son.gzip-soff.gzip)/n, float64(son.took)/float64(soff.took),
		promInterval, promSamples, pon.series, poff.series, mbf(pon.rss), mbf(poff.rss), perSeries)
}

func mbf(n int64) float64 { return float64(n) / 1e6 }

// scrapes is how many /-/metrics scrapes measureScrape times.
const scrapes = 5

// scrapeCost is one replica's /-/metrics: series, bytes and time.
type scrapeCost struct {
	series      int
	plain, gzip int64
	took        time.Duration // median
}

// measureScrape scrapes h's /-/metrics scrapes times, gzip-encoded as
// Prometheus asks, and returns its series, plain and gzip bytes and the
// median time.
func measureScrape(tb testing.TB, h *Hastate) scrapeCost {
	tb.Helper()
	var c scrapeCost
	var took []time.Duration
	for range scrapes {
		req, err := http.NewRequest(http.MethodGet, "http://"+h.HTTPAddr+"/-/metrics", nil)
		if err != nil {
			tb.Fatal(err)
		}
		req.Header.Set("Accept-Encoding", "gzip")
		start := time.Now()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			tb.Fatalf("scrape %s: %v", h.HTTPAddr, err)
		}
		zipped, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		took = append(took, time.Since(start))
		if err != nil || resp.Header.Get("Content-Encoding") != "gzip" {
			tb.Fatalf("scrape %s: %v, encoding %q", h.HTTPAddr, err, resp.Header.Get("Content-Encoding"))
		}
		zr, err := gzip.NewReader(bytes.NewReader(zipped))
		if err != nil {
			tb.Fatal(err)
		}
		plain, err := io.ReadAll(zr)
		if err != nil {
			tb.Fatal(err)
		}
		c.gzip, c.plain, c.series = int64(len(zipped)), int64(len(plain)), 0
		sc := bufio.NewScanner(bytes.NewReader(plain))
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			if l := sc.Text(); l != "" && !strings.HasPrefix(l, "#") {
				c.series++
			}
		}
	}
	slices.Sort(took)
	c.took = took[len(took)/2]
	return c
}

// promSamples is how many samples of every series measurePrometheus
// waits for, scraping every promInterval (a scrape of 50,000 servers
// takes more than a second on two shared cores).
const (
	promSamples  = 12
	promInterval = 5 * time.Second
)

// promCost is what a Prometheus scraping one replica holds.
type promCost struct {
	series, samples, rss int64
}

// measurePrometheus runs a real Prometheus scraping h every second until
// it holds promSamples samples of every series, and reads its own
// metrics.
func measurePrometheus(tb testing.TB, h *Hastate) promCost {
	tb.Helper()
	addr := runPrometheus(tb, func(string) string {
		return fmt.Sprintf(`global:
  scrape_interval: %s
  scrape_timeout: %s
scrape_configs:
  - job_name: hastate
    metrics_path: /-/metrics
    static_configs:
      - targets: ['%s']
`, promInterval, promInterval-time.Second, h.HTTPAddr)
	})
	var c promCost
	testenv.Eventually(tb, 5*time.Minute, func() error {
		m := ownMetrics(tb, addr)
		c = promCost{series: int64(m["prometheus_tsdb_head_series"]), samples: int64(m["prometheus_tsdb_head_samples_appended_total"]),
			rss: int64(m["process_resident_memory_bytes"])}
		return testenv.Expect(c.series > 0 && c.samples >= promSamples*c.series, "Prometheus holds %d samples of %d series, want %d each", c.samples, c.series, promSamples)
	})
	return c
}

// ownMetrics reads a Prometheus's own /metrics: the value of each
// family, summed over its series.
func ownMetrics(tb testing.TB, addr string) map[string]float64 {
	tb.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		tb.Fatalf("prometheus /metrics: %v", err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		name, v, ok := strings.Cut(sc.Text(), " ")
		if !ok || strings.HasPrefix(name, "#") {
			continue
		}
		name, _, _ = strings.Cut(name, "{") // summed over its labels
		if f, err := strconv.ParseFloat(v, 64); err == nil {
			out[name] += f
		}
	}
	return out
}
