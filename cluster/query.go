package cluster

// This file holds what a node asks its peers over the raft port: their
// status and named queries, and where to dial them.

import (
	"encoding/json"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/cluster/raftport"
)

func (n *Node) peerStatus() api.PeerStatus {
	st := api.PeerStatus{ID: n.opts.ID, ConsulReachable: true, State: stateName(n.raft.State()), AppliedIndex: n.raft.AppliedIndex(), StateIndex: n.fsm.Index(),
		Level: n.fsm.MaxLevel(), Version: n.opts.Version}
	holds := n.holdsRaftState()
	st.HoldsRaftState, st.RaftLastIndex = &holds, n.raft.LastIndex()
	if lc := n.raft.LastContact(); !lc.IsZero() && n.raft.State() != raft.Leader {
		st.LastContact = time.Since(lc).Round(time.Millisecond).String()
	}
	if n.opts.ConsulHealth != nil {
		h := n.opts.ConsulHealth()
		st.ConsulReachable, st.ConsulChecked = h.Reachable, h.Checked
		v := n.verdictOf(h)
		st.Mirror = &v
	}
	if n.raft.State() == raft.Leader {
		v := n.KVView()
		st.KVSynced, st.KVSyncAgeSeconds, st.KVSyncedIndex, st.KVTokenProblem = v.Synced, v.SyncAgeSeconds, v.SyncedIndex, v.TokenProblem
		// Read after the synced index: the state that holds it is
		// applied by the time the watch records it.
		st.StateIndex = n.fsm.Index()
	}
	return st
}

// PeerStatuses asks every member for its status over the raft port (this
// node answers for itself); members that do not answer within timeout are
// missing from the result.
func (n *Node) PeerStatuses(timeout time.Duration) map[string]api.PeerStatus {
	out := map[string]api.PeerStatus{n.opts.ID: n.peerStatus()}
	var mu sync.Mutex
	n.forEachPeer(func(s raft.Server) {
		if st, err := n.stream.QueryStatus(n.dialAddress(s), timeout); err == nil {
			mu.Lock()
			out[string(s.ID)] = st
			mu.Unlock()
		}
	})
	return out
}

// PeerAnswer is one member's answer to a named query: Raw, or Err when it
// did not answer. The answer to a query with an argument (QueryPeerWith,
// QueryPeersWith) is not validated: decoding it reports a malformed one.
type PeerAnswer struct {
	Raw json.RawMessage
	Err error
}

// QueryPeers asks every other member for the answer to a named query
// (Options.PeerQueries on their side), in parallel, each within timeout.
// Every member of the configuration is in the result, those that did not
// answer with their error, so that a caller can say whom it missed.
func (n *Node) QueryPeers(name string, timeout time.Duration) map[string]PeerAnswer {
	out := map[string]PeerAnswer{}
	var mu sync.Mutex
	n.forEachPeer(func(s raft.Server) {
		raw, err := n.stream.Query(n.dialAddress(s), name, timeout)
		mu.Lock()
		out[string(s.ID)] = PeerAnswer{Raw: raw, Err: err}
		mu.Unlock()
	})
	return out
}

// QueryPeer asks the member id for the answer to a named query.
func (n *Node) QueryPeer(id, name string, timeout time.Duration) PeerAnswer {
	cf := n.raft.GetConfiguration()
	if err := cf.Error(); err != nil {
		return PeerAnswer{Err: err}
	}
	for _, s := range cf.Configuration().Servers {
		if string(s.ID) == id {
			raw, err := n.stream.Query(n.dialAddress(s), name, timeout)
			return PeerAnswer{Raw: raw, Err: err}
		}
	}
	return PeerAnswer{Err: fmt.Errorf("%s is not a member of the raft configuration", id)}
}

// QueryPeerWith is QueryPeer for a named query that takes an argument.
func (n *Node) QueryPeerWith(id, name string, arg any, timeout time.Duration) PeerAnswer {
	a, err := json.Marshal(arg)
	if err != nil {
		return PeerAnswer{Err: err}
	}
	cf := n.raft.GetConfiguration()
	if err := cf.Error(); err != nil {
		return PeerAnswer{Err: err}
	}
	for _, s := range cf.Configuration().Servers {
		if string(s.ID) == id {
			raw, err := n.stream.QueryWith(n.dialAddress(s), name, a, timeout)
			return PeerAnswer{Raw: raw, Err: err}
		}
	}
	return PeerAnswer{Err: fmt.Errorf("%s is not a member of the raft configuration", id)}
}

// QueryPeersWith is QueryPeers for a named query that takes an argument
// (Options.PeerArgQueries on their side), arg encoded as JSON. A member of
// a release that does not know the query answers null or fails: callers
// then ask it a query it knows.
func (n *Node) QueryPeersWith(name string, arg any, timeout time.Duration) map[string]PeerAnswer {
	out := map[string]PeerAnswer{}
	a, err := json.Marshal(arg)
	var mu sync.Mutex
	n.forEachPeer(func(s raft.Server) {
		var raw json.RawMessage
		qerr := err
		if qerr == nil {
			raw, qerr = n.stream.QueryWith(n.dialAddress(s), name, a, timeout)
		}
		mu.Lock()
		out[string(s.ID)] = PeerAnswer{Raw: raw, Err: qerr}
		mu.Unlock()
	})
	return out
}

// queries are the named queries this node answers without an argument:
// the wiring's and its own sightings.
func (n *Node) queries() map[string]func() any {
	q := maps.Clone(n.opts.PeerQueries)
	if q == nil {
		q = map[string]func() any{}
	}
	q[sightingsQuery] = n.sightingsAnswer
	return q
}

// forEachPeer runs f for every other member of the configuration, in
// parallel, and waits for all of them.
func (n *Node) forEachPeer(f func(raft.Server)) {
	cf := n.raft.GetConfiguration()
	if cf.Error() != nil {
		return
	}
	var wg sync.WaitGroup
	for _, s := range cf.Configuration().Servers {
		if string(s.ID) == n.opts.ID {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(s)
		}()
	}
	wg.Wait()
}

func (n *Node) dialAddress(s raft.Server) string { return n.dialServer(s.ID, s.Address) }

// dialServer is where to dial the server id whose configured address is
// addr: its --raft-dial override, if any.
func (n *Node) dialServer(id raft.ServerID, addr raft.ServerAddress) string {
	if a, ok := n.opts.DialOverride[string(id)]; ok {
		return a
	}
	return string(addr)
}

// newDialOverride is raft's ServerAddressProvider: nil (raft dials the
// configured addresses) without overrides; else the overrides on top of
// --peers and this node's own advertised address.
func newDialOverride(o Options) raft.ServerAddressProvider {
	if len(o.DialOverride) == 0 {
		return nil
	}
	known := map[string]string{o.ID: o.Advertise}
	for _, p := range o.Peers {
		known[p.ID] = p.Address
	}
	return raftport.NewDialOverride(known, o.DialOverride)
}

// sightingsQuery is the named query that returns a replica's sightings.
const sightingsQuery = "sightings"

// sightingsTimeout bounds each peer's answer to the sightings query.
const sightingsTimeout = 2 * time.Second

// Sightings is what one replica saw: each HAProxy source that polled it
// and when it last did.
type Sightings map[string]time.Time

// localSightings is this replica's sightings (none without the wiring's).
func (n *Node) localSightings() Sightings {
	if n.opts.Sightings == nil {
		return Sightings{}
	}
	return n.opts.Sightings()
}

// PeerSightings asks every member for its sightings (this node answers for
// itself). Members that did not answer are in failed with their error; a
// member of a release that knows no such query answers null and is failed
// too (it cannot say what it saw).
func (n *Node) PeerSightings() (seen map[string]Sightings, failed map[string]error) {
	seen = map[string]Sightings{n.opts.ID: n.localSightings()}
	failed = map[string]error{}
	for id, pa := range n.QueryPeers(sightingsQuery, sightingsTimeout) {
		var s Sightings
		err := pa.Err
		if err == nil {
			err = json.Unmarshal(pa.Raw, &s)
		}
		if err == nil && s == nil {
			err = errOlderRelease
		}
		if err != nil {
			failed[id] = err
			continue
		}
		seen[id] = s
	}
	return seen, failed
}

// errOlderRelease is a peer's null answer to a query it does not know.
var errOlderRelease = errorString("it runs a release that does not answer this query")

type errorString string

func (e errorString) Error() string { return string(e) }

// sightingsAnswer is the sightings query's answer: never null (null is what
// a release without the query answers).
func (n *Node) sightingsAnswer() any {
	s := n.localSightings()
	if s == nil {
		s = Sightings{}
	}
	return maps.Clone(s)
}
