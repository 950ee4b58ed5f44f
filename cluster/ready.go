package cluster

// This file holds readiness (see withhold.go for what withholds) and the
// node's view of the cluster for /v1/cluster.

import (
	"time"

	"github.com/hashicorp/raft"
	"github.com/hastate/hastate/api"
)

// Ready reports whether the replica holds state and answers: it has caught
// up with a leader since it started (and since it was last cut off), and
// its last contact with a leader is within the leaderless grace; with a
// human-readable detail either way. The withhold reasons (withhold.go) are
// the one place that decides it.
func (n *Node) Ready() (bool, string) {
	_, _, synced := n.fsm.info()
	switch {
	case !synced:
		if d, _ := n.bootstrapWaiting(); d != "" {
			return false, d
		}
		return false, "no state yet: waiting for a first KV sync through the raft leader (check Consul and the leader)"
	case n.withheld.any():
		return false, "holds state but withholds every answer: " + n.withheld.details()
	}
	if w := n.KVView().Warning; w != "" {
		return true, "holds state and caught up with a leader; " + w
	}
	return true, "holds state and caught up with a leader"
}

// Info returns the node's view of the cluster.
func (n *Node) Info() api.ClusterInfo {
	addr, lid := n.raft.LeaderWithID()
	kvIndex, keys, synced := n.fsm.info()
	in := api.ClusterInfo{
		NodeID: n.opts.ID, State: stateName(n.raft.State()), LeaderID: string(lid), LeaderAddr: string(addr),
		AppliedIndex: n.raft.AppliedIndex(), StateIndex: n.fsm.index.Load(), CommitIndex: n.raft.CommitIndex(), Term: n.raft.CurrentTerm(),
		KVIndex: kvIndex, KVKeys: keys, KVDigest: n.fsm.digest(), HoldsState: synced, CaughtUp: !n.withheld.has(withholdCatchingUp), Withholding: n.withheld.labels(),
		KV: n.KVView(), LeaderlessSeconds: n.leaderless().Seconds(), Members: []api.MemberInfo{},
	}
	if lc := n.raft.LastContact(); !lc.IsZero() && in.State != "leader" {
		in.LastContact = time.Since(lc).Round(time.Millisecond).String()
	}
	statuses := n.PeerStatuses(time.Second)
	in.Level, in.Version = n.levelInfo(statuses), n.opts.Version
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
