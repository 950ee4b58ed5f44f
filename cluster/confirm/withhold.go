package confirm

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
	// it would serve what the others do not (leader/gate.go). It stays until the
	// replica runs a release that understands the entry.
	withholdNotUnderstood
	// withholdUnconfirmed: no confirmation round (round.go) has
	// succeeded for longer than --leaderless-grace: the replica answered
	// nothing for that long, although it may have contact.
	withholdUnconfirmed

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
	case withholdUnconfirmed:
		return "unconfirmed", "could not confirm with a raft leader for longer than --leaderless-grace that it serves every committed change (check the raft port to the leader; /v1/cluster confirm says why)"
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
func (rs *Reads) withhold(r withholdReason, on bool, fields ...zap.Field) {
	if !rs.withheld.set(r, on) {
		return
	}
	label, detail := r.info()
	now := time.Now()
	fields = append(fields, zap.String("reason", label))
	if on {
		rs.withheldSince[bitIndex(r)].Store(now.UnixNano())
		rs.m.withholds.WithLabelValues(label).Inc()
		rs.log.Warn("withholding agent answers and failing readiness: "+detail, fields...)
		return
	}
	since := time.Unix(0, rs.withheldSince[bitIndex(r)].Load())
	rs.log.Info("no longer withholding for this reason", append(fields,
		zap.Duration("withheld_for", now.Sub(since).Round(time.Millisecond)),
		zap.Bool("answering", !rs.withheld.any()))...)
}

func bitIndex(r withholdReason) int { return bits.TrailingZeros32(uint32(r)) }

// maxWithholdReasons bounds the reasons (withheldSince's size).
const maxWithholdReasons = 8

// Serving returns the serving snapshot unless a withhold reason is in
// force (nil then), without confirming it with the leader: what a replica
// would answer from its applied state alone. The agent answers from
// Confirmed (round.go), which adds the confirmation. It never blocks and
// never allocates.
func (rs *Reads) Serving() *state.Snapshot {
	if rs.withheld.any() {
		return nil
	}
	return rs.o.State.Serving()
}

// contactEvery is how often contactLoop gathers the withhold inputs.
const contactEvery = 50 * time.Millisecond

// withholdInputs is everything the withhold decision depends on. The
// loops only gather them (contactLoop: contact, catching up; confirmLoop:
// the last confirmation; the FSM: an entry not understood);
// decideWithhold is the one place that turns them into reasons.
type withholdInputs struct {
	Now time.Time
	// LastContact is the last contact with a leader: a heartbeat or entry
	// from one (raft's LastContact on a follower), or leading; start
	// counts, so a replica has the grace to find its leader.
	LastContact time.Time
	Grace       time.Duration
	// Was is the set of reasons in force before: catching_up, once set,
	// stays until the catching-up rule holds.
	Was uint32
	// CaughtUp: the catching-up rule (caughtUp) holds now.
	CaughtUp bool
	// FailingSince is when the confirmation rounds (round.go) began to
	// fail, every one since (zero: the last one confirmed: the FSM held
	// at least the leader's commit index learned after the round began).
	// ConfirmedIndex is the last confirmed round's index (0: none yet);
	// StateIndex is what the FSM serves.
	FailingSince   time.Time
	ConfirmedIndex uint64
	StateIndex     uint64
	NotUnderstood  bool
}

// decideWithhold returns the reasons (bits of withholdReason) in force for
// in. It is pure: time is an input.
//
//   - leaderless: the last contact with a leader is older than the grace;
//   - catching_up: set from start and by every cut-off (leaderless), kept
//     until the catching-up rule holds;
//   - unconfirmed: not leaderless (that says more), but every confirmation
//     round has failed for longer than the grace (measured from the first
//     failure, which comes after the last contact when a cut-off is the
//     cause, so a cut-off says leaderless first), or the FSM went back
//     below the last confirmed index (a restore of an older snapshot): the
//     replica has answered nothing for that long although it has contact;
//     it fails readiness so that the load balancer sends checks elsewhere;
//   - not_understood: an applied entry of a newer release.
func decideWithhold(in withholdInputs) uint32 {
	var out uint32
	leaderless := in.Now.Sub(in.LastContact) > in.Grace
	if leaderless {
		out |= uint32(withholdLeaderless)
	}
	if leaderless || (in.Was&uint32(withholdCatchingUp) != 0 && !in.CaughtUp) {
		out |= uint32(withholdCatchingUp)
	}
	failing := !in.FailingSince.IsZero() && in.Now.Sub(in.FailingSince) > in.Grace
	if !leaderless && (failing || in.StateIndex < in.ConfirmedIndex) {
		out |= uint32(withholdUnconfirmed)
	}
	if in.NotUnderstood {
		out |= uint32(withholdNotUnderstood)
	}
	return out
}

// caughtUp is the catching-up rule: the leader is caught up after the
// barrier of its term (leaderDuty records it); a follower once its FSM
// serves at least the state index a leader reported over the raft port's
// status query when asked (leaderStateIndex; 0: not known yet).
//
// Why the FSM's own index on both sides: a follower caps its own commit
// index at its last log index, so a follower restarted behind the leader
// would look caught up before the leader sent it the entries it missed;
// and raft's applied index counts entries still queued for the FSM.
func caughtUp(leading, barrierDone bool, stateIndex, leaderStateIndex uint64) bool {
	if leading {
		return barrierDone
	}
	return leaderStateIndex != 0 && stateIndex >= leaderStateIndex
}

// contactLoop gathers the withhold inputs every contactEvery and applies
// decideWithhold's reasons: the leader contact, the catching-up target
// (the leader's state index, asked over the raft port's status query
// while catching up), the last confirmation. It also asks the
// confirmation loop for a round when none ran for a while, so that a
// replica without checks still knows whether it could answer.
func (rs *Reads) contactLoop() {
	defer rs.wg.Done()
	t := time.NewTicker(contactEvery)
	defer t.Stop()
	var (
		leader raft.ServerID
		target uint64    // the leader's state index; 0: not known yet
		led    time.Time // the last tick at which this node led
	)
	for {
		select {
		case <-rs.stop:
			return
		case <-t.C:
		}
		now := time.Now()
		addr, id := rs.raft.LeaderWithID()
		leading := rs.raft.State() == raft.Leader
		if leading {
			led = now
		}
		// The tick before a step-down may be late (a loaded machine):
		// the moment leadership was lost is when this node last led.
		if lu := time.Unix(0, rs.ledUntil.Load()); lu.After(led) {
			led = lu
		}
		contact := rs.o.Started
		for _, c := range []time.Time{led, rs.raft.LastContact()} {
			if c.After(contact) {
				contact = c
			}
		}
		rs.leaderContact.Store(contact.UnixNano())
		if id != leader {
			leader, target = id, 0
		}
		was := rs.withheld.bits.Load()
		barrierDone := leading && rs.barrierTerm.Load() != 0 && rs.barrierTerm.Load() == rs.raft.CurrentTerm()
		if !leading && was&uint32(withholdCatchingUp) != 0 && target == 0 && id != "" && string(id) != rs.o.ID &&
			now.Sub(contact) <= rs.o.Grace {
			st, err := rs.o.Transport.Status(rs.dial(raft.Server{ID: id, Address: addr}), 500*time.Millisecond)
			if err == nil && st.ID == string(id) && st.Leader && st.StateIndex != 0 {
				target = st.StateIndex
			}
		}
		ci, cat := rs.conf.lastConfirmed()
		var failing time.Time
		if fs := rs.conf.failSince.Load(); fs != 0 {
			failing = time.Unix(0, fs)
		}
		in := withholdInputs{
			Now: now, LastContact: contact, Grace: rs.o.Grace, Was: was,
			CaughtUp:     caughtUp(leading, barrierDone, rs.o.State.Index(), target),
			FailingSince: failing, ConfirmedIndex: ci, StateIndex: rs.o.State.Index(),
			NotUnderstood: rs.o.State.NotUnderstood() != nil,
		}
		next := decideWithhold(in)
		if next&uint32(withholdLeaderless) != 0 {
			target = 0 // from a cut-off, ask the leader again
		}
		rs.applyWithhold(was, next, in, leader, target)
		if now.Sub(cat) > confirmRefresh {
			rs.conf.wake()
		}
	}
}

// applyWithhold turns the reasons of next on and off (logged and counted
// by withhold) with the fields that say why.
func (rs *Reads) applyWithhold(was, next uint32, in withholdInputs, leader raft.ServerID, target uint64) {
	for _, r := range withholdReasons() {
		on := next&uint32(r) != 0
		if on == (was&uint32(r) != 0) {
			continue
		}
		var fields []zap.Field
		switch {
		case r == withholdLeaderless && on:
			fields = []zap.Field{zap.Duration("last_contact_ago", in.Now.Sub(in.LastContact).Round(time.Millisecond)),
				zap.Duration("leaderless_grace", in.Grace), zap.String("raft_state", strings.ToLower(rs.raft.State().String()))}
		case r == withholdLeaderless:
			fields = []zap.Field{zap.String("leader_id", string(leader))}
		case r == withholdCatchingUp && !on:
			fields = []zap.Field{zap.Uint64("state_index", in.StateIndex), zap.Uint64("leader_state_index", target), zap.String("leader_id", string(leader))}
		case r == withholdUnconfirmed:
			fields = []zap.Field{zap.Duration("confirm_failing_for", rs.conf.failingFor(in.Now).Round(time.Millisecond)),
				zap.Uint64("confirmed_index", in.ConfirmedIndex), zap.Uint64("state_index", in.StateIndex)}
			if err := rs.conf.lastError(); err != nil && on {
				fields = append(fields, zap.Error(err))
			}
		}
		rs.withhold(r, on, fields...)
	}
}

// leaderContactAge is how long ago this node last had contact with a
// leader (0 while it leads), as contactLoop last saw it.
func (rs *Reads) leaderContactAge() time.Duration {
	return max(time.Since(time.Unix(0, rs.leaderContact.Load())), 0)
}
