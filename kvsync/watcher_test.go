package kvsync

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/hastate/hastate/internal/testenv"
	"github.com/hastate/hastate/state"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// fastOptions returns Options with tiny pacing, for fakes.
func fastOptions(client *api.Client, sink Sink) Options {
	return Options{
		Client:      client,
		Prefix:      "hastate/",
		Sink:        sink,
		WaitTime:    time.Second,
		MinGap:      time.Millisecond,
		BackoffBase: time.Millisecond,
		BackoffMax:  4 * time.Millisecond,
	}
}

func TestWatcherIndexRules(t *testing.T) {
	t.Parallel()
	a := api.KVPairs{kvp("hastate/state/web/a", "drain")}
	aMap := map[string]string{"state/web/a": "drain"}
	b := api.KVPairs{kvp("hastate/state/web/a", "drain"), kvp("hastate/state/web/b", "maint")}
	bMap := map[string]string{"state/web/a": "drain", "state/web/b": "maint"}
	errSink := errors.New("not the leader")

	tests := []struct {
		name      string
		replies   []reply
		sinkFails []int // sink call numbers that fail
		wantWaits []uint64
		wantSink  []sinkCall // every call, failed ones with a non-nil err
		wantIndex uint64
	}{
		{
			name:      "first read of an empty prefix calls the sink",
			replies:   []reply{{index: 3}},
			wantWaits: []uint64{0},
			wantSink:  []sinkCall{{3, map[string]string{}, 0, nil, nil}},
			wantIndex: 3,
		},
		{
			name: "keys are relative; the prefix and folder keys are ignored",
			replies: []reply{{index: 7, pairs: api.KVPairs{
				folder("hastate/"), folder("hastate/state/"), folder("hastate/state/web/"),
				kvp("hastate/state/web/a", "drain"), kvp("hastate/state/web/*", "maint"),
				kvp("hastate/state/web/empty", ""),
			}}},
			wantWaits: []uint64{0},
			wantSink: []sinkCall{{7, map[string]string{
				"state/web/a": "drain", "state/web/*": "maint", "state/web/empty": "",
			}, 0, nil, nil}},
			wantIndex: 7,
		},
		{
			name:      "unchanged index waits again without a sink call",
			replies:   []reply{{pairs: a, index: 10}, {pairs: a, index: 10}, {pairs: a, index: 10}},
			wantWaits: []uint64{0, 10, 10},
			wantSink:  []sinkCall{{10, aMap, 0, nil, nil}},
			wantIndex: 10,
		},
		{
			name:      "a new index with equal data does not call the sink",
			replies:   []reply{{pairs: a, index: 10}, {pairs: a, index: 12}, {pairs: b, index: 13}},
			wantWaits: []uint64{0, 10, 12},
			wantSink:  []sinkCall{{10, aMap, 0, nil, nil}, {13, bMap, 10, []string{"state/web/b"}, nil}},
			wantIndex: 13,
		},
		{
			name:      "an index that goes backwards resets to 0",
			replies:   []reply{{pairs: a, index: 10}, {pairs: a, index: 20}, {pairs: b, index: 5}, {pairs: b, index: 6}},
			wantWaits: []uint64{0, 10, 20, 0},
			wantSink:  []sinkCall{{10, aMap, 0, nil, nil}, {6, bMap, 10, []string{"state/web/b"}, nil}},
			wantIndex: 6,
		},
		{
			name:      "after a reset equal data does not call the sink",
			replies:   []reply{{pairs: a, index: 10}, {pairs: a, index: 4}, {pairs: a, index: 4}},
			wantWaits: []uint64{0, 10, 0},
			wantSink:  []sinkCall{{10, aMap, 0, nil, nil}},
			wantIndex: 4,
		},
		{
			name:      "index 0 is not Consul's answer: refused, retried without blocking",
			replies:   []reply{{pairs: a, index: 10}, {pairs: b, index: 0}, {pairs: b, index: 11}},
			wantWaits: []uint64{0, 10, 0},
			wantSink:  []sinkCall{{10, aMap, 0, nil, nil}, {11, bMap, 10, []string{"state/web/b"}, nil}},
			wantIndex: 11,
		},
		{
			name:      "consul errors are retried without blocking, compared with the held read",
			replies:   []reply{{pairs: a, index: 10}, {drop: true}, {drop: true}, {pairs: b, index: 11}},
			wantWaits: []uint64{0, 10, 0, 0},
			wantSink:  []sinkCall{{10, aMap, 0, nil, nil}, {11, bMap, 10, []string{"state/web/b"}, nil}},
			wantIndex: 11,
		},
		{
			name:      "a failed first sink call is retried with a fresh full read",
			replies:   []reply{{pairs: a, index: 10}, {pairs: a, index: 11}, {pairs: b, index: 12}},
			sinkFails: []int{0},
			wantWaits: []uint64{0, 0, 11},
			wantSink:  []sinkCall{{10, aMap, 0, nil, errSink}, {11, aMap, 0, nil, nil}, {12, bMap, 11, []string{"state/web/b"}, nil}},
			wantIndex: 12,
		},
		{
			name:      "a failed sink call keeps the last delivered index",
			replies:   []reply{{pairs: a, index: 10}, {pairs: b, index: 11}, {pairs: b, index: 11}},
			sinkFails: []int{1},
			wantWaits: []uint64{0, 10, 0},
			// The refused read was merged into the held map, so the
			// Watcher drops what it held: the retry is a full read
			// with no base (the Sink compares it in full).
			wantSink:  []sinkCall{{10, aMap, 0, nil, nil}, {11, bMap, 10, []string{"state/web/b"}, errSink}, {11, bMap, 0, nil, nil}},
			wantIndex: 11,
		},
		{
			name:      "a read filtered by ACLs is not applied",
			replies:   []reply{{pairs: a, index: 10, filtered: true}, {pairs: b, index: 11}},
			wantWaits: []uint64{0, 0},
			wantSink:  []sinkCall{{11, bMap, 0, nil, nil}},
			wantIndex: 11,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			fake := newScript(t, time.Second, tt.replies...)
			sink := &recSink{fail: func(n int) error {
				if slices.Contains(tt.sinkFails, n) {
					return errSink
				}
				return nil
			}}
			w, err := New(fastOptions(fake.client(), sink))
			if err != nil {
				t.Fatal(err)
			}
			stop := runWatcher(t, w)
			fake.exhausted(t)
			stop()

			if got := fake.waitIndexes(); !slices.Equal(got, tt.wantWaits) {
				t.Errorf("wait indexes = %v, want %v", got, tt.wantWaits)
			}
			got := sink.all()
			if !slices.EqualFunc(got, tt.wantSink, func(x, y sinkCall) bool {
				return x.index == y.index && maps.Equal(x.kv, y.kv) && x.base == y.base && slices.Equal(x.changed, y.changed) && errors.Is(x.err, y.err)
			}) {
				t.Errorf("sink calls = %v, want %v", got, tt.wantSink)
			}
			st := w.Status()
			if st.Index != tt.wantIndex || !st.Reachable || st.ConsecutiveErrors != 0 || st.LastSuccess.IsZero() {
				t.Errorf("status = %+v, want index %d, reachable, no errors, a last success", st, tt.wantIndex)
			}
		})
	}
}

func TestWatcherErrorsBackOffLogAndRecover(t *testing.T) {
	t.Parallel()
	replies := []reply{
		{drop: true}, {drop: true}, {drop: true}, {drop: true}, {drop: true},
		{status: 403, body: "Permission denied"},
		{index: 9, pairs: api.KVPairs{kvp("hastate/k", "v")}},
	}
	fake := newScript(t, time.Second, replies...)
	core, logs := observer.New(zapcore.DebugLevel)
	reg := prometheus.NewRegistry()
	now := time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)
	sink := &recSink{}
	o := fastOptions(fake.client(), sink)
	o.Logger = zap.New(core)
	o.Metrics = NewMetrics(reg)
	o.Now = func() time.Time { return now }
	w, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	stop := runWatcher(t, w)
	fake.exhausted(t)
	stop()

	errLines := logs.FilterLevelExact(zapcore.ErrorLevel).All()
	if len(errLines) != 6 {
		t.Fatalf("got %d error lines, want one per failed attempt (6): %v", len(errLines), errLines)
	}
	for i, e := range errLines {
		f := e.ContextMap()
		want := Backoff(i, o.BackoffBase, o.BackoffMax)
		if f["attempt"] != int64(i+1) || f["retry_in"] != want || f["kv_prefix"] != "hastate/" {
			t.Errorf("error line %d fields = %v, want attempt %d, retry_in %s, kv_prefix", i, f, i+1, want)
		}
	}
	if m := errLines[0].Message; !strings.Contains(m, "CONSUL_HTTP_ADDR") || !strings.Contains(m, "--consul-addr") {
		t.Errorf("connection error line %q does not say what to check", m)
	}
	if m := errLines[5].Message; !strings.Contains(m, "CONSUL_HTTP_TOKEN") {
		t.Errorf("403 error line %q does not point at the token", m)
	}
	if n := logs.FilterMessageSnippet("recovered").FilterField(zap.Int("failed_attempts", 6)).Len(); n != 1 {
		t.Errorf("got %d recovery lines with failed_attempts=6, want 1", n)
	}

	st := w.Status()
	if !st.Reachable || st.ConsecutiveErrors != 0 || st.Index != 9 || !st.LastSuccess.Equal(now) ||
		!strings.Contains(st.LastError, "Permission denied") || !st.LastErrorTime.Equal(now) {
		t.Errorf("status = %+v", st)
	}
	for name, want := range map[string]float64{
		"hastate_kv_sync_errors_total":              6,
		"hastate_kv_updates_total":                  1,
		"hastate_kv_watch_reachable":                1,
		"hastate_kv_index":                          9,
		"hastate_kv_keys":                           1,
		"hastate_kv_last_success_timestamp_seconds": float64(now.Unix()),
	} {
		if got := gauge(t, reg, name); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
}

func TestWatcherStatusWhileFailing(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln.Close() // nothing listens there: connection refused
	client, err := NewClient(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	o := fastOptions(client, &recSink{})
	o.Metrics = NewMetrics(reg)
	w, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	runWatcher(t, w)
	testenv.Eventually(t, 5*time.Second, func() error { return testenv.Expect(w.Status().ConsecutiveErrors >= 3, "3 failed attempts") })
	st := w.Status()
	if st.Reachable || !st.LastSuccess.IsZero() || !strings.Contains(st.LastError, "connection refused") {
		t.Errorf("status = %+v, want unreachable, never succeeded, the error", st)
	}
	if got := gauge(t, reg, "hastate_kv_watch_reachable"); got != 0 {
		t.Errorf("hastate_kv_watch_reachable = %v, want 0", got)
	}
}

func TestWatcherAbandonsHungCall(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 { // a half-open connection: never answers
			<-r.Context().Done()
			return
		}
		serveReply(t, rw, reply{index: 3})
	}))
	t.Cleanup(srv.Close)
	client, err := NewClient(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	sink := &recSink{}
	o := fastOptions(client, sink)
	o.WaitTime = 10 * time.Millisecond
	w, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	w.slack = 10 * time.Millisecond
	runWatcher(t, w)
	testenv.Eventually(t, 5*time.Second, func() error { return testenv.Expect(len(sink.delivered()) == 1, "delivery after the hung call") })
	if st := w.Status(); !strings.Contains(st.LastError, "no answer within") {
		t.Errorf("LastError = %q, want it to say the call was abandoned", st.LastError)
	}
}

func TestRunTwiceConcurrently(t *testing.T) {
	t.Parallel()
	fake := newScript(t, time.Second)
	w, err := New(fastOptions(fake.client(), &recSink{}))
	if err != nil {
		t.Fatal(err)
	}
	stop := runWatcher(t, w)
	fake.exhausted(t) // the first Run is inside List
	if err := w.Run(t.Context()); !errors.Is(err, ErrRunning) {
		t.Errorf("second Run = %v, want ErrRunning", err)
	}
	stop()
	// After it returned, the Watcher may run again: a new term.
	fake2 := newScript(t, time.Second, reply{index: 5})
	sink := &recSink{}
	w2, _ := New(fastOptions(fake2.client(), sink))
	stop2 := runWatcher(t, w2)
	fake2.exhausted(t)
	stop2()
	if len(sink.delivered()) != 1 {
		t.Errorf("sink calls = %v, want one", sink.all())
	}
}

// NewMetrics registers the six hastate_kv_* series once per registry (the
// wiring's, shared by every Watcher); a second registration is a
// programming error and panics, as MustRegister does. A nil registry
// leaves them unregistered.
func TestMetricsRegisterOnce(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	m.updates.Inc()
	if got := testutil.ToFloat64(m.updates); got != 1 {
		t.Errorf("hastate_kv_updates_total = %v, want 1", got)
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("a second NewMetrics on the same registry did not panic")
			}
		}()
		NewMetrics(reg)
	}()
	NewMetrics(nil).updates.Inc() // unregistered, and usable
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, mf := range mfs {
		names = append(names, mf.GetName())
	}
	want := []string{
		"hastate_kv_index",
		"hastate_kv_keys",
		"hastate_kv_last_success_timestamp_seconds",
		"hastate_kv_sync_errors_total",
		"hastate_kv_updates_total",
		"hastate_kv_watch_reachable",
	}
	if !slices.Equal(names, want) {
		t.Errorf("metric names = %v, want %v", names, want)
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	t.Parallel()
	client, err := api.NewClient(api.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	good := func() Options { return Options{Client: client, Prefix: "hastate/", Sink: &recSink{}} }
	tests := []struct {
		name   string
		mutate func(*Options)
		want   string // in the error; "" means valid
	}{
		{"valid", func(*Options) {}, ""},
		{"custom prefix", func(o *Options) { o.Prefix = "gitlab-haproxy-agent/" }, ""},
		{"no client", func(o *Options) { o.Client = nil }, "Client is required"},
		{"no prefix", func(o *Options) { o.Prefix = "" }, "prefix is empty"},
		{"prefix without slash", func(o *Options) { o.Prefix = "hastate" }, `try "hastate/"`},
		{"prefix with leading slash", func(o *Options) { o.Prefix = "/hastate/" }, `try "hastate/"`},
		{"no sink", func(o *Options) { o.Sink = nil }, "Sink is required"},
		{"negative wait", func(o *Options) { o.WaitTime = -time.Second }, "WaitTime -1s is negative"},
		{"wait above consul limit", func(o *Options) { o.WaitTime = 11 * time.Minute }, "10m limit"},
		{"negative gap", func(o *Options) { o.MinGap = -1 }, "MinGap"},
		{"negative backoff", func(o *Options) { o.BackoffBase, o.BackoffMax = -1, -1 }, "BackoffMax"},
	}
	for _, tt := range tests {
		o := good()
		tt.mutate(&o)
		w, err := New(o)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%s: New: %v", tt.name, err)
		case tt.want == "" && w == nil:
			t.Errorf("%s: New returned no watcher", tt.name)
		case tt.want != "" && (!errors.Is(err, ErrInvalidOptions) || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%s: New error = %v, want ErrInvalidOptions mentioning %q", tt.name, err, tt.want)
		}
	}
}

func TestNewDefaults(t *testing.T) {
	t.Parallel()
	client, err := NewClient("127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	w, err := New(Options{Client: client, Prefix: "hastate/", Sink: &recSink{}, BackoffBase: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	o := w.o
	if o.WaitTime != 60*time.Second || o.MinGap != 50*time.Millisecond || o.BackoffBase != time.Minute ||
		o.BackoffMax != time.Minute || o.Logger == nil || o.Metrics == nil || o.Now == nil {
		t.Errorf("defaults not applied: %+v", o)
	}
}

func TestClientConfig(t *testing.T) {
	// Not parallel: it sets environment variables.
	t.Setenv("CONSUL_HTTP_ADDR", "consul.example:8500")
	t.Setenv("CONSUL_HTTP_TOKEN", "secret-token")
	t.Setenv("CONSUL_HTTP_SSL", "true")
	tests := []struct {
		addr, wantAddr, wantScheme string
	}{
		{"", "consul.example:8500", "https"},
		{"10.0.0.1:8500", "10.0.0.1:8500", "https"},
		{"http://10.0.0.1:8500", "10.0.0.1:8500", "http"},
		{"https://consul.internal:8501/", "consul.internal:8501", "https"},
		{"unix:///run/consul.sock", "unix:///run/consul.sock", "https"},
	}
	for _, tt := range tests {
		cfg := ClientConfig(tt.addr)
		if cfg.Address != tt.wantAddr || cfg.Scheme != tt.wantScheme || cfg.Token != "secret-token" {
			t.Errorf("ClientConfig(%q) = address %q scheme %q token %q, want %q %q and the env token",
				tt.addr, cfg.Address, cfg.Scheme, cfg.Token, tt.wantAddr, tt.wantScheme)
		}
	}
}

// gauge reads one unlabelled series from reg.
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		m := mf.GetMetric()[0]
		if c := m.GetCounter(); c != nil {
			return c.GetValue()
		}
		return m.GetGauge().GetValue()
	}
	t.Fatalf("metric %s not registered", name)
	return 0
}

// TestReadAfterIndexBehindIsMarkedReread: the Sink (the raft leader)
// refuses a read of the recorded cluster below the index it holds until
// Consul confirmed it; the watch's next read (consistent, at index 0) is
// that confirmation and says so (state.KVRead.Reread), once: the read
// after it is an ordinary one again.
func TestReadAfterIndexBehindIsMarkedReread(t *testing.T) {
	t.Parallel()
	a := api.KVPairs{kvp("hastate/state/web/a", "drain")}
	b := api.KVPairs{kvp("hastate/state/web/a", "drain"), kvp("hastate/state/web/b", "maint")}
	fake := newScript(t, time.Second, reply{pairs: a, index: 10}, reply{pairs: a, index: 10}, reply{pairs: b, index: 11})
	// The Sink refuses the first read as behind the index it holds.
	sink := &recSink{fail: func(n int) error {
		if n == 0 {
			return fmt.Errorf("%w: Consul index 10, the mirror holds 12", state.ErrIndexBehind)
		}
		return nil
	}}
	w, err := New(fastOptions(fake.client(), sink))
	if err != nil {
		t.Fatal(err)
	}
	stop := runWatcher(t, w)
	fake.exhausted(t)
	stop()
	var got []bool
	for _, r := range sink.allReads() {
		got = append(got, r.Reread)
	}
	if want := []bool{false, true, false}; !slices.Equal(got, want) {
		t.Errorf("Reread of the Sink's calls = %v, want %v (refused as behind, read again, then an ordinary read)", got, want)
	}
}
