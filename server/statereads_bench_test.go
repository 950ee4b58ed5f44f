package server

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/state"
)

// BenchmarkStateReads: what a replica holding 1,000,000 pairs (100
// sources x 10,000 servers, benchTable) spends on two of the reads
// BenchmarkPollerTable (test/bench_pollers_test.go) makes once a second
// beside its agent: /v1/state of every server (what `status -o json`
// asks) and the status page, at the HTTP handler, the body written into
// nothing. The snapshot is that benchmark's: one backend-wide key
// (fs000/* drain), every other server known only by its polls.
//
// The -peer cases are the replica beside it (BenchmarkFleetOperator's
// n2): an empty table of its own, the same polls answered by a peer as
// counts (decoded once, outside the loop).
//
//	go test -run '^$' -bench StateReads -benchmem ./server/
func BenchmarkStateReads(b *testing.B) {
	const sources, servers = 100, 10_000
	table := benchTable(b, servers, sources)
	h := benchReadHandler(b, table)
	empty, err := NewPollers(PollersOptions{})
	if err != nil {
		b.Fatal(err)
	}
	peer := NewHTTPHandler(HTTPOptions{Pollers: empty, NodeID: "n2", Replica: countsPeer{lonelyReplica{benchSnap()},
		table.Summary(time.Now().Add(-PollerWindow), SummaryArg{Counts: true})}})
	for _, c := range []struct {
		name, path string
		h          http.Handler
	}{
		{"state-all", "/v1/state?limit=100000", h},
		{"page", "/", h},
		{"state-all-peer", "/v1/state?limit=100000&scope=cluster", peer},
		{"page-peer", "/", peer},
	} {
		b.Run(c.name, func(b *testing.B) {
			req := httptest.NewRequest(http.MethodGet, c.path, nil)
			h := c.h
			for b.Loop() {
				w := &discardWriter{h: http.Header{}}
				h.ServeHTTP(w, req)
				if w.code != http.StatusOK || w.n < servers*50 {
					b.Fatalf("%s: HTTP %d, %d bytes", c.path, w.code, w.n)
				}
			}
		})
	}
}

// benchReadHandler is the HTTP handler of a replica without peers whose
// poller table is p and whose snapshot holds fs000/* drain.
func benchReadHandler(tb testing.TB, p *Pollers) http.Handler {
	return NewHTTPHandler(HTTPOptions{Replica: lonelyReplica{benchSnap()}, Pollers: p, NodeID: "n1"})
}

// countsPeer is lonelyReplica with one peer, n1, whose answer to every
// poll-summary is sum.
type countsPeer struct {
	lonelyReplica
	sum PollSummary
}

func (r countsPeer) PeerSummaries(SummaryArg) ([]PollSummary, []api.ReplicaAnswer) {
	return []PollSummary{r.sum}, []api.ReplicaAnswer{{ID: "n1", Answered: true}}
}

// benchSnap is BenchmarkPollerTable's snapshot: fs000/* drain.
func benchSnap() *state.Snapshot {
	m := state.NewMirror()
	m.Apply(state.Change{Set: map[string]string{state.StatePrefix + "fs000/*": "drain"}})
	return m.Snapshot()
}

// lonelyReplica is a ready leader without peers that holds snap.
type lonelyReplica struct{ snap *state.Snapshot }

func (r lonelyReplica) Snapshot() *state.Snapshot { return r.snap }
func (lonelyReplica) Ready() (bool, string)       { return true, "ready" }
func (lonelyReplica) ClusterInfo() api.ClusterInfo {
	return api.ClusterInfo{NodeID: "n1", State: "leader", LeaderID: "n1"}
}
func (lonelyReplica) KVStatus() api.KVStatus { return api.KVStatus{Watching: true} }
func (lonelyReplica) PeerPollers(PollsArg) ([]api.Poll, int, []api.ReplicaAnswer) {
	return nil, 0, nil
}
func (lonelyReplica) PeerSummaries(SummaryArg) ([]PollSummary, []api.ReplicaAnswer) {
	return nil, nil
}
func (lonelyReplica) Recorded() (state.HAProxies, bool) { return nil, false }
func (lonelyReplica) PeerSightings() (map[string]map[string]time.Time, []api.ReplicaAnswer) {
	return nil, nil
}

var _ Replica = lonelyReplica{}

// discardWriter is an http.ResponseWriter that counts the body and
// keeps none of it.
type discardWriter struct {
	h    http.Header
	code int
	n    int
}

func (w *discardWriter) Header() http.Header { return w.h }
func (w *discardWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
}
func (w *discardWriter) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	w.n += len(p)
	return len(p), nil
}
