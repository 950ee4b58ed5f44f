package server

import (
	"encoding/json"
	"fmt"
	"github.com/hastate/hastate/api"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/hastate/hastate/state"
	"github.com/prometheus/client_golang/prometheus"
)

// fakeReplica is a Replica made of function fields.
type fakeReplica struct {
	snap  func() *state.Snapshot
	ready func() (bool, string)
	peers func() []api.Poll // nil: one poll from "peer"
	// down names peers that do not answer.
	down []string
	// cluster and kv answer ClusterInfo and KVStatus (nil: node n1 with
	// no members, a watching KV status).
	cluster func() api.ClusterInfo
	kv      func() api.KVStatus
	// recorded is the record of HAProxy nodes (nil: not kept yet) and
	// sightings what "peer" saw.
	recorded  state.HAProxies
	sightings map[string]time.Time
}

var _ Replica = (*fakeReplica)(nil)

func (f *fakeReplica) Snapshot() *state.Snapshot { return f.snap() }
func (f *fakeReplica) Ready() (bool, string)     { return f.ready() }
func (f *fakeReplica) ClusterInfo() api.ClusterInfo {
	if f.cluster != nil {
		return f.cluster()
	}
	return api.ClusterInfo{NodeID: "n1"}
}

func (f *fakeReplica) KVStatus() api.KVStatus {
	if f.kv != nil {
		return f.kv()
	}
	return api.KVStatus{Watching: true}
}
func (f *fakeReplica) PeerPollers(q PollsArg) ([]api.Poll, int, []api.ReplicaAnswer) {
	answered := []api.ReplicaAnswer{{ID: "peer", Answered: true}}
	for _, d := range f.down {
		answered = append(answered, api.ReplicaAnswer{ID: d, Error: "connection refused"})
	}
	polls := []api.Poll{{HAProxy: "127.0.0.9", Backend: "web", Server: "z", Answer: "ready 100%", Replica: "peer"}}
	if f.peers != nil {
		polls = f.peers()
	}
	rows, total := SelectPolls(polls, q)
	return rows, total, answered
}

// PeerSummaries summarizes PeerPollers' polls, through the wire form.
func (f *fakeReplica) PeerSummaries(q SummaryArg) ([]PollSummary, []api.ReplicaAnswer) {
	polls, _, answered := f.PeerPollers(PollsArg{Selectors: q.Selectors})
	raw, err := json.Marshal(SummarizePolls(polls, q))
	if err != nil {
		panic(err)
	}
	var sum PollSummary
	if err := json.Unmarshal(raw, &sum); err != nil {
		panic(err)
	}
	return []PollSummary{sum}, answered
}

func (f *fakeReplica) Recorded() (state.HAProxies, bool) {
	if f.recorded == nil {
		return state.HAProxies{}, false
	}
	return f.recorded, true
}

func (f *fakeReplica) PeerSightings() (map[string]map[string]time.Time, []api.ReplicaAnswer) {
	answered := []api.ReplicaAnswer{{ID: "peer", Answered: true}}
	for _, d := range f.down {
		answered = append(answered, api.ReplicaAnswer{ID: d, Error: "connection refused"})
	}
	return map[string]map[string]time.Time{"peer": f.sightings}, answered
}

func get(t *testing.T, h http.Handler, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	b, _ := io.ReadAll(rec.Result().Body)
	return rec.Code, string(b)
}

func TestHTTPAPI(t *testing.T) {
	m := state.NewMirror()
	m.Apply(state.Change{Set: map[string]string{
		"state/web/a": `{"state":"drain","reason":"zonal","by":"alice"}`,
		"state/web/*": "maint",
		"state/api/x": "300%",
		"state/bad":   "drain",
	}})
	var snap *state.Snapshot
	ready := false
	h := NewHTTPHandler(HTTPOptions{Replica: &fakeReplica{
		snap:  func() *state.Snapshot { return snap },
		ready: func() (bool, string) { return ready, "detail here" },
	}, Gatherer: prometheus.NewRegistry()})

	if code, body := get(t, h, "/-/readiness"); code != 503 || !strings.Contains(body, "detail here") {
		t.Fatalf("readiness before state: %d %s", code, body)
	}
	if code, body := get(t, h, "/v1/state/web/a"); code != 200 || !strings.Contains(body, `"withheld": true`) || !strings.Contains(body, "no-state") {
		t.Fatalf("state without snapshot: %d %s", code, body)
	}
	snap, ready = m.Snapshot(), true
	if code, _ := get(t, h, "/-/readiness"); code != 200 {
		t.Fatal("readiness not 200")
	}
	if code, body := get(t, h, "/-/liveness"); code != 200 || body != "ok\n" {
		t.Fatalf("liveness %d %q", code, body)
	}
	if code, _ := get(t, h, "/-/metrics"); code != 200 {
		t.Fatal("metrics not served")
	}

	code, body := get(t, h, "/v1/state")
	var v api.StateView
	if err := json.Unmarshal([]byte(body), &v); err != nil || code != 200 {
		t.Fatalf("/v1/state: %d %v %s", code, err, body)
	}
	rows := map[string]api.ServerState{}
	for _, r := range v.Servers {
		rows[r.Backend+"/"+r.Server] = r
	}
	if r := rows["web/a"]; r.Answer != "drain" || r.Reason != "zonal" || r.By != "alice" || r.Source != "state/web/a" {
		t.Errorf("web/a row: %+v", r)
	}
	if r := rows["web/*"]; r.Answer != "maint" {
		t.Errorf("web/* row: %+v", r)
	}
	if r := rows["api/x"]; r.Valid || !r.Withheld || !strings.Contains(r.Error, "256") {
		t.Errorf("api/x row: %+v", r)
	}
	if len(v.InvalidKeys) != 2 {
		t.Errorf("invalid keys: %+v", v.InvalidKeys)
	}

	for path, want := range map[string]string{
		"/v1/state/web/b":   `"answer": "maint"`, // from the wildcard
		"/v1/state/other/z": `"source": "absent"`,
	} {
		if code, body := get(t, h, path); code != 200 || !strings.Contains(body, want) {
			t.Errorf("%s: %d %s, want %s", path, code, body, want)
		}
	}
	if code, body := get(t, h, "/"); code != 200 || !strings.Contains(body, "zonal") {
		t.Errorf("status page: %d", code)
	}
	if code, _ := get(t, h, "/nope"); code != 404 {
		t.Errorf("unknown path: %d", code)
	}
}

func TestHTTPStateShowsRamps(t *testing.T) {
	m := state.NewMirror()
	p := state.RampPolicy{Start: 10, Duration: time.Minute, Interval: time.Second, Aggression: 1}
	at := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	m.ApplyAt(state.Change{Set: map[string]string{"state/web/a": "drain", "state/api/*": "drain"}}, at, p)
	m.ApplyAt(state.Change{Delete: []string{"state/web/a", "state/api/*"}}, at, p)
	snap := m.Snapshot()
	h := NewHTTPHandler(HTTPOptions{Replica: &fakeReplica{
		snap:  func() *state.Snapshot { return snap },
		ready: func() (bool, string) { return true, "" },
	}})
	_, body := get(t, h, "/v1/state")
	var v api.StateView
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatal(err)
	}
	if len(v.Servers) != 2 {
		t.Fatalf("servers %+v, want the two ramp targets although their keys are gone", v.Servers)
	}
	for _, r := range v.Servers {
		if r.Ramping == nil || r.Ramping.WeightPercent != 10 || !r.Ramping.ETA.Equal(at.Add(time.Minute)) || r.Answer != "ready 10%" {
			t.Errorf("row %+v ramping %+v", r, r.Ramping)
		}
	}
	if _, body := get(t, h, "/v1/state/api/any"); !strings.Contains(body, `"target": "api/*"`) {
		t.Errorf("a server under a ramping wildcard: %s", body)
	}
}

// ?scope=cluster: the servers other replicas' HAProxy nodes polled, how
// many HAProxy nodes poll each server and how many were told its current
// answer (the latest poll of each counts), and which replicas answered.
func TestStateClusterScope(t *testing.T) {
	m := state.NewMirror()
	m.Apply(state.Change{Set: map[string]string{"state/web/a": "drain"}})
	snap := m.Snapshot()
	p := newPollers(t, PollersOptions{})
	now := time.Now()
	p.Record(&net.TCPAddr{IP: net.ParseIP("127.0.0.2")}, []byte("web/a"), []byte("drain\n"), now)
	p.Record(&net.TCPAddr{IP: net.ParseIP("127.0.0.3")}, []byte("web/a"), []byte("ready 100%\n"), now.Add(-time.Second))
	p.Record(&net.TCPAddr{IP: net.ParseIP("127.0.0.4")}, []byte("web/a"), []byte("drain\n"), now.Add(-2*api.PollerTTL))
	h := NewHTTPHandler(HTTPOptions{Pollers: p, NodeID: "self", Replica: &fakeReplica{
		snap:  func() *state.Snapshot { return snap },
		ready: func() (bool, string) { return true, "" },
		peers: func() []api.Poll {
			return []api.Poll{
				// Newer than 127.0.0.3's poll here: it now knows drain.
				{HAProxy: "127.0.0.3", Backend: "web", Server: "a", Answer: "drain", LastAsked: now, Replica: "peer"},
				{HAProxy: "127.0.0.5", Backend: "web", Server: "b", Answer: "ready 100%", LastAsked: now, Replica: "peer"},
			}
		},
		down: []string{"hs3"},
	}})
	var local, cluster api.StateView
	for path, v := range map[string]*api.StateView{"/v1/state": &local, "/v1/state?scope=cluster": &cluster} {
		code, body := get(t, h, path)
		if code != http.StatusOK || json.Unmarshal([]byte(body), v) != nil {
			t.Fatalf("%s: %d %s", path, code, body)
		}
	}
	rows := func(v api.StateView) string {
		var s []string
		for _, r := range v.Servers {
			s = append(s, fmt.Sprintf("%s/%s %s told %d/%d", r.Backend, r.Server, r.Answer, r.Told, r.Polled))
		}
		return strings.Join(s, "; ")
	}
	if got, want := rows(local), "web/a drain told 1/2"; local.Scope != "replica" || got != want || local.Replicas != nil {
		t.Errorf("replica scope %s: %q, want %q", local.Scope, got, want)
	}
	if got, want := rows(cluster), "web/a drain told 2/2; web/b ready 100% told 1/1"; cluster.Scope != "cluster" || got != want {
		t.Errorf("cluster scope: %q, want %q", got, want)
	}
	if got := fmt.Sprint(cluster.Replicas); got != "[{hs3 false connection refused} {peer true } {self true }]" {
		t.Errorf("replicas %s, want hs3 missing and the others answered", got)
	}
	if code, _ := get(t, h, "/v1/state?scope=fleet"); code != http.StatusBadRequest {
		t.Errorf("?scope=fleet: %d, want 400", code)
	}
}

// Every row says since when its state holds, on the leader's clock: a
// key's since, a ramp's start; the default ready row has none.
func TestHTTPStateShowsSince(t *testing.T) {
	m := state.NewMirror()
	p := state.RampPolicy{Start: 10, Duration: time.Minute, Interval: time.Second, Aggression: 1}
	t1 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	m.ApplyAt(state.Change{Set: map[string]string{"state/web/a": "drain", "state/web/r": "drain", "state/web/d": "ready"}}, t1, p)
	m.ApplyAt(state.Change{Delete: []string{"state/web/r"}}, t1.Add(time.Hour), p)
	snap := m.Snapshot()
	h := NewHTTPHandler(HTTPOptions{Replica: &fakeReplica{
		snap:  func() *state.Snapshot { return snap },
		ready: func() (bool, string) { return true, "" },
	}})
	for path, want := range map[string]string{
		"/v1/state/web/a":     `"since": "2026-11-30T12:00:00Z"`,
		"/v1/state/web/r":     `"since": "2026-11-30T13:00:00Z"`,
		"/v1/state/web/d":     `"since": "2026-11-30T12:00:00Z"`,
		"/v1/state/web/other": "",
	} {
		_, body := get(t, h, path)
		if want == "" {
			if strings.Contains(body, `"since"`) {
				t.Errorf("%s: a default row has no since: %s", path, body)
			}
		} else if !strings.Contains(body, want) {
			t.Errorf("%s: want %s in %s", path, want, body)
		}
	}
}

// Issue 15.2: a source that asked once, longer than api.ProbeGrace ago (an
// nc from an operator's host) makes no server known and counts in no
// "told"; an HAProxy whose checks are spread over two replicas does.
func TestHTTPStateManualProbeIsNoHAProxy(t *testing.T) {
	m := state.NewMirror()
	m.Apply(state.Change{Set: map[string]string{"state/web/a": "drain"}})
	snap := m.Snapshot()
	now := time.Now()
	local := newPollers(t, PollersOptions{})
	ha := &net.TCPAddr{IP: net.ParseIP("127.0.0.7"), Port: 4000}
	local.Record(ha, []byte("web/z"), []byte("ready 100%\n"), now.Add(-3*time.Second))
	h := NewHTTPHandler(HTTPOptions{Pollers: local, NodeID: "n1", Replica: &fakeReplica{
		snap:  func() *state.Snapshot { return snap },
		ready: func() (bool, string) { return true, "" },
		peers: func() []api.Poll {
			return []api.Poll{
				{HAProxy: "127.0.0.9", Backend: "web", Server: "typo-srv", Answer: "ready 100%", Replica: "peer", LastAsked: now.Add(-20 * time.Second), Count: 1},
				{HAProxy: "127.0.0.9", Backend: "web", Server: "a", Answer: "ready 100%", Replica: "peer", LastAsked: now.Add(-20 * time.Second), Count: 1},
				{HAProxy: "127.0.0.7", Backend: "web", Server: "z", Answer: "ready 100%", Replica: "peer", LastAsked: now.Add(-time.Second), Count: 1},
			}
		},
	}})
	_, body := get(t, h, "/v1/state?scope=cluster")
	var v api.StateView
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatal(err)
	}
	rows := map[string]api.ServerState{}
	for _, r := range v.Servers {
		rows[r.Backend+"/"+r.Server] = r
	}
	if r, ok := rows["web/typo-srv"]; ok {
		t.Errorf("a server probed once by hand is known: %+v", r)
	}
	if r := rows["web/a"]; r.Polled != 0 || r.Told != 0 {
		t.Errorf("web/a probed once by hand: polled %d, told %d; want 0 and 0", r.Polled, r.Told)
	}
	if r := rows["web/z"]; r.Polled != 1 || r.Told != 1 {
		t.Errorf("web/z, an HAProxy over two replicas: polled %d, told %d; want 1 and 1 (%+v)", r.Polled, r.Told, r)
	}
}

// api.Kind is state.Kind's wire form (issue 27.18): rowFor converts one to
// the other, so the two lists must name the same kinds.
func TestKindsAgree(t *testing.T) {
	pairs := map[state.Kind]api.Kind{
		state.KindReady: api.KindReady, state.KindDrain: api.KindDrain, state.KindMaint: api.KindMaint,
		state.KindWeight: api.KindWeight, state.KindRamping: api.KindRamping, state.KindWithheld: api.KindWithheld,
	}
	for s, a := range pairs {
		if api.Kind(s) != a {
			t.Errorf("state.Kind %q is api.Kind %q on the wire", s, a)
		}
	}
}
