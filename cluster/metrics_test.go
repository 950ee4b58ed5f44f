package cluster

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/hastate/hastate/cluster/fsm"
	"github.com/hastate/hastate/internal/testenv/raftenv"
	"github.com/hastate/hastate/state"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// serverSeries collects only the per-server series of one snapshot.
type serverSeries struct {
	m    *metrics
	snap *state.Snapshot
}

func (c serverSeries) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.m.serverState, c.m.serverSince, c.m.serverWeight, c.m.rampStepDue, c.m.rampInterval} {
		ch <- d
	}
}

func (c serverSeries) Collect(ch chan<- prometheus.Metric) { c.m.collectServers(ch, c.snap) }

// The FSM takes each key's since from the entry that changed its state (the
// leader's At), keeps it across a snapshot, and the per-server series show
// only servers with a non-default state: drain, maint, a weight, a ramp or
// a withheld answer, with their state, since and weight.
func TestServerSeriesFromEntries(t *testing.T) {
	f := fsm.New(fsm.Options{})
	t1 := time.Date(2026, 11, 30, 3, 0, 0, 0, time.UTC) // 1796007600
	p := state.RampPolicy{Start: 10, Duration: 10 * time.Minute, Interval: 10 * time.Second, Aggression: 1}
	kv := func(i uint64, at time.Time, c state.Change) {
		t.Helper()
		if res := f.Apply(&raft.Log{Type: raft.LogCommand, Index: i, Data: entry(t, fsm.Command{Type: fsm.CmdKV, KVIndex: i, At: at, Ramp: p, Change: c})}); res != nil {
			if err, ok := res.(error); ok {
				t.Fatal(err)
			}
		}
	}
	kv(1, t1, state.Change{Set: map[string]string{
		"state/web/a": `{"state":"drain","by":"alice","reason":"zone b"}`, "state/web/b": "maint", "state/web/c": "0%",
		"state/web/d": "ready", "state/web/e": "nonsense", "state/web/r": "drain", "state/api/*": "drain",
	}})
	// A new reason is no new state; web/r is undrained and ramps.
	kv(2, t1.Add(time.Hour), state.Change{Set: map[string]string{"state/web/a": `{"state":"drain","by":"bob"}`}, Delete: []string{"state/web/r"}})

	// Through a snapshot, as a restarted replica has it.
	g := fsm.New(fsm.Options{})
	raftenv.Snapshot(t, f, g)
	want := `
# HELP hastate_server_state x
# TYPE hastate_server_state gauge
hastate_server_state{backend="api",by="",server="*",state="drain"} 1
hastate_server_state{backend="web",by="bob",server="a",state="drain"} 1
hastate_server_state{backend="web",by="",server="b",state="maint"} 1
hastate_server_state{backend="web",by="",server="c",state="weight"} 1
hastate_server_state{backend="web",by="",server="e",state="withheld"} 1
hastate_server_state{backend="web",by="",server="r",state="ramping"} 1
# HELP hastate_server_state_since_timestamp_seconds x
# TYPE hastate_server_state_since_timestamp_seconds gauge
hastate_server_state_since_timestamp_seconds{backend="api",server="*",state="drain"} 1.7960076e+09
hastate_server_state_since_timestamp_seconds{backend="web",server="a",state="drain"} 1.7960076e+09
hastate_server_state_since_timestamp_seconds{backend="web",server="b",state="maint"} 1.7960076e+09
hastate_server_state_since_timestamp_seconds{backend="web",server="c",state="weight"} 1.7960076e+09
hastate_server_state_since_timestamp_seconds{backend="web",server="r",state="ramping"} 1.7960112e+09
# HELP hastate_server_weight_percent x
# TYPE hastate_server_weight_percent gauge
hastate_server_weight_percent{backend="web",server="c"} 0
hastate_server_weight_percent{backend="web",server="r"} 10
# HELP hastate_ramp_step_due_timestamp_seconds x
# TYPE hastate_ramp_step_due_timestamp_seconds gauge
hastate_ramp_step_due_timestamp_seconds{backend="web",server="r"} 1.79601121e+09
# HELP hastate_ramp_interval_seconds x
# TYPE hastate_ramp_interval_seconds gauge
hastate_ramp_interval_seconds{backend="web",server="r"} 10
`
	// Compare values and labels, not HELP texts.
	m := newMetrics(nil)
	for _, x := range []*fsm.FSM{f, g} {
		got := testutil.CollectAndCount(serverSeries{m, x.Serving()})
		if got != 15 { // 6 states, 5 since (withheld has none), 2 weights, 2 ramp series
			t.Errorf("%d per-server series, want 15", got)
		}
		if err := testutil.CollectAndCompare(serverSeries{withHelp(m, "x"), x.Serving()}, strings.NewReader(want)); err != nil {
			t.Error(err)
		}
	}

	// A version 3 snapshot (before since) restores with since unknown:
	// no since series until the key changes again.
	v3 := `{"version":3,"kv_index":9,"index":4,"mirror":{"synced":true,"kv":{"state/a/b":"drain"}}}`
	h := fsm.New(fsm.Options{})
	if err := h.Restore(io.NopCloser(strings.NewReader(v3))); err != nil {
		t.Fatalf("restoring a version 3 snapshot: %v", err)
	}
	if n := testutil.CollectAndCount(serverSeries{m, h.Serving()}, "hastate_server_state_since_timestamp_seconds"); n != 0 {
		t.Errorf("%d since series after a version 3 snapshot, want none", n)
	}
	if n := testutil.CollectAndCount(serverSeries{m, h.Serving()}, "hastate_server_state"); n != 1 {
		t.Errorf("%d state series after a version 3 snapshot, want 1", n)
	}
}

// withHelp returns a copy of m whose per-server descriptors carry help, so
// that a comparison does not repeat the HELP texts.
func withHelp(m *metrics, help string) *metrics {
	c := *m
	c.serverState = prometheus.NewDesc("hastate_server_state", help, []string{"backend", "server", "state", "by"}, nil)
	c.serverSince = prometheus.NewDesc("hastate_server_state_since_timestamp_seconds", help, []string{"backend", "server", "state"}, nil)
	c.serverWeight = prometheus.NewDesc("hastate_server_weight_percent", help, []string{"backend", "server"}, nil)
	c.rampStepDue = prometheus.NewDesc("hastate_ramp_step_due_timestamp_seconds", help, []string{"backend", "server"}, nil)
	c.rampInterval = prometheus.NewDesc("hastate_ramp_interval_seconds", help, []string{"backend", "server"}, nil)
	return &c
}

func TestCutLabel(t *testing.T) {
	for _, c := range []struct {
		in   string
		n    int
		want string
	}{{"alice", 64, "alice"}, {"abcd", 2, "ab"}, {"ééé", 3, "é"}} { // é is 2 bytes
		if got := cutLabel(c.in, c.n); got != c.want {
			t.Errorf("cutLabel(%q, %d) = %q, want %q", c.in, c.n, got, c.want)
		}
	}
}
