package server

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/state"
)

// fleetFixture: 20 backends of 10 servers; 3 HAProxy sources polled every
// server on this replica, and a peer holds one more source's polls of
// every server.
func fleetFixture(t *testing.T) (http.Handler, *fakeReplica) {
	t.Helper()
	m := state.NewMirror()
	m.Apply(state.Change{Set: map[string]string{"state/b003/s0004": "drain", "state/b007/*": "maint"}})
	snap := m.Snapshot()
	p := newPollers(t, PollersOptions{})
	now := time.Now()
	var peer []api.Poll
	for b := range 20 {
		for s := range 10 {
			req := fmt.Sprintf("b%03d/s%04d", b, s)
			for h := range 3 {
				p.Record(&net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(10+h))}, []byte(req), []byte("ready 100%\n"), now)
				p.Record(&net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(10+h))}, []byte(req), []byte("ready 100%\n"), now)
			}
			peer = append(peer, api.Poll{HAProxy: "127.0.0.20", Backend: fmt.Sprintf("b%03d", b), Server: fmt.Sprintf("s%04d", s), LastAsked: now, Count: 2, Answer: "ready 100%", Replica: "peer"})
		}
	}
	f := &fakeReplica{
		snap:  func() *state.Snapshot { return snap },
		ready: func() (bool, string) { return true, "" },
		peers: func() []api.Poll { return peer },
	}
	return NewHTTPHandler(HTTPOptions{Pollers: p, NodeID: "self", Replica: f}), f
}

func client(t *testing.T, h http.Handler) *api.Client {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	c, err := api.NewClient(srv.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// A command about 10 servers reads only theirs: the replica filters by
// selector, its own polls and its peers' alike.
func TestListsFilterBySelector(t *testing.T) {
	h, _ := fleetFixture(t)
	c := client(t, h)
	ctx := context.Background()
	f, err := api.ParseFilter([]string{"b003"})
	if err != nil {
		t.Fatal(err)
	}
	pv, err := c.PollersOf(ctx, api.Query{Filter: f}, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(pv.Pollers) != 40 || pv.Total != 40 {
		t.Fatalf("polls of b003/*: %d (total %d), want 10 servers x 4 sources", len(pv.Pollers), pv.Total)
	}
	for _, p := range pv.Pollers {
		if p.Backend != "b003" {
			t.Fatalf("a poll of %s/%s in the answer for b003", p.Backend, p.Server)
		}
	}
	sv, err := c.StateOf(ctx, api.Query{Filter: f}, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(sv.Servers) != 10 || sv.Total != 10 || sv.Servers[4].Answer != "drain" || sv.Servers[4].Polled != 4 || sv.Servers[4].Told != 0 {
		t.Fatalf("state of b003: %d rows (total %d); s0004 %+v", len(sv.Servers), sv.Total, sv.Servers[4])
	}
	if len(sv.Backends) != 20 || !slices.Equal(sv.Selectors, []string{"b003/*"}) {
		t.Fatalf("backends %v, selectors %v: a filtered view names every known backend and echoes its filter", sv.Backends, sv.Selectors)
	}
	// The backend-wide key's row matches its backend's selector.
	f7, _ := api.ParseFilter([]string{"b007/*"})
	sv, err = c.StateOf(ctx, api.Query{Filter: f7}, false)
	if err != nil || len(sv.Servers) != 11 || sv.Servers[0].Server != "*" {
		t.Fatalf("state of b007: %v, %d rows", err, len(sv.Servers))
	}
	// A selector that matches nothing answers no row, and says what is known.
	fx, _ := api.ParseFilter([]string{"b0x3/*"})
	sv, err = c.StateOf(ctx, api.Query{Filter: fx}, true)
	if err != nil || len(sv.Servers) != 0 || len(sv.Backends) != 20 {
		t.Fatalf("state of b0x3: %v, %d rows, backends %v", err, len(sv.Servers), sv.Backends)
	}
	if code, body := get(t, h, "/v1/pollers?selector=%5B"); code != http.StatusBadRequest || !strings.Contains(body, "selector") {
		t.Fatalf("a bad glob: %d %s", code, body)
	}
}

// Nothing depends on the table fitting in one answer: the client reads
// every page, in order, each row once, the peers' rows included.
func TestListsPage(t *testing.T) {
	h, _ := fleetFixture(t)
	c := client(t, h)
	ctx := context.Background()
	pv, err := c.PollersOf(ctx, api.Query{Limit: 7}, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(pv.Pollers) != 800 || pv.Total != 800 {
		t.Fatalf("paged polls: %d (total %d), want 800", len(pv.Pollers), pv.Total)
	}
	seen := map[string]bool{}
	for i, p := range pv.Pollers {
		k := api.PollCursor(p)
		if seen[k] || (i > 0 && k <= api.PollCursor(pv.Pollers[i-1])) {
			t.Fatalf("row %d %q repeated or out of order", i, k)
		}
		seen[k] = true
	}
	sv, err := c.StateOf(ctx, api.Query{Limit: 13}, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(sv.Servers) != 201 || sv.Servers[0].Backend != "b000" || sv.Servers[200].Backend != "b019" {
		t.Fatalf("paged state: %d rows", len(sv.Servers))
	}
	// One page says where the next begins.
	code, body := get(t, h, "/v1/pollers?scope=cluster&limit=3&selector=b001/s0001")
	if code != 200 || !strings.Contains(body, `"next": "b001/s0001\u001f127.0.0.12\u001fself"`) || !strings.Contains(body, `"truncated": true`) {
		t.Fatalf("a cut page: %d %s", code, body)
	}
}

// A replica of 0.14.0 ignores ?selector= and ?after=: the client filters
// its answer itself, and refuses a cut one, saying a newer replica is
// needed.
func TestListsFromAnOlderReplica(t *testing.T) {
	var truncated bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/state":
			fmt.Fprintf(w, `{"servers":[{"backend":"a","server":"1"},{"backend":"b","server":"1"}],"total":2,"truncated":%v}`, truncated)
		case "/v1/pollers":
			fmt.Fprintf(w, `{"pollers":[{"backend":"a","server":"1","haproxy":"127.0.0.1"},{"backend":"b","server":"1","haproxy":"127.0.0.1"}],"total":2,"truncated":%v}`, truncated)
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	c, _ := api.NewClient(srv.URL, nil)
	ctx := context.Background()
	f, _ := api.ParseFilter([]string{"a/*"})
	sv, err := c.StateOf(ctx, api.Query{Filter: f}, true)
	if err != nil || len(sv.Servers) != 1 || sv.Servers[0].Backend != "a" || !slices.Equal(sv.Backends, []string{"a", "b"}) {
		t.Fatalf("older replica's state, filtered here: %v %+v", err, sv)
	}
	pv, err := c.PollersOf(ctx, api.Query{Filter: f}, true)
	if err != nil || len(pv.Pollers) != 1 {
		t.Fatalf("older replica's polls, filtered here: %v %+v", err, pv)
	}
	if _, err := c.HAProxies(ctx); err == nil || !strings.Contains(err.Error(), "older hastate release") {
		t.Fatalf("older replica's record: %v", err)
	}
	truncated = true
	if _, err := c.PollersOf(ctx, api.Query{Filter: f}, true); err == nil || !strings.Contains(err.Error(), "0.15.0 or later") {
		t.Fatalf("older replica's cut polls: %v, want the error to ask for a newer replica", err)
	}
}

// /v1/haproxies: the record with what each replica that answered saw; with
// a replica down, an HAProxy recorded as polling and seen by no live
// replica is the one a command cannot do without.
func TestHAProxiesView(t *testing.T) {
	h, f := fleetFixture(t)
	now := time.Now()
	f.recorded = state.HAProxies{
		"127.0.0.10": {First: now.Add(-time.Hour), Last: now.Add(-10 * time.Second)},
		"127.0.0.20": {First: now.Add(-time.Hour), Last: now.Add(-10 * time.Second)},
		"127.0.0.30": {First: now.Add(-time.Hour), Last: now.Add(-20 * time.Second)}, // only the dead replica saw it
		"127.0.0.40": {First: now.Add(-time.Hour), Last: now.Add(-5 * time.Minute)},  // stopped polling
	}
	f.sightings = map[string]time.Time{"127.0.0.20": now}
	f.down = []string{"dead"}
	v, err := client(t, h).HAProxies(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !v.Recorded || len(v.HAProxies) != 6 || len(v.Replicas) != 3 {
		t.Fatalf("view: recorded %v, %d nodes, replicas %v", v.Recorded, len(v.HAProxies), v.Replicas)
	}
	var unseen []string
	for _, n := range v.Unseen(time.Now(), nil) {
		unseen = append(unseen, n.HAProxy)
	}
	if !slices.Equal(unseen, []string{"127.0.0.30"}) {
		t.Fatalf("unseen %v, want only 127.0.0.30", unseen)
	}
	f.down = nil
	v, _ = client(t, h).HAProxies(context.Background())
	if u := v.Unseen(time.Now(), nil); len(u) != 0 {
		t.Fatalf("every replica answered, yet unseen %v", u)
	}
}

func TestHAProxyWindowsAgree(t *testing.T) {
	if api.HAProxyCoarse != state.HAProxyCoarse {
		t.Fatalf("api.HAProxyCoarse %v, state.HAProxyCoarse %v", api.HAProxyCoarse, state.HAProxyCoarse)
	}
	if api.HAProxyRecent < state.HAProxyCoarse+2*state.HAProxySyncEvery {
		t.Fatalf("api.HAProxyRecent %v is shorter than the record's resolution plus two gatherings", api.HAProxyRecent)
	}
}
