package cluster

// This file holds the record of which HAProxy nodes exist (state.HAProxies):
// the leader gathers, every state.HAProxySyncEvery, what each replica saw
// (its poller table's sources and their latest poll, the named query
// "sightings"), and writes a haproxies entry only with what changed: new
// sources, sources whose last poll moved by state.HAProxyCoarse or more,
// and sources to forget. It is written only once state.LevelRecorded is in
// force (gate.go). An operator command reads it from any replica to know
// which HAProxy nodes a lost replica may have been the only one to see.

import (
	"cmp"
	"context"
	"encoding/json"
	"maps"
	"time"

	"github.com/hastate/hastate/state"
	"go.uber.org/zap"
)

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

// HAProxies returns the record of which HAProxy nodes exist, as this
// replica applied it (a copy), and whether the cluster keeps it (the level
// in force is state.LevelRecorded or above).
func (n *Node) HAProxies() (state.HAProxies, bool) {
	return n.fsm.recordedHAProxies(), n.fsm.level() >= state.LevelRecorded
}

// haproxyLoop is the leader's: while state.LevelRecorded is in force, it
// gathers every replica's sightings each state.HAProxySyncEvery and writes
// the record's changes in one entry (nothing when nothing changed).
func (n *Node) haproxyLoop(ctx context.Context) {
	t := time.NewTicker(cmp.Or(n.opts.HAProxySyncEvery, state.HAProxySyncEvery))
	defer t.Stop()
	var overSaid int
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if n.fsm.level() < state.LevelRecorded {
			continue
		}
		seen, _ := n.PeerSightings()
		merged := map[string]time.Time{}
		for _, s := range seen {
			for src, at := range s {
				if at.After(merged[src]) {
					merged[src] = at
				}
			}
		}
		plan := state.PlanHAProxies(n.fsm.recordedHAProxies(), merged, n.now())
		if plan.Over > 0 && plan.Over != overSaid {
			n.log.Warn("the record of HAProxy nodes is full: sources beyond it are not recorded, and operator commands cannot tell whether only a lost replica saw them",
				zap.Int("max", state.MaxHAProxies), zap.Int("not_recorded", plan.Over))
		}
		overSaid = plan.Over
		if plan.Change.Empty() {
			continue
		}
		c := plan.Change
		_, idx, err := n.apply(ctx, command{Type: cmdHAProxies, HAProxies: &c, At: n.now()})
		if err != nil {
			n.log.Warn("recording the HAProxy nodes not applied; retrying at the next gathering", zap.Error(err))
			continue
		}
		n.metrics.haproxyWrites.Inc()
		n.log.Debug("recorded HAProxy nodes", zap.Int("seen", len(c.Seen)), zap.Int("forgotten", len(c.Forget)), zap.Uint64("raft_index", idx))
	}
}

// sightingsAnswer is the sightings query's answer: never null (null is what
// a release without the query answers).
func (n *Node) sightingsAnswer() any {
	s := n.localSightings()
	if s == nil {
		s = Sightings{}
	}
	return maps.Clone(s)
}
