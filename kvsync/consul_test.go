package kvsync

// Tests against a real Consul agent (internal/testenv), loopback only.

import (
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/hastate/hastate/internal/testenv"
)

// deliveryTimeout bounds every wait for a change to reach the Sink.
const deliveryTimeout = 20 * time.Second

// consulClient is the product's client (NewClient) for c.
func consulClient(t *testing.T, c *testenv.Consul) *api.Client {
	t.Helper()
	cl, err := NewClient("http://" + c.Addr())
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

func consulOptions(client *api.Client, prefix string, sink Sink) Options {
	return Options{Client: client, Prefix: prefix, Sink: sink, WaitTime: 10 * time.Second}
}

// waitFor waits until the Sink's last delivered map equals want.
func waitFor(t *testing.T, sink *recSink, want map[string]string) {
	t.Helper()
	testenv.Eventually(t, deliveryTimeout, func() error {
		got := sink.lastDelivered()
		return testenv.Expect(got != nil && maps.Equal(got, want), "sink to receive %s", fmtMap(want))
	})
}

func fmtMap(m map[string]string) string {
	var b strings.Builder
	b.WriteString("{")
	for k, v := range m {
		b.WriteString(k + "=" + v + " ")
	}
	return strings.TrimSpace(b.String()) + "}"
}

func TestConsulFirstReadDeliversPrefix(t *testing.T) {
	t.Parallel()
	c := testenv.StartConsul(t, testenv.ConsulOptions{})
	c.Put(t, "hastate/state/web/a", "drain")
	c.Put(t, "hastate/state/web/*", ` {"state":"maint","reason":"zonal"} `)
	c.Put(t, "hastate/state/", "") // a folder, as the UI creates it
	c.Put(t, "hastatex/state/web/b", "maint")
	c.Put(t, "other/key", "x")

	sink := &recSink{}
	w, err := New(consulOptions(consulClient(t, c), "hastate/", sink))
	if err != nil {
		t.Fatal(err)
	}
	runWatcher(t, w)
	waitFor(t, sink, map[string]string{
		"state/web/a": "drain",
		"state/web/*": ` {"state":"maint","reason":"zonal"} `,
	})
	if d := sink.delivered(); len(d) != 1 || d[0].index == 0 || d[0].index != w.Status().Index {
		t.Errorf("deliveries = %v, status index %d: want one, at the status index", d, w.Status().Index)
	}
}

func TestConsulEmptyPrefixIsDeliveredAndUnrelatedWritesAreNot(t *testing.T) {
	t.Parallel()
	c := testenv.StartConsul(t, testenv.ConsulOptions{})
	sink := &recSink{}
	o := consulOptions(consulClient(t, c), "hastate/", sink)
	o.WaitTime = time.Second // so the index moves even if the write does not wake the query
	w, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	runWatcher(t, w)
	waitFor(t, sink, map[string]string{})

	// Writes outside the prefix move the index of an empty prefix's list.
	first := w.Status().Index
	idx := c.Put(t, "other/key", "1")
	c.Put(t, "hastatex/key", "2")
	idx = max(idx, c.Put(t, "other/key", "3"))
	testenv.Eventually(t, deliveryTimeout, func() error {
		return testenv.Expect(w.Status().Index >= idx, "the watcher to see index %s", strconv.FormatUint(idx, 10))
	})
	if w.Status().Index == first {
		t.Fatalf("index did not move (%d); the test proves nothing", first)
	}
	if n := len(sink.all()); n != 1 {
		t.Fatalf("sink called %d times, want 1 (index moved, data did not): %v", n, sink.all())
	}
}

func TestConsulEachChangeDeliveredOnce(t *testing.T) {
	t.Parallel()
	c := testenv.StartConsul(t, testenv.ConsulOptions{})
	c.Put(t, "hastate/state/web/a", "drain")
	sink := &recSink{}
	w, err := New(consulOptions(consulClient(t, c), "hastate/", sink))
	if err != nil {
		t.Fatal(err)
	}
	runWatcher(t, w)
	want := map[string]string{"state/web/a": "drain"}
	waitFor(t, sink, want)

	steps := []struct {
		name string
		do   func() uint64
		want map[string]string // nil: no change
	}{
		{"put a new key", func() uint64 { return c.Put(t, "hastate/state/web/b", "maint") },
			map[string]string{"state/web/a": "drain", "state/web/b": "maint"}},
		{"same value again (index moves, data does not)", func() uint64 { return c.Put(t, "hastate/state/web/b", "maint") }, nil},
		{"write outside the prefix", func() uint64 { c.Put(t, "other/x", "1"); return 0 }, nil},
		{"change a value", func() uint64 { return c.Put(t, "hastate/state/web/a", "50%") },
			map[string]string{"state/web/a": "50%", "state/web/b": "maint"}},
		{"delete a key", func() uint64 { return c.Delete(t, "hastate/state/web/b") },
			map[string]string{"state/web/a": "50%"}},
		{"delete the last key", func() uint64 { return c.Delete(t, "hastate/state/web/a") },
			map[string]string{}},
	}
	calls := 1
	for _, s := range steps {
		idx := s.do()
		if s.want != nil {
			calls++
			waitFor(t, sink, s.want)
		} else if idx > 0 {
			testenv.Eventually(t, deliveryTimeout, func() error {
				return testenv.Expect(w.Status().Index >= idx, "%s", s.name+": watcher at index "+strconv.FormatUint(idx, 10))
			})
		}
		if n := len(sink.all()); n != calls {
			t.Fatalf("after %q: %d sink calls, want %d: %v", s.name, n, calls, sink.all())
		}
	}
	// A final change proves nothing was left queued from the no-op steps.
	c.Put(t, "hastate/state/web/c", "drain")
	waitFor(t, sink, map[string]string{"state/web/c": "drain"})
	if n := len(sink.all()); n != calls+1 {
		t.Fatalf("%d sink calls in all, want %d: %v", n, calls+1, sink.all())
	}
}

func TestConsulCustomPrefix(t *testing.T) {
	t.Parallel()
	c := testenv.StartConsul(t, testenv.ConsulOptions{})
	c.Put(t, "gitlab-haproxy-agent/state/canary_web/gke-cny-web", "drain")
	c.Put(t, "hastate/state/web/a", "maint")
	sink := &recSink{}
	w, err := New(consulOptions(consulClient(t, c), "gitlab-haproxy-agent/", sink))
	if err != nil {
		t.Fatal(err)
	}
	runWatcher(t, w)
	waitFor(t, sink, map[string]string{"state/canary_web/gke-cny-web": "drain"})

	c.Put(t, "hastate/state/web/b", "drain") // another prefix: not ours
	c.Put(t, "gitlab-haproxy-agent/state/canary_web/*", "maint")
	waitFor(t, sink, map[string]string{
		"state/canary_web/gke-cny-web": "drain",
		"state/canary_web/*":           "maint",
	})
	if n := len(sink.all()); n != 2 {
		t.Errorf("%d sink calls, want 2: %v", n, sink.all())
	}
}

func TestConsulDownAtStartThenUp(t *testing.T) {
	t.Parallel()
	port := testenv.FreePort(t)
	client, err := NewClient("http://127.0.0.1:" + strconv.Itoa(port))
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zapcore.InfoLevel)
	sink := &recSink{}
	o := consulOptions(client, "hastate/", sink) // default backoff: 250ms doubling to 30s
	o.Logger = zap.New(core)
	w, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	runWatcher(t, w)
	testenv.Eventually(t, deliveryTimeout, func() error { return testenv.Expect(w.Status().ConsecutiveErrors >= 3, "3 failed attempts") })
	if st := w.Status(); st.Reachable || len(sink.all()) != 0 {
		t.Fatalf("with Consul down: status %+v, sink calls %v", st, sink.all())
	}
	errLines := logs.FilterLevelExact(zapcore.ErrorLevel).All()
	if len(errLines) == 0 || len(errLines) > w.Status().ConsecutiveErrors {
		t.Fatalf("%d error lines for %d failed attempts, want one per attempt", len(errLines), w.Status().ConsecutiveErrors)
	}
	if e := errLines[0]; !strings.Contains(e.Message, "CONSUL_HTTP_ADDR / --consul-addr") ||
		e.ContextMap()["attempt"] != int64(1) || e.ContextMap()["retry_in"] != 250*time.Millisecond {
		t.Errorf("first error line = %q %v", e.Message, e.ContextMap())
	}

	started := time.Now()
	c := testenv.StartConsul(t, testenv.ConsulOptions{HTTPPort: port})
	up := time.Now()
	c.Put(t, "hastate/state/web/a", "drain")
	waitFor(t, sink, map[string]string{"state/web/a": "drain"})
	t.Logf("Consul took %s to start; the watcher failed %d times in all; "+
		"data reached the sink %s after Consul answered",
		up.Sub(started).Round(time.Millisecond), logs.FilterLevelExact(zapcore.ErrorLevel).Len(),
		time.Since(up).Round(time.Millisecond))
	testenv.Eventually(t, deliveryTimeout, func() error { // reset once the delivery returned
		st := w.Status()
		return testenv.Expect(st.Reachable && st.ConsecutiveErrors == 0 && !st.LastSuccess.IsZero(), "after recovery: status %+v", st)
	})
	if logs.FilterMessageSnippet("recovered").Len() != 1 {
		t.Errorf("no recovery log line")
	}
}

func TestConsulKilledAndRestarted(t *testing.T) {
	t.Parallel()
	c := testenv.StartConsul(t, testenv.ConsulOptions{Persistent: true})
	c.Put(t, "hastate/state/web/a", "drain")
	sink := &recSink{}
	o := consulOptions(consulClient(t, c), "hastate/", sink)
	o.BackoffMax = 2 * time.Second
	w, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	runWatcher(t, w)
	waitFor(t, sink, map[string]string{"state/web/a": "drain"})

	c.Kill()
	testenv.Eventually(t, deliveryTimeout, func() error {
		st := w.Status()
		return testenv.Expect(!st.Reachable && st.ConsecutiveErrors >= 2, "the watcher to notice")
	})
	c.Restart(t)
	restarted := time.Now()
	c.Put(t, "hastate/state/web/b", "maint")
	waitFor(t, sink, map[string]string{"state/web/a": "drain", "state/web/b": "maint"})
	t.Logf("change reached the sink %s after the restarted Consul answered", time.Since(restarted).Round(time.Millisecond))
	if n := len(sink.all()); n != 2 {
		t.Errorf("%d sink calls, want 2 (the KV survived, so no re-delivery of equal data): %v", n, sink.all())
	}
	// The watcher resets its error streak once the delivery returned,
	// a moment after the sink saw the data.
	testenv.Eventually(t, deliveryTimeout, func() error {
		st := w.Status()
		return testenv.Expect(st.Reachable && st.ConsecutiveErrors == 0, "after recovery: status %+v", st)
	})
}

func TestConsulSinkErrorRetried(t *testing.T) {
	t.Parallel()
	c := testenv.StartConsul(t, testenv.ConsulOptions{})
	c.Put(t, "hastate/state/web/a", "drain")
	errNotLeader := errors.New("not the raft leader")
	sink := &recSink{fail: func(n int) error {
		if n < 2 {
			return errNotLeader
		}
		return nil
	}}
	reg := prometheus.NewRegistry()
	o := consulOptions(consulClient(t, c), "hastate/", sink)
	o.Metrics = NewMetrics(reg)
	w, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	runWatcher(t, w)
	waitFor(t, sink, map[string]string{"state/web/a": "drain"})

	calls := sink.all()
	if len(calls) != 3 || !errors.Is(calls[0].err, errNotLeader) || !errors.Is(calls[1].err, errNotLeader) {
		t.Fatalf("sink calls = %v, want two failures then a success", calls)
	}
	for _, cl := range calls {
		if !maps.Equal(cl.kv, calls[2].kv) {
			t.Errorf("retry handed different data: %v", calls)
		}
	}
	st := w.Status()
	if st.ConsecutiveErrors != 0 || !st.Reachable || !strings.Contains(st.LastError, "not the raft leader") {
		t.Errorf("status = %+v", st)
	}
	if got := gauge(t, reg, "hastate_kv_sync_errors_total"); got != 2 {
		t.Errorf("hastate_kv_sync_errors_total = %v, want 2", got)
	}
	if got := gauge(t, reg, "hastate_kv_updates_total"); got != 1 {
		t.Errorf("hastate_kv_updates_total = %v, want 1", got)
	}
}

// Not parallel: goleak compares goroutines before and after.
func TestConsulCancelReturnsPromptly(t *testing.T) {
	c := testenv.StartConsul(t, testenv.ConsulOptions{})
	c.Put(t, "hastate/state/web/a", "drain")
	ignore := goleak.IgnoreCurrent()

	tr := &http.Transport{}
	var blocking atomic.Bool
	cfg := ClientConfig("http://" + c.Addr())
	cfg.HttpClient = &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if r.URL.Query().Has("index") {
			blocking.Store(true)
		}
		return tr.RoundTrip(r)
	})}
	client, err := newClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	sink := &recSink{}
	o := consulOptions(client, "hastate/", sink)
	o.WaitTime = time.Minute
	w, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	stop := runWatcher(t, w)
	waitFor(t, sink, map[string]string{"state/web/a": "drain"})
	testenv.Eventually(t, deliveryTimeout, func() error { return testenv.Expect(blocking.Load(), "a blocking query in flight") })

	began := time.Now()
	stop() // fails the test if Run does not return within 5s
	if d := time.Since(began); d > time.Second {
		t.Errorf("Run took %s to return after cancel", d)
	}
	tr.CloseIdleConnections()
	goleak.VerifyNone(t, ignore)
}

// roundTripFunc is an http.RoundTripper that is a function.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestConsulListingReadDirect: with NewClient's client the Watcher reads
// Consul's listing itself (listingTransport), gets what consul/api reads,
// builds nothing for a read that changed nothing, and skips decoding an
// answer at the index it asked; a client built without NewClient is
// refused with what to do, since the listing is read in one way only.
func TestConsulListingReadDirect(t *testing.T) {
	t.Parallel()
	c := testenv.StartConsul(t, testenv.ConsulOptions{})
	c.Put(t, "hastate/state/web/a", "drain")
	c.Put(t, "hastate/state/web/*", `{"state":"maint","reason":"zonal é \"quoted\""}`)
	c.Put(t, "hastate/state/", "")
	idx := c.Put(t, "hastate/config/ramp", `{"duration":"5m"}`)
	c.Put(t, "other/x", "1")
	want := map[string]string{
		"state/web/a": "drain",
		"state/web/*": `{"state":"maint","reason":"zonal é \"quoted\""}`,
		"config/ramp": `{"duration":"5m"}`,
	}
	readPrefixErr := func(t *testing.T, client *api.Client, prefix string, index uint64, last map[string]string) (uint64, listing, error) {
		t.Helper()
		w, err := New(Options{Client: client, Prefix: prefix, Sink: &recSink{}, WaitTime: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		var h held
		if last != nil {
			h = heldOf(last)
		}
		return w.read(t.Context(), index, h)
	}
	readPrefix := func(t *testing.T, client *api.Client, prefix string, index uint64, last map[string]string) (uint64, listing) {
		t.Helper()
		got, l, err := readPrefixErr(t, client, prefix, index, last)
		if err != nil {
			t.Fatal(err)
		}
		return got, l
	}

	read := func(client *api.Client, index uint64, last map[string]string) (uint64, listing) {
		t.Helper()
		return readPrefix(t, client, "hastate/", index, last)
	}
	direct := consulClient(t, c)
	got, l := read(direct, 0, nil)
	if l.unchanged || !maps.Equal(l.full.kv, want) || l.count != 3 || got < idx {
		t.Fatalf("first read: unchanged=%v keys=%d index %d, %v; want changed, 3 keys, index >= %d, %v",
			l.unchanged, l.count, got, l.full.kv, idx, want)
	}
	// consul/api decoded nothing: the pairs were read by the transport.
	if _, l := read(direct, 0, maps.Clone(want)); !l.unchanged || l.edits != nil || l.count != 3 {
		t.Errorf("read against what the Sink holds: unchanged=%v keys=%d edits %v; want unchanged, no edit",
			l.unchanged, l.count, l.edits)
	}
	// A blocking read at the current index times out with that index: not
	// decoded, read as unchanged.
	if again, l := read(direct, got, want); again != got || !l.unchanged {
		t.Errorf("read at index %d: index %d, unchanged=%v; want the same index, unchanged", got, again, l.unchanged)
	}

	if _, _, err := readPrefixErr(t, c.Client(t), "hastate/", 0, nil); !errors.Is(err, errNotNewClient) {
		t.Errorf("consul/api client: read = %v, want errNotNewClient", err)
	}
	// A prefix with no key is a 404, which the transport reads as the
	// empty prefix.
	if _, l := readPrefix(t, direct, "nothing/", 0, map[string]string{}); !l.unchanged || l.count != 0 {
		t.Errorf("empty prefix: unchanged=%v keys=%d; want the empty read, unchanged", l.unchanged, l.count)
	}
	if _, l := readPrefix(t, direct, "nothing/", 0, nil); l.unchanged || l.count != 0 || l.full.kv == nil || len(l.full.kv) != 0 {
		t.Errorf("empty prefix, first read: unchanged=%v keys=%d kv %v; want an empty map to hand over", l.unchanged, l.count, l.full.kv)
	}
}

// TestListingMalformedIsAReadError: a listing that is not one (a proxy's
// error page with status 200, a cut body) fails the read with errListing
// and reaches the Sink as nothing; the Watcher retries. The listing is
// asked for uncompressed.
func TestListingMalformedIsAReadError(t *testing.T) {
	t.Parallel()
	var encoding atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		encoding.Store(r.Header.Get("Accept-Encoding"))
		consulHeaders(rw.Header(), "42")
		rw.Header().Set("Content-Type", "application/json")
		_, _ = rw.Write([]byte(`[{"Key":"hastate/state/web/a","Value":"ZHJh`))
	}))
	t.Cleanup(srv.Close)
	client, err := NewClient(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	sink := &recSink{}
	w, err := New(Options{Client: client, Prefix: "hastate/", Sink: sink, WaitTime: time.Second, BackoffBase: 10 * time.Millisecond, BackoffMax: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := w.read(t.Context(), 0, held{}); !errors.Is(err, errListing) || !strings.Contains(err.Error(), `consul: list "hastate/"`) {
		t.Fatalf("read = %v, want a consul list error wrapping errListing", err)
	}
	// The listing is asked for uncompressed (see listingTransport).
	if got := encoding.Load(); got != "identity" {
		t.Errorf("Accept-Encoding = %v, want identity", got)
	}
	stop := runWatcher(t, w)
	testenv.Eventually(t, deliveryTimeout, func() error { return testenv.Expect(w.Status().ConsecutiveErrors >= 3, "three failed reads") })
	stop()
	if st := w.Status(); st.Reachable || !strings.Contains(st.LastError, "malformed Consul KV listing") {
		t.Errorf("status = %+v, want unreachable with the malformed listing error", st)
	}
	if n := len(sink.all()); n != 0 {
		t.Errorf("sink called %d times, want 0", n)
	}
}

// TestWatcherReadsUnorderedListingsInFull: were Consul to list keys out of
// order, a read could not be merged with the held one; the Watcher reads
// it again in full (and every later one), and the Sink gets the read.
func TestWatcherReadsUnorderedListingsInFull(t *testing.T) {
	t.Parallel()
	pair := func(k, v string) string {
		return fmt.Sprintf(`{"Key":"hastate/%s","Value":"%s"}`, k, base64.StdEncoding.EncodeToString([]byte(v)))
	}
	ordered := "[" + pair("state/web/a", "drain") + "," + pair("state/web/b", "maint") + "]"
	unordered := "[" + pair("state/web/c", "drain") + "," + pair("state/web/a", "ready") + "]"
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if !r.URL.Query().Has("recurse") {
			// CheckRead's direct reads (the unordered read removes
			// state/web/b): the token may read, nothing there.
			rw.Header().Set("X-Consul-Index", "10")
			rw.Header().Set("X-Consul-LastContact", "0")
			rw.Header().Set("X-Consul-KnownLeader", "true")
			rw.WriteHeader(http.StatusNotFound)
			return
		}
		rw.Header().Set("Content-Type", "application/json")
		switch r.URL.Query().Get("index") {
		case "", "0":
			consulHeaders(rw.Header(), "10")
			_, _ = io.WriteString(rw, ordered)
		case "10":
			consulHeaders(rw.Header(), "11")
			_, _ = io.WriteString(rw, unordered)
		default:
			<-r.Context().Done() // nothing new: block like Consul
		}
	}))
	t.Cleanup(srv.Close)
	client, err := NewClient(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zapcore.WarnLevel)
	sink := &recSink{}
	w, err := New(Options{Client: client, Prefix: "hastate/", Sink: sink, WaitTime: time.Second, Logger: zap.New(core)})
	if err != nil {
		t.Fatal(err)
	}
	stop := runWatcher(t, w)
	want := map[string]string{"state/web/c": "drain", "state/web/a": "ready"}
	waitFor(t, sink, want)
	stop()
	calls := sink.all()
	if len(calls) != 2 || calls[1].index != 11 || calls[1].base != 10 || !slices.Equal(calls[1].changed, []string{"state/web/a", "state/web/b", "state/web/c"}) {
		t.Errorf("sink calls = %+v, want the full read at 10, then the one at 11 based on 10 with a, b and c changed", calls)
	}
	if logs.FilterMessageSnippet("out of order").Len() != 1 {
		t.Errorf("warnings: %v, want one saying the keys were out of order", logs.All())
	}
}
