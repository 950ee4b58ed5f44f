package test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/hastate/hastate/internal/testenv"
	"github.com/hastate/hastate/state"
)

// The scale benchmarks (issue 11): what one KV change costs as the fleet
// grows, and what a backend-wide ramp costs the other servers. Both run a
// real Consul and three `hastate serve` replicas on 127.0.0.1 and report,
// not assert: `make bench` prints the figures.
//
//	go test -run '^$' -bench 'Scale|BackendRamp' -benchtime 1x -timeout 30m ./test/

// Scale: for each size, the prefix is loaded into Consul before the
// replicas start, the benchmark waits until every replica mirrors it, then
// makes scaleChanges single-key writes. Each write goes to a random server
// key and is timed from the Consul write returning until all three
// replicas answer it (waitAllAnswer, as measurePropagation does). The next
// write follows scaleGap after that, so each one finds the leader's
// blocking query waiting, as an operator's write does. Memory is sampled
// after each of those; costChanges more writes follow, with the replicas'
// histograms scraped before and after them, for the per-entry cost.
var scaleSizes = []int{1000, 10000, 50000}

const (
	scaleChanges = 30
	costChanges  = 10 // after the scaleChanges, with /-/metrics scraped around them
	scaleGap     = 300 * time.Millisecond
	scaleLists   = 5 // Consul listings timed per size; the median is reported
	// serversPerBackend: 50,000 keys are 1,000 backends.
	serversPerBackend = 50
)

// scaleKV returns n state keys (relative to kvPrefix) as an SRE's fleet
// holds them: a mix of drain, maint, weights, ready and JSON values with
// an audit trail. It is deterministic, so sizes are comparable across runs.
func scaleKV(n int) map[string]string {
	kv := make(map[string]string, n)
	for i := range n {
		server := fmt.Sprintf("web_%04d/gke-web-%05d-us-east1-%c", i/serversPerBackend, i, 'b'+rune(i%3))
		var v string
		switch i % 20 {
		case 0, 1, 2, 3, 4, 5, 6, 7:
			v = "drain"
		case 8, 9:
			v = "maint"
		case 10, 11, 12, 13, 14:
			v = fmt.Sprintf("%d%%", (i*7)%101)
		case 15, 16:
			v = `{"state":"drain","reason":"zonal maintenance us-east1-b","by":"alice","at":"2025-03-01T10:00:00Z"}`
		case 17:
			v = `{"state":"maint","reason":"kernel upgrade","by":"deploy-pipeline","ramp":"10m","at":"2025-03-01T10:00:00Z"}`
		default:
			v = "ready"
		}
		kv["state/"+server] = v
	}
	return kv
}

// servers returns the backend/server names of kv's exact server keys, sorted.
func servers(kv map[string]string) []string {
	var out []string
	for k := range kv {
		if s, ok := strings.CutPrefix(k, "state/"); ok && !strings.HasSuffix(s, "/*") {
			out = append(out, s)
		}
	}
	slices.Sort(out)
	return out
}

// expectedAnswer is the agent answer line (without LF) for a valid value.
func expectedAnswer(tb testing.TB, value string) string {
	tb.Helper()
	v, err := state.ParseValue(value)
	if err != nil {
		tb.Fatalf("value %q: %v", value, err)
	}
	return state.ValueAnswer(v).String()
}

// loadKV writes kv under kvPrefix in Consul transactions of 64 operations
// (Consul's limit), from 8 goroutines.
func loadKV(tb testing.TB, consul *testenv.Consul, kv map[string]string) time.Duration {
	tb.Helper()
	const opsPerTxn, workers = 64, 8
	start := time.Now()
	var batches []api.TxnOps
	var ops api.TxnOps
	for _, k := range slices.Sorted(maps.Keys(kv)) {
		ops = append(ops, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVSet, Key: kvPrefix + k, Value: []byte(kv[k])}})
		if len(ops) == opsPerTxn {
			batches, ops = append(batches, ops), nil
		}
	}
	if len(ops) > 0 {
		batches = append(batches, ops)
	}
	txn := consul.Client(tb).Txn()
	work := make(chan api.TxnOps)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for range workers {
		wg.Go(func() {
			for ops := range work {
				ok, resp, _, err := txn.Txn(ops, nil)
				if err == nil && !ok {
					err = fmt.Errorf("transaction rolled back: %v", resp.Errors)
				}
				if err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		})
	}
	for _, ops := range batches {
		work <- ops
	}
	close(work)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		tb.Fatalf("consul: load %d keys: %v", len(kv), err)
	}
	return time.Since(start)
}

// waitMirror waits until every replica's kv_digest is the digest of kv
// (keys relative to the prefix). It is waitMirrorsConsul without listing
// Consul at every poll, which at 50,000 keys would load the machine.
func waitMirror(tb testing.TB, timeout time.Duration, kv map[string]string, hs ...*Hastate) {
	tb.Helper()
	want := kvDigest(kv)
	var got []string
	testenv.Eventually(tb, timeout, func() error {
		got = got[:0]
		same := true
		for _, h := range hs {
			c, err := h.clusterInfo()
			got = append(got, fmt.Sprintf("%s:keys %d%s", h.NodeID, c.KVKeys, errOrEmpty(err)))
			same = same && err == nil && c.KVDigest == want
		}
		if !same {
			time.Sleep(200 * time.Millisecond)
		}
		return testenv.Expect(same, "replicas do not mirror the %d keys written: %v", len(kv), got)
	})
}

// memory reads VmRSS (resident now) and VmHWM (the peak resident set) of
// a process from /proc, in bytes.
func memory(pid int) (rss, hwm int64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	for line := range strings.Lines(string(b)) {
		name, val, ok := strings.Cut(line, ":")
		if !ok || (name != "VmRSS" && name != "VmHWM") {
			continue
		}
		f := strings.Fields(val) // "12345 kB"
		if len(f) != 2 || f[1] != "kB" {
			return 0, 0, fmt.Errorf("/proc/%d/status: %q", pid, line)
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, 0, err
		}
		if name == "VmRSS" {
			rss = kb << 10
		} else {
			hwm = kb << 10
		}
	}
	return rss, hwm, nil
}

// maxMemory is the largest VmRSS and VmHWM over the replicas.
func maxMemory(tb testing.TB, hs []*Hastate) (rss, hwm int64) {
	tb.Helper()
	for _, h := range hs {
		r, w, err := memory(h.Pid())
		if err != nil {
			tb.Fatalf("%s: memory: %v", h.NodeID, err)
		}
		rss, hwm = max(rss, r), max(hwm, w)
	}
	return rss, hwm
}

// samples scrapes /-/metrics once and returns the named unlabelled samples
// (e.g. hastate_raft_apply_duration_seconds_sum); absent ones are 0. It
// asks only for their families (name[]), which saves encoding the
// per-server series, not gathering them.
func (h *Hastate) samples(tb testing.TB, names ...string) map[string]float64 {
	tb.Helper()
	q := url.Values{}
	for _, n := range names {
		fam := strings.TrimSuffix(strings.TrimSuffix(n, "_sum"), "_count")
		if !slices.Contains(q["name[]"], fam) {
			q.Add("name[]", fam)
		}
	}
	code, body, err := h.get("/-/metrics?" + q.Encode())
	if err != nil || code != http.StatusOK {
		tb.Fatalf("%s: GET /-/metrics: HTTP %d: %v", h.NodeID, code, err)
	}
	out := make(map[string]float64, len(names))
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), " ")
		if ok && slices.Contains(names, name) {
			f, err := strconv.ParseFloat(val, 64)
			if err != nil {
				tb.Fatalf("%s: metric %s: %q: %v", h.NodeID, name, val, err)
			}
			out[name] = f
		}
	}
	if err := sc.Err(); err != nil {
		tb.Fatalf("%s: read /-/metrics: %v", h.NodeID, err)
	}
	return out
}

// histMean is the mean of a histogram's observations between two scrapes,
// in seconds (0 when there were none).
func histMean(before, after map[string]float64, name string) float64 {
	n := after[name+"_count"] - before[name+"_count"]
	if n <= 0 {
		return 0
	}
	return (after[name+"_sum"] - before[name+"_sum"]) / n
}

// consulListing times Consul's own listing of the prefix: through
// consul/api's KV.List (its decoding included; what the leader's watch did
// before it read listings itself), and as a raw HTTP read of the same
// JSON, uncompressed as the leader asks for it (the floor). It returns the
// medians of scaleLists reads each and the size of the JSON.
func consulListing(tb testing.TB, consul *testenv.Consul) (list, raw time.Duration, size int) {
	tb.Helper()
	kv := consul.Client(tb).KV()
	var lists, raws durations
	for range scaleLists {
		start := time.Now()
		if _, _, err := kv.List(kvPrefix, nil); err != nil {
			tb.Fatalf("consul: list %s: %v", kvPrefix, err)
		}
		lists = append(lists, time.Since(start))

		start = time.Now()
		req, err := http.NewRequest(http.MethodGet, "http://"+consul.Addr()+"/v1/kv/"+kvPrefix+"?recurse=true", nil)
		if err != nil {
			tb.Fatal(err)
		}
		req.Header.Set("Accept-Encoding", "identity") // as the leader asks (kvsync.listingTransport)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			tb.Fatalf("consul: GET %s: %v", kvPrefix, err)
		}
		n, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			tb.Fatalf("consul: GET %s: HTTP %d: %v", kvPrefix, resp.StatusCode, err)
		}
		raws = append(raws, time.Since(start))
		size = int(n)
	}
	return lists.quantile(0.5), raws.quantile(0.5), size
}

// Histograms read to get the per-entry cost. The leader observes
// apply_duration for each entry it writes (raft Apply until committed by a
// quorum and applied to its own FSM); each follower observes entry_lag
// from the leader writing the entry until its FSM has applied it and
// serves it: replication, the commit notice and the apply.
const (
	applyHist = "hastate_raft_apply_duration_seconds"
	lagHist   = "hastate_raft_entry_lag_seconds"
	appliedIx = "hastate_raft_applied_index"
)

var histSamples = []string{applyHist + "_sum", applyHist + "_count", lagHist + "_sum", lagHist + "_count", appliedIx}

// scaleResult is one size's figures.
type scaleResult struct {
	keys        int
	load, sync  time.Duration // Consul load; replicas start until all mirror it
	lat         durations     // write returned -> all three replicas answer it
	rss, hwm    int64         // largest replica VmRSS and VmHWM, sampled after each change
	leaderRSS   int64         // the leader's largest VmRSS (it also decodes and diffs Consul's listing)
	apply, lag  float64       // mean seconds per entry: leader apply, follower lag
	entries     float64       // raft entries per change
	list, raw   time.Duration // Consul's listing: consul/api List, raw HTTP
	listingSize int
}

func mb(n int64) float64 { return float64(n) / (1 << 20) }

func (r scaleResult) report(b *testing.B) {
	b.ReportMetric(ms(r.lat.quantile(0.5)), "p50_ms")
	b.ReportMetric(ms(r.lat.quantile(0.99)), "p99_ms")
	b.ReportMetric(mb(r.rss), "rss_MB")
	b.ReportMetric(mb(r.hwm), "hwm_MB")
	b.ReportMetric(r.apply*1e3, "apply_ms/entry")
	b.ReportMetric(r.lag*1e3, "lag_ms/entry")
	b.ReportMetric(ms(r.list), "consul_list_ms")
	b.ReportMetric(ms(r.raw), "consul_http_ms")
}

// runScale measures one size: see scaleSizes.
func runScale(b *testing.B, n int) scaleResult {
	r := scaleResult{keys: n}
	kv := scaleKV(n)
	names := servers(kv)
	consul := testenv.StartConsul(b, testenv.ConsulOptions{})
	r.load = loadKV(b, consul, kv)

	start := time.Now()
	hs := StartCluster(b, 3, HastateOptions{ConsulAddr: consul.Addr()})
	leader := WaitLeader(b, 10*time.Second, hs...)
	waitMirror(b, 2*time.Minute, kv, hs...)
	r.sync = time.Since(start)

	rng := rand.New(rand.NewPCG(uint64(n), 11))
	consulKV := consul.Client(b).KV()
	change := func(i int) {
		server := names[rng.IntN(len(names))]
		key := "state/" + server
		w := i%200 + 1
		if kv[key] == fmt.Sprintf("%d%%", w) {
			w++
		}
		kv[key] = fmt.Sprintf("%d%%", w)
		if _, err := consulKV.Put(&api.KVPair{Key: kvPrefix + key, Value: []byte(kv[key])}, nil); err != nil {
			b.Fatalf("change %d: consul put: %v", i, err)
		}
		wrote := time.Now()
		last, err := waitAllAnswer(hs, server, fmt.Sprintf("ready %d%%", w), 20*time.Second)
		if err != nil {
			b.Fatalf("change %d (%s=%d%%) did not reach every replica: %v", i, server, w, err)
		}
		r.lat = append(r.lat, last.Sub(wrote))
	}
	for b.Loop() {
		// Latency and memory first, before anything scrapes /-/metrics:
		// a scrape exports a series per drained server, and the heap it
		// grows would be counted as the mirror's.
		for i := range scaleChanges {
			// Every write, the first included, follows scaleGap after
			// the last, so that it finds the leader's query waiting (the
			// first would otherwise land in the gap the watch keeps after
			// the initial full read, and measure that).
			time.Sleep(scaleGap)
			change(i)
			rss, hwm := maxMemory(b, hs)
			r.rss, r.hwm = max(r.rss, rss), max(r.hwm, hwm)
			rss, _ = maxMemory(b, []*Hastate{leader})
			r.leaderRSS = max(r.leaderRSS, rss)
		}
		// Then the per-entry cost: histogram deltas over costChanges more.
		before := map[*Hastate]map[string]float64{}
		for _, h := range hs {
			before[h] = h.samples(b, histSamples...)
		}
		for i := range costChanges {
			time.Sleep(scaleGap)
			change(scaleChanges + i)
		}
		var lagSum, lagN float64
		for _, h := range hs {
			after := h.samples(b, histSamples...)
			if h == leader {
				r.apply = histMean(before[h], after, applyHist)
				r.entries = (after[appliedIx] - before[h][appliedIx]) / costChanges
				continue
			}
			lagSum += after[lagHist+"_sum"] - before[h][lagHist+"_sum"]
			lagN += after[lagHist+"_count"] - before[h][lagHist+"_count"]
		}
		if lagN > 0 {
			r.lag = lagSum / lagN
		}
	}
	if l := WaitLeader(b, 10*time.Second, hs...); l != leader {
		b.Fatalf("the leader changed during the changes (%s, then %s): the figures mix two leaders", leader.NodeID, l.NodeID)
	}
	waitMirror(b, time.Minute, kv, hs...)
	r.list, r.raw, r.listingSize = consulListing(b, consul)
	return r
}

// BenchmarkScale reports, for 1,000, 10,000 and 50,000 keys, the time from
// one Consul write to all three replicas answering it (p50, p99), the
// largest replica's memory, the mean cost of one raft entry, and Consul's
// own listing time of the prefix as the floor; then prints them as one
// table on stdout. Each size takes a fresh Consul and cluster; the whole
// run takes about 80 seconds on two cores.
func BenchmarkScale(b *testing.B) {
	var rows []scaleResult
	for _, n := range scaleSizes {
		b.Run(fmt.Sprintf("keys=%d", n), func(b *testing.B) {
			r := runScale(b, n)
			r.report(b)
			rows = append(rows, r)
		})
	}
	if len(rows) == 0 {
		return
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "one change to all 3 replicas (%d changes per size, %s apart), memory, per-entry cost, Consul's listing:\n", scaleChanges+costChanges, scaleGap)
	fmt.Fprintf(&sb, "%8s %8s %8s %8s %8s %8s %8s %10s %10s %9s %10s %10s %9s %8s %8s\n",
		"keys", "p50_ms", "p99_ms", "max_ms", "rss_MB", "ldr_MB", "hwm_MB", "apply_ms", "lag_ms", "entries", "list_ms", "http_ms", "json_MB", "load_s", "sync_s")
	for _, r := range rows {
		fmt.Fprintf(&sb, "%8d %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f %10.2f %10.2f %9.2f %10.1f %10.1f %9.2f %8.1f %8.1f\n",
			r.keys, ms(r.lat.quantile(0.5)), ms(r.lat.quantile(0.99)), ms(r.lat.max()), mb(r.rss), mb(r.leaderRSS), mb(r.hwm),
			r.apply*1e3, r.lag*1e3, r.entries, ms(r.list), ms(r.raw), mb(int64(r.listingSize)), r.load.Seconds(), r.sync.Seconds())
	}
	fmt.Fprintf(&sb, "rss_MB: largest VmRSS over the replicas after each of the first %d changes (ldr_MB: the leader's); hwm_MB: largest VmHWM then (peak, initial sync included).\n", scaleChanges)
	fmt.Fprintf(&sb, "apply_ms: leader's mean hastate_raft_apply_duration_seconds per entry (commit plus the leader's FSM apply) over the last %d changes;\n", costChanges)
	sb.WriteString("lag_ms: followers' mean hastate_raft_entry_lag_seconds (from the leader writing an entry to the follower serving it);\n")
	sb.WriteString("entries: raft entries per change. list_ms: consul/api KV.List of the prefix (median of 5); http_ms: the same read as raw uncompressed HTTP (Consul's floor), json_MB its size.\n")
	// Straight to stdout: the testing package prints a parent benchmark's
	// log only with -v, and cuts it at 10 lines.
	fmt.Print(sb.String())
}
