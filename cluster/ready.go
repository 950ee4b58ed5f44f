package cluster

// This file holds readiness (see withhold.go for what withholds) and the
// node's view of the cluster for /v1/cluster.

import (
	"fmt"
	"strings"
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
		d := "no state yet: waiting for a first KV sync through the raft leader (check Consul and the leader)"
		kv := n.KVView()
		if kv.TokenProblem != nil {
			d = fmt.Sprintf("no state yet, answers nothing: the leader %s applies nothing from Consul: %s", kv.LeaderID, kv.TokenProblem)
		}
		if v := n.MirrorVerdict(); !v.CanMirror() && (kv.TokenProblem == nil || !n.IsLeader()) {
			d += "; this replica cannot mirror Consul either (" + v.String() + ")"
		}
		return false, d
	case n.withheld.any():
		return false, "holds state but withholds every answer: " + n.withheldDetails(time.Now())
	}
	d := "holds state and caught up with a leader"
	if c := n.confirmTrouble(time.Now()); c != "" {
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

// withheldDetails is the readiness detail of each reason in force, with
// how long it has been (and the confirmation's trouble, if any).
func (n *Node) withheldDetails(now time.Time) string {
	var parts []string
	for _, r := range withholdReasons() {
		if n.withheld.has(r) {
			_, d := r.info()
			since := time.Unix(0, n.withheldSince[bitIndex(r)].Load())
			parts = append(parts, d+" (for "+roundFor(now.Sub(since))+")")
		}
	}
	if c := n.confirmTrouble(now); c != "" && !n.withheld.has(withholdLeaderless) {
		parts = append(parts, c)
	}
	return strings.Join(parts, "; ")
}

// confirmTrouble says for how long confirmation rounds have failed, and
// why ("" while the last one succeeded).
func (n *Node) confirmTrouble(now time.Time) string {
	f := n.conf.failingFor(now)
	if f == 0 {
		return ""
	}
	s := "cannot confirm with the leader for " + roundFor(f)
	if err := n.conf.lastError(); err != nil {
		s += " (" + err.Error() + ")"
	}
	return s
}

// roundFor rounds a duration for people: 1.2s, 350ms.
func roundFor(d time.Duration) string {
	if d >= time.Second {
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Millisecond).String()
}

// confirmInfo is /v1/cluster's confirm.
func (n *Node) confirmInfo(now time.Time) api.ConfirmInfo {
	idx, at := n.conf.lastConfirmed()
	ci := api.ConfirmInfo{
		LastConfirmedSeconds: max(now.Sub(at), 0).Seconds(), ConfirmedIndex: idx,
		FailingSeconds: n.conf.failingFor(now).Seconds(), TimeoutSeconds: n.opts.ConfirmTimeout.Seconds(),
	}
	if err := n.conf.lastError(); err != nil {
		ci.Error = err.Error()
	}
	switch {
	case n.withheld.any():
		ci.NotAnswering = n.withheldDetails(now)
	case ci.FailingSeconds > 0:
		ci.NotAnswering = n.confirmTrouble(now)
	default:
		ci.Answering = true
	}
	return ci
}

// Info returns the node's view of the cluster.
func (n *Node) Info() api.ClusterInfo {
	addr, lid := n.raft.LeaderWithID()
	kvIndex, keys, synced := n.fsm.info()
	in := api.ClusterInfo{
		NodeID: n.opts.ID, State: stateName(n.raft.State()), LeaderID: string(lid), LeaderAddr: string(addr),
		AppliedIndex: n.raft.AppliedIndex(), StateIndex: n.fsm.index.Load(), CommitIndex: n.raft.CommitIndex(), Term: n.raft.CurrentTerm(),
		KVIndex: kvIndex, KVKeys: keys, KVDigest: n.fsm.digest(), HoldsState: synced, CaughtUp: !n.withheld.has(withholdCatchingUp), Withholding: n.withheld.labels(),
		KV: n.KVView(), Confirm: n.confirmInfo(time.Now()), LeaderlessSeconds: n.leaderless().Seconds(), Members: []api.MemberInfo{},
	}
	if lc := n.raft.LastContact(); !lc.IsZero() && in.State != "leader" {
		in.LastContact = time.Since(lc).Round(time.Millisecond).String()
	}
	statuses := n.PeerStatuses(time.Second)
	in.Level, in.Version = n.levelInfo(statuses), n.opts.Version
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
