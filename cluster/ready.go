package cluster

// This file holds readiness (see confirm/withhold.go for what withholds) and the
// node's view of the cluster for /v1/cluster.

import (
	"fmt"
	"time"

	"github.com/hashicorp/raft"
	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/cluster/confirm"
	"github.com/hastate/hastate/state"
)

// Ready reports whether the replica holds state and answers: it has caught
// up with a leader since it started (and since it was last cut off), and
// its last contact with a leader is within the leaderless grace; with a
// human-readable detail either way. The withhold reasons (confirm/withhold.go) are
// the one place that decides it.
func (n *Node) Ready() (bool, string) {
	_, _, synced := n.fsm.Info()
	switch {
	case !synced:
		if d, _ := n.bootstrapWaiting(); d != "" {
			return false, d
		}
		d := "no state yet: waiting for a first KV sync through the raft leader (check Consul and the leader)"
		kv := n.KVView()
		if kv.TokenProblem != nil {
			d = fmt.Sprintf("no state yet, answers nothing: the leader %s applies nothing from Consul: %s", kv.LeaderID, kv.TokenProblem)
		}
		if v := n.MirrorVerdict(); !v.CanMirror() && (kv.TokenProblem == nil || !n.IsLeader()) {
			d += "; this replica cannot mirror Consul either (" + v.String() + ")"
		}
		return false, d
	case n.reads.Withholding():
		return false, "holds state but withholds every answer: " + n.reads.WithheldDetails(time.Now())
	}
	d := "holds state and caught up with a leader"
	if c := n.reads.ConfirmTrouble(time.Now()); c != "" {
		d += "; answers nothing: " + c
	}
	if w := n.KVView().Warning; w != "" {
		d += "; " + w
	}
	if v := n.MirrorVerdict(); !v.CanMirror() {
		d += "; cannot mirror Consul if it leads (" + v.String() + ")"
	}
	return true, d
}

// Info returns the node's view of the cluster.
func (n *Node) Info() api.ClusterInfo {
	addr, lid := n.raft.LeaderWithID()
	kvIndex, keys, synced := n.fsm.Info()
	in := api.ClusterInfo{
		NodeID: n.opts.ID, State: stateName(n.raft.State()), LeaderID: string(lid), LeaderAddr: string(addr),
		AppliedIndex: n.raft.AppliedIndex(), StateIndex: n.fsm.Index(), CommitIndex: n.raft.CommitIndex(), Term: n.raft.CurrentTerm(),
		KVIndex: kvIndex, KVKeys: keys, KVDigest: n.fsm.Digest(), HoldsState: synced, CaughtUp: n.reads.CaughtUp(), Withholding: n.reads.Labels(),
		KV: n.KVView(), Confirm: n.reads.Info(time.Now()), LeaderlessSeconds: n.leaderless().Seconds(), Members: []api.MemberInfo{},
	}
	if lc := n.raft.LastContact(); !lc.IsZero() && in.State != "leader" {
		in.LastContact = time.Since(lc).Round(time.Millisecond).String()
	}
	statuses := n.PeerStatuses(time.Second)
	in.Level, in.Version = n.duties.LevelInfo(statuses), n.opts.Version
	v := n.MirrorVerdict()
	in.Mirror, in.Source = &v, n.RecordedSource()
	if f := n.raft.GetConfiguration(); f.Error() == nil {
		for _, s := range f.Configuration().Servers {
			m := api.MemberInfo{ID: string(s.ID), Address: string(s.Address), Suffrage: s.Suffrage.String(), Leader: s.ID == lid}
			if st, ok := statuses[string(s.ID)]; ok {
				m.Status = &st
			}
			in.Members = append(in.Members, m)
		}
	}
	return in
}

func stateName(s raft.RaftState) string {
	switch s {
	case raft.Leader:
		return "leader"
	case raft.Candidate:
		return "candidate"
	case raft.Follower:
		return "follower"
	default:
		return "shutdown"
	}
}

// IsLeader reports whether this node is the raft leader.
func (n *Node) IsLeader() bool { return n.raft.State() == raft.Leader }

// Confirmed returns the serving snapshot for an agent answer that arrived
// now, once a confirmation round that began after it succeeded: nil
// (answer nothing) while any withhold reason is in force, or when no round
// confirms within Options.ConfirmTimeout (confirm.Reads.Confirmed). It
// allocates nothing.
func (n *Node) Confirmed() *state.Snapshot { return n.reads.Confirmed() }

// Arrived takes the place of an agent check that arrives now (when its
// connection is accepted, before its request is read) and asks for a
// confirmation round, which runs while the request is read
// (confirm.Reads.Arrived). It never blocks and allocates nothing.
func (n *Node) Arrived() Arrival { return n.reads.Arrived() }

// Arrival is a check's arrival (confirm.Arrival), named here so that the
// node's users need not import its parts.
type Arrival = confirm.Arrival

// ConfirmedSince is Confirmed for a check that arrived at a (Arrived): a
// round that began after a confirms it, never one that began before.
func (n *Node) ConfirmedSince(a Arrival) *state.Snapshot { return n.reads.ConfirmedSince(a) }

// Serving returns the serving snapshot unless a withhold reason is in
// force (nil then), without confirming it with the leader. It never
// blocks and never allocates.
func (n *Node) Serving() *state.Snapshot { return n.reads.Serving() }

// ListenerFailed receives an error when the raft port stopped accepting
// connections for another reason than Shutdown (an Accept error that is
// not temporary). The replica then cannot follow raft while it may look
// ready; its owner should stop it and exit so that it is restarted.
func (n *Node) ListenerFailed() <-chan error { return n.stream.Failed() }
