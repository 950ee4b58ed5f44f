package leader

// This file holds the answer to "can this replica mirror Consul?" as the
// cluster uses it: each node's verdict (the wiring's ConsulHealth.Verdict,
// a typed api.MirrorReason), reported to its peers over the raft port, and
// the leader's hand-over to a follower that can mirror when it cannot
// (kvFailoverLoop). A reason about which Consul or prefix the replica
// reads (another cluster, another prefix) hands over at once: no wait
// makes it right. Any other (Consul unreachable, not Consul, a token that
// cannot read) hands over after --kv-failover-after, as a lost Consul did.

import (
	"context"
	"slices"
	"time"

	"github.com/hashicorp/raft"
	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/state"
	"go.uber.org/zap"
)

// failoverEvery is how often the leader checks its own verdict.
const failoverEvery = time.Second

// identityRetry is the least time between two hand-over attempts of a
// leader whose Consul or prefix differs (a transfer takes well under it).
const identityRetry = 2 * time.Second

// Verdict is the verdict of a node whose Consul health is h (as its
// wiring reports it): the wiring's verdict when it is not ok, else whether
// h's source is rec, the one recorded in raft (with none recorded, any
// source may mirror; with one recorded, a node that cannot tell which
// Consul it reads cannot).
func Verdict(h ConsulHealth, rec *state.MirrorSource) api.MirrorVerdict {
	v := h.Reported()
	if !v.CanMirror() || rec == nil {
		return v
	}
	if h.Source == nil {
		return api.MirrorVerdict{Reason: api.MirrorConsulUnreachable,
			Detail: "cannot tell which Consul cluster this replica reads (its identity has not been read yet): check Consul at CONSUL_HTTP_ADDR / --consul-addr"}
	}
	return api.SourceVerdict(*h.Source, *rec)
}

// kvFailoverLoop hands leadership to a follower that can mirror when this
// leader cannot: at once when its Consul or prefix is not the recorded
// one or its token may not read the prefix (whatever KVFailoverAfter
// says), after KVFailoverAfter for any other reason (never when it is
// negative). With no such follower
// it keeps leadership (applying nothing it cannot vouch for) and says so
// when that changes and every 30s.
func (d *Duties) kvFailoverLoop(ctx context.Context) {
	t := time.NewTicker(failoverEvery)
	defer t.Stop()
	var (
		badSince    time.Time // first tick of the current streak of a verdict other than ok
		lastAttempt time.Time
		saidAlone   time.Time
		unread      bool // the streak is of a Consul that answers, its identity not read yet
	)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		h := d.o.ConsulHealth()
		v := Verdict(h, d.RecordedSource())
		if v.CanMirror() {
			badSince, saidAlone, unread = time.Time{}, time.Time{}, false
			continue
		}
		now := time.Now()
		// Consul answers again but its identity is not read yet (this
		// replica started while Consul was down; the wiring re-reads it
		// every 2s while that fails): a streak of its own, so that an
		// outage longer than KVFailoverAfter does not hand over in the
		// seconds before the re-read. It hands over if the identity
		// stays unread for KVFailoverAfter.
		if u := h.Reachable && h.Source == nil && v.Reason == api.MirrorConsulUnreachable; u != unread {
			unread = u
			if u {
				badSince = time.Time{}
			}
		}
		if badSince.IsZero() {
			badSince = now
			if !unread && !v.Since.IsZero() && v.Since.Before(now) {
				badSince = v.Since
			}
		}
		wait, retry := d.o.KVFailoverAfter, d.o.KVFailoverAfter
		switch {
		case v.Identity(), v.Reason == api.MirrorTokenCannotRead:
			// Consul's own answer (another cluster or prefix; 403 on the
			// read proof), not a guess from a timeout: a follower that
			// can mirror takes over at once.
			wait, retry = 0, identityRetry
		case wait < 0:
			continue // --kv-failover-after negative: never for a lost Consul
		}
		if now.Sub(badSince) < wait || now.Sub(lastAttempt) < retry {
			continue
		}
		lastAttempt = now
		fields := []zap.Field{zap.String("reason", string(v.Reason)), zap.String("detail", v.Detail),
			zap.Duration("for", now.Sub(badSince).Round(time.Second))}
		if target, ok := d.mirroringFollower(); ok {
			d.log.Warn("leader cannot mirror Consul; handing leadership to a follower that can", append(fields, zap.String("to", string(target.ID)))...)
			if err := d.o.Raft.LeadershipTransferToServer(target.ID, target.Address).Error(); err != nil {
				d.log.Warn("leadership transfer to a follower that can mirror failed; will retry", zap.Error(err))
			} else {
				d.m.kvFailovers.Inc()
			}
			continue
		}
		if saidAlone.IsZero() || now.Sub(saidAlone) >= 30*time.Second {
			saidAlone = now
			d.log.Warn("leader cannot mirror Consul and no follower reports it can; keeping leadership, applying nothing it cannot vouch for, serving the last state", fields...)
		}
	}
}

// mirroringFollower returns a voter, not this node, whose verdict is ok,
// preferring the one whose state is the newest.
func (d *Duties) mirroringFollower() (raft.Server, bool) {
	f := d.o.Raft.GetConfiguration()
	if f.Error() != nil {
		return raft.Server{}, false
	}
	statuses := d.o.Peers.Statuses(2 * time.Second)
	var cands []raft.Server
	for _, s := range f.Configuration().Servers {
		if string(s.ID) == d.o.ID || s.Suffrage != raft.Voter {
			continue
		}
		if st, ok := statuses[string(s.ID)]; ok && st.Verdict().CanMirror() {
			cands = append(cands, s)
		}
	}
	if len(cands) == 0 {
		return raft.Server{}, false
	}
	slices.SortStableFunc(cands, func(a, b raft.Server) int {
		ia, ib := statuses[string(a.ID)].StateIndex, statuses[string(b.ID)].StateIndex
		switch {
		case ia > ib:
			return -1
		case ia < ib:
			return 1
		}
		return 0
	})
	return cands[0], true
}

// ConsulHealth is one node's view of its Consul, from the wiring.
type ConsulHealth struct {
	// Reachable: this node can read the KV prefix and, on the leader, its
	// watch is delivering (not failing reads or applies).
	Reachable bool
	// FailingSince is when Consul became unreachable (zero when reachable).
	FailingSince time.Time
	Checked      time.Time
	// SyncedAt is, on the leader, the last time its mirror was known to
	// hold Consul's content, and SyncedIndex the Consul index it then held;
	// zero when it has not synced in this term.
	SyncedAt    time.Time
	SyncedIndex uint64
	// TokenProblem is set while Consul refuses this node's token what the
	// mirror needs (on the leader: its watch holds the last state).
	TokenProblem *api.TokenProblem
	// Verdict is whether this node could mirror Consul into raft if it
	// led, and why not, as far as the wiring knows (Consul unreachable,
	// not Consul, the token). The zero Reason is read from Reachable:
	// MirrorOK or MirrorConsulUnreachable. The node adds what it knows
	// (Verdict): whether Source is the one recorded in raft.
	Verdict api.MirrorVerdict
	// Source is the Consul cluster and prefix this node reads (nil: not
	// known yet, e.g. Consul has not answered since the start).
	Source *state.MirrorSource
}

// Reported is h's mirror verdict as the wiring reported it, its zero
// Reason read from Reachable.
func (h ConsulHealth) Reported() api.MirrorVerdict {
	switch {
	case h.Verdict.Reason != "":
		return h.Verdict
	case h.Reachable:
		return api.MirrorVerdict{Reason: api.MirrorOK}
	default:
		return api.MirrorVerdict{Reason: api.MirrorConsulUnreachable, Since: h.FailingSince,
			Detail: "this replica cannot read Consul (check CONSUL_HTTP_ADDR / --consul-addr, TLS, the token and the Consul servers)"}
	}
}
