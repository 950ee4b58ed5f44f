package cluster

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/cluster/leader"

	"github.com/hashicorp/raft"
)

// This file holds what the cluster knows about Consul: each node's own
// reachability (for the leader's Consul failover) and the cluster-wide view
// of the KV sync, which is the leader's report and reads the same on every
// replica.

// Bounds of the KV view.
const (
	// kvReportEvery is how often a follower asks its leader for the report.
	kvReportEvery = time.Second
	// kvReportFresh is how old a follower's last report may be before it
	// stops trusting it (the leader is gone or partitioned away).
	kvReportFresh = 5 * time.Second
	// DefaultKVStaleAfter is Options.KVStaleAfter's default: the sync age
	// past which a reachable Consul still gets a warning (the watch is
	// stuck, or the leader cannot apply).
	DefaultKVStaleAfter = 15 * time.Second
)

// kvReport is the last report a follower received from its leader.
type kvReport struct {
	leader    string
	reachable bool
	synced    bool
	age       time.Duration // as the leader computed it
	at        time.Time     // when it arrived (monotonic)
	// consulIndex is the Consul index the leader's state held when it
	// reported, and stateIndex the raft index of that state: a follower
	// that serves stateIndex holds consulIndex.
	consulIndex, stateIndex uint64
	// tokenProblem: Consul refuses the leader's token.
	tokenProblem *api.TokenProblem
}

// KVView returns the cluster's view of its Consul sync.
func (n *Node) KVView() api.KVView {
	now := time.Now()
	kvIndex, _, _ := n.fsm.Info()
	var v api.KVView
	if n.raft.State() == raft.Leader {
		h := n.consulHealth()
		v = api.KVView{LeaderID: n.opts.ID, Known: true, Reachable: h.Reachable, SyncedIndex: max(h.SyncedIndex, kvIndex), TokenProblem: h.TokenProblem}
		if !h.SyncedAt.IsZero() {
			v.Synced, v.SyncAge = true, max(now.Sub(h.SyncedAt), 0)
		} else if r := n.kvReport.Load(); r != nil && r.synced {
			// Not synced in this term yet: the last leader's sync is
			// the last one known.
			v.Synced, v.SyncAge = true, r.age+now.Sub(r.at)
		}
	} else if r := n.kvReport.Load(); r == nil {
		v.SyncedIndex = kvIndex
	} else {
		v = api.KVView{LeaderID: r.leader, Synced: r.synced, SyncAge: r.age + now.Sub(r.at), SyncedIndex: kvIndex}
		if n.fsm.Index() >= r.stateIndex {
			v.SyncedIndex = max(kvIndex, r.consulIndex)
		}
		v.Known = now.Sub(r.at) <= kvReportFresh
		v.Reachable = v.Known && r.reachable
		if v.Known {
			v.TokenProblem = r.tokenProblem
		}
	}
	if !v.Synced {
		v.SyncAge = now.Sub(n.started)
	}
	v.SyncAgeSeconds = v.SyncAge.Seconds()
	v.Warning = kvWarning(v, n.opts.KVStaleAfter)
	return v
}

func kvWarning(v api.KVView, staleAfter time.Duration) string {
	age := v.SyncAge.Round(time.Second)
	switch {
	case v.TokenProblem != nil && !v.Synced:
		return fmt.Sprintf("Consul not synced: the leader %s applies nothing: %s; a replica without state answers nothing", v.LeaderID, v.TokenProblem)
	case v.TokenProblem != nil:
		return fmt.Sprintf("Consul not synced for %s: the leader %s holds the last state and applies nothing: %s", age, v.LeaderID, v.TokenProblem)
	case !v.Synced:
		return fmt.Sprintf("Consul not synced: no leader has mirrored KV in the %s since this replica started (check the leader's logs and Consul)", age)
	case !v.Known:
		return fmt.Sprintf("Consul not synced for %s: no raft leader is reporting (check the raft peers); serving the last state", age)
	case !v.Reachable:
		return fmt.Sprintf("Consul not synced for %s: the leader %s cannot read it (check Consul and the leader's logs); serving the last state", age, v.LeaderID)
	case v.SyncAge > staleAfter:
		return fmt.Sprintf("Consul not synced for %s (check the leader %s's logs)", age, v.LeaderID)
	}
	return ""
}

// consulHealth is the wiring's leader.ConsulHealth; without one, Consul counts as
// reachable and the mirror, once it holds state, as in sync.
func (n *Node) consulHealth() leader.ConsulHealth {
	if n.opts.ConsulHealth != nil {
		return n.opts.ConsulHealth()
	}
	h := leader.ConsulHealth{Reachable: true, Checked: time.Now()}
	if _, _, synced := n.fsm.Info(); synced {
		h.SyncedAt = h.Checked
	}
	return h
}

// leaderReportLoop keeps, on a follower, the leader's last KV report and
// when this node last knew a leader.
func (n *Node) leaderReportLoop() {
	defer n.wg.Done()
	t := time.NewTicker(kvReportEvery / 4)
	defer t.Stop()
	var asked time.Time
	for {
		select {
		case <-n.stop:
			return
		case <-t.C:
		}
		addr, id := n.raft.LeaderWithID()
		if id != "" {
			n.leaderSeen.Store(time.Now().UnixNano())
		}
		// Ask every kvReportEvery, and at once when the leader is new.
		r := n.kvReport.Load()
		if id == "" || string(id) == n.opts.ID || (time.Since(asked) < kvReportEvery && r != nil && r.leader == string(id)) {
			continue
		}
		asked = time.Now()
		st, err := n.stream.QueryStatus(n.dialAddress(raft.Server{ID: id, Address: addr}), kvReportEvery)
		if err != nil || st.ID != string(id) || st.State != stateName(raft.Leader) {
			continue
		}
		n.kvReport.Store(&kvReport{leader: st.ID, reachable: st.ConsulReachable, synced: st.KVSynced,
			age: time.Duration(st.KVSyncAgeSeconds * float64(time.Second)), at: time.Now(),
			consulIndex: st.KVSyncedIndex, stateIndex: st.StateIndex, tokenProblem: st.KVTokenProblem})
	}
}

// leaderless is how long this node has been without a known leader (0 with
// one).
func (n *Node) leaderless() time.Duration {
	if _, id := n.raft.LeaderWithID(); id != "" {
		n.leaderSeen.Store(time.Now().UnixNano())
		return 0
	}
	return time.Since(time.Unix(0, n.leaderSeen.Load()))
}

// kvState is the part of a node that follows the leader's KV report.
type kvState struct {
	kvReport   atomic.Pointer[kvReport]
	leaderSeen atomic.Int64 // unix nanoseconds
	started    time.Time
}
