package cluster

// This file holds readiness (caught up with a leader since start) and the
// node's view of the cluster for /v1/cluster.

import (
	"time"

	"github.com/hashicorp/raft"
	"github.com/hastate/hastate/api"
	"go.uber.org/zap"
)

// catchUpLoop marks the node caught up once it serves everything a leader
// served when this node asked it, after start. The node's own commit index
// cannot tell: a follower caps it at its last log index, so a follower
// restarted behind the leader would look caught up before the leader sent
// it the entries it missed; and raft's applied index counts entries still
// queued for the FSM. So both sides compare the FSM's own index; the
// leader's comes over the raft port's status query.
func (n *Node) catchUpLoop() {
	defer n.wg.Done()
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	var leader raft.ServerID
	var target uint64 // the leader's state index; 0: not known yet
	for !n.caughtUp.Load() {
		select {
		case <-n.stop:
			return
		case <-t.C:
		}
		addr, id := n.raft.LeaderWithID()
		if id == "" || string(id) == n.opts.ID {
			continue // no leader, or this node leads (leaderDuty marks it)
		}
		if id != leader {
			leader, target = id, 0
		}
		if target == 0 {
			st, err := n.stream.queryStatus(n.dialAddress(raft.Server{ID: id, Address: addr}), 500*time.Millisecond)
			if err != nil || st.ID != string(id) || st.State != stateName(raft.Leader) || st.StateIndex == 0 {
				continue
			}
			target = st.StateIndex
		}
		if n.fsm.index.Load() >= target {
			n.caughtUp.Store(true)
		}
	}
	n.log.Info("raft caught up", zap.Uint64("state_index", n.fsm.index.Load()), zap.String("leader_id", string(leader)))
}

// Ready reports whether the replica holds state and has caught up with a
// leader since it started, with a human-readable detail either way.
func (n *Node) Ready() (bool, string) {
	_, _, synced := n.fsm.info()
	caught := n.caughtUp.Load()
	switch err := n.fsm.notUnderstood(); {
	case err != nil:
		return false, "withholds every answer: " + err.Error()
	case !synced:
		return false, "no state yet: waiting for a first KV sync through the raft leader (check Consul and the leader)"
	case !caught:
		return false, "holds state but has not caught up with a raft leader since start (check peers and the raft port)"
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
		KVIndex: kvIndex, KVKeys: keys, KVDigest: n.fsm.digest(), HoldsState: synced, CaughtUp: n.caughtUp.Load(),
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
