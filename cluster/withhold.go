package cluster

// This file holds the one place that decides whether a replica answers
// agent checks and is ready: a small set of withhold reasons, each set and
// cleared by the code that knows it, combined here. A replica with any
// reason set answers nothing (HAProxy keeps each server's last state) and
// fails readiness, so the load balancer sends every check to replicas that
// can vouch for what they serve. "The agent never guesses."
//
// Adding a reason is one constant and one case in info.

import (
	"math/bits"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"github.com/hastate/hastate/state"
	"go.uber.org/zap"
)

// withholdReason is one reason to withhold every answer; reasons are bits
// of a withholdSet.
type withholdReason uint32

const (
	// withholdCatchingUp: since it started, or since it was cut off from
	// its leader, the replica has not yet caught up with a leader (it may
	// serve less than the others).
	withholdCatchingUp withholdReason = 1 << iota
	// withholdLeaderless: the replica's last contact with a leader is
	// older than --leaderless-grace (it may have missed changes).
	withholdLeaderless
	// withholdNotUnderstood: the replica applied a raft entry it does not
	// understand (a type or feature level of a newer release); skipping
	// it would serve what the others do not (gate.go). It stays until the
	// replica runs a release that understands the entry.
	withholdNotUnderstood

	withholdEnd // one past the last reason
)

// info is a reason's metric label and its readiness detail.
func (r withholdReason) info() (label, detail string) {
	switch r {
	case withholdCatchingUp:
		return "catching_up", "has not caught up with a raft leader since it started or was cut off (check peers and the raft port)"
	case withholdLeaderless:
		return "leaderless", "no contact with a raft leader for longer than --leaderless-grace: it may have missed changes (check the raft port and the network to the peers)"
	case withholdNotUnderstood:
		return "not_understood", "applied a raft entry of a newer release that this one does not understand: upgrade this replica (/v1/cluster level.not_understood names the entry)"
	}
	return "unknown", "unknown reason"
}

// withholdReasons lists every reason, in bit order.
func withholdReasons() []withholdReason {
	var out []withholdReason
	for r := withholdReason(1); r < withholdEnd; r <<= 1 {
		out = append(out, r)
	}
	return out
}

// withholdSet is the set of reasons in force. The agent hot path reads it
// with one atomic load.
type withholdSet struct{ bits atomic.Uint32 }

// set turns r on or off and reports whether that changed the set.
func (s *withholdSet) set(r withholdReason, on bool) bool {
	for {
		old := s.bits.Load()
		next := old &^ uint32(r)
		if on {
			next = old | uint32(r)
		}
		if old == next {
			return false
		}
		if s.bits.CompareAndSwap(old, next) {
			return true
		}
	}
}

func (s *withholdSet) has(r withholdReason) bool { return s.bits.Load()&uint32(r) != 0 }
func (s *withholdSet) any() bool                 { return s.bits.Load() != 0 }

// details joins the readiness details of the reasons in force.
func (s *withholdSet) details() string {
	var parts []string
	for _, r := range withholdReasons() {
		if s.has(r) {
			_, d := r.info()
			parts = append(parts, d)
		}
	}
	return strings.Join(parts, "; ")
}

// labels lists the metric labels of the reasons in force.
func (s *withholdSet) labels() []string {
	var out []string
	for _, r := range withholdReasons() {
		if s.has(r) {
			l, _ := r.info()
			out = append(out, l)
		}
	}
	return out
}

// withhold turns reason r on or off, and logs and counts the change.
func (n *Node) withhold(r withholdReason, on bool, fields ...zap.Field) {
	if !n.withheld.set(r, on) {
		return
	}
	label, detail := r.info()
	now := time.Now()
	fields = append(fields, zap.String("reason", label))
	if on {
		n.withheldSince[bitIndex(r)].Store(now.UnixNano())
		n.metrics.withholds.WithLabelValues(label).Inc()
		n.log.Warn("withholding agent answers and failing readiness: "+detail, fields...)
		return
	}
	since := time.Unix(0, n.withheldSince[bitIndex(r)].Load())
	n.log.Info("no longer withholding for this reason", append(fields,
		zap.Duration("withheld_for", now.Sub(since).Round(time.Millisecond)),
		zap.Bool("answering", !n.withheld.any()))...)
}

func bitIndex(r withholdReason) int { return bits.TrailingZeros32(uint32(r)) }

// maxWithholdReasons bounds the reasons (withheldSince's size).
const maxWithholdReasons = 8

// Serving returns the serving snapshot for agent answers: nil (withhold)
// while any withhold reason is in force, else the same as Snapshot. It
// never blocks and never allocates.
func (n *Node) Serving() *state.Snapshot {
	if n.withheld.any() {
		return nil
	}
	return n.fsm.serving.Load()
}

// contactEvery is how often contactLoop looks at the leader contact.
const contactEvery = 50 * time.Millisecond

// contactLoop keeps the leader-contact reasons: withholdLeaderless once the
// last contact with a leader is older than the grace, and
// withholdCatchingUp from start, and from every such cut-off, until the
// node serves everything a leader served when this node asked it.
//
// Contact is a heartbeat or entry from a leader (raft's LastContact on a
// follower), or being the leader: a leader that lost its quorum steps down
// after raft's LeaderLeaseTimeout and from then on ages like any follower.
// Start counts as contact, so a replica has the grace to find its leader.
//
// Catching up compares the FSM's own index on both sides (the leader's
// comes over the raft port's status query). The node's own commit index
// cannot tell: a follower caps it at its last log index, so a follower
// restarted behind the leader would look caught up before the leader sent
// it the entries it missed; and raft's applied index counts entries still
// queued for the FSM. The leader itself is caught up after the barrier of
// its term (leaderDuty records it).
func (n *Node) contactLoop() {
	defer n.wg.Done()
	t := time.NewTicker(contactEvery)
	defer t.Stop()
	var (
		leader raft.ServerID
		target uint64    // the leader's state index; 0: not known yet
		led    time.Time // the last tick at which this node led
	)
	for {
		select {
		case <-n.stop:
			return
		case <-t.C:
		}
		now := time.Now()
		addr, id := n.raft.LeaderWithID()
		leading := n.raft.State() == raft.Leader
		if leading {
			led = now
		}
		contact := n.started
		for _, c := range []time.Time{led, n.raft.LastContact()} {
			if c.After(contact) {
				contact = c
			}
		}
		n.leaderContact.Store(contact.UnixNano())
		if age := now.Sub(contact); age > n.opts.LeaderlessGrace {
			if !n.withheld.has(withholdLeaderless) {
				n.withhold(withholdLeaderless, true, zap.Duration("last_contact_ago", age.Round(time.Millisecond)),
					zap.Duration("leaderless_grace", n.opts.LeaderlessGrace), zap.String("raft_state", stateName(n.raft.State())))
			}
			n.withhold(withholdCatchingUp, true)
			leader, target = "", 0
			continue
		}
		n.withhold(withholdLeaderless, false, zap.String("leader_id", string(id)))
		if !n.withheld.has(withholdCatchingUp) {
			continue
		}
		if leading {
			if term := n.barrierTerm.Load(); term != 0 && term == n.raft.CurrentTerm() {
				n.withhold(withholdCatchingUp, false, zap.Uint64("state_index", n.fsm.index.Load()), zap.String("leader_id", n.opts.ID))
			}
			continue
		}
		if id == "" || string(id) == n.opts.ID {
			continue // no leader known yet
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
			n.withhold(withholdCatchingUp, false, zap.Uint64("state_index", n.fsm.index.Load()), zap.Uint64("leader_state_index", target),
				zap.String("leader_id", string(leader)))
		}
	}
}

// leaderContactAge is how long ago this node last had contact with a
// leader (0 while it leads), as contactLoop last saw it.
func (n *Node) leaderContactAge() time.Duration {
	return max(time.Since(time.Unix(0, n.leaderContact.Load())), 0)
}
