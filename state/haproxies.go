package state

// This file holds the cluster's record of which HAProxy nodes exist: each
// source address that polled a replica and, coarsely, when it last did.
// Every replica keeps its own table of who asked it for what (per server,
// in memory); this record is the small part of it that the cluster
// replicates (from LevelRecorded on), so that an operator command can tell
// an HAProxy that only a lost replica saw from one that is gone.

import (
	"maps"
	"slices"
	"strings"
	"time"
)

// The record's bounds. They set its write volume: an entry at most every
// HAProxySyncEvery, and in a steady fleet (every HAProxy polling) one
// every HAProxyCoarse, holding every source once.
const (
	// HAProxySyncEvery is how often the leader gathers what every
	// replica saw and writes what changed.
	HAProxySyncEvery = 5 * time.Second
	// HAProxyCoarse is the record's resolution of the last poll: a
	// source's Last moves only once it is this much older than what a
	// replica saw. So the record says when a source last polled to
	// within HAProxyCoarse + HAProxySyncEvery.
	HAProxyCoarse = 30 * time.Second
	// HAProxyForget is how long a source that stopped polling stays in
	// the record (the replicas forget its polls after as long).
	HAProxyForget = 10 * time.Minute
	// MaxHAProxies bounds the record; sources beyond it are not
	// recorded (HAProxyPlan.Over counts them).
	MaxHAProxies = 10_000
	// MaxHAProxyBatch bounds the sources one entry records.
	MaxHAProxyBatch = 2_000
)

// HAProxySeen is what the record holds of one source: when it was first
// recorded and when it last polled (to within HAProxyCoarse).
type HAProxySeen struct {
	First time.Time `json:"first"`
	Last  time.Time `json:"last"`
}

// HAProxies is the record, by source address (an IP address as the
// replicas' poller tables name it). The state machine's data: changed
// only by Apply.
type HAProxies map[string]HAProxySeen

// HAProxyChange is the payload of a haproxies entry: sources seen (new,
// or last polled later than recorded) and sources to forget.
type HAProxyChange struct {
	Seen   map[string]time.Time `json:"seen,omitempty"`
	Forget []string             `json:"forget,omitempty"`
}

// Empty reports whether the change changes nothing.
func (c HAProxyChange) Empty() bool { return len(c.Seen) == 0 && len(c.Forget) == 0 }

// Apply applies c to the record in place (h must not be nil). It depends
// on c alone: a source seen is added (First = Last = its time) or its Last
// moves forward, never back; a source forgotten is removed; beyond
// MaxHAProxies a new source is not added.
func (h HAProxies) Apply(c HAProxyChange) {
	for _, src := range c.Forget {
		delete(h, src)
	}
	for _, src := range slices.Sorted(maps.Keys(c.Seen)) {
		t := c.Seen[src]
		old, ok := h[src]
		switch {
		case !ok && len(h) >= MaxHAProxies:
		case !ok:
			h[src] = HAProxySeen{First: t, Last: t}
		case t.After(old.Last):
			old.Last = t
			h[src] = old
		}
	}
}

// Clone returns a copy of the record.
func (h HAProxies) Clone() HAProxies { return maps.Clone(h) }

// HAProxyPlan is what the leader writes after a gathering: Change (empty:
// nothing to write) and Over, the sources seen that the record has no
// room for.
type HAProxyPlan struct {
	Change HAProxyChange
	Over   int
}

// PlanHAProxies returns what the record needs after the replicas that
// answered reported seen (each source's latest poll on any of them) at
// now: a source not recorded, or seen HAProxyCoarse or more after its
// recorded Last, is recorded; a recorded source neither seen nor recorded
// within HAProxyForget is forgotten. A source whose poll only a replica
// that did not answer saw keeps its record until it is forgotten. At most
// MaxHAProxyBatch sources are recorded per entry, the oldest records
// first; the rest follow in the next.
func PlanHAProxies(rec HAProxies, seen map[string]time.Time, now time.Time) HAProxyPlan {
	var p HAProxyPlan
	type cand struct {
		src  string
		last time.Time // the recorded Last; zero: new
		t    time.Time
	}
	var cands []cand
	room := MaxHAProxies - len(rec)
	for src, t := range seen {
		old, ok := rec[src]
		switch {
		case !ok && room <= 0:
			p.Over++
		case !ok:
			room--
			cands = append(cands, cand{src, time.Time{}, t})
		case t.Sub(old.Last) >= HAProxyCoarse:
			cands = append(cands, cand{src, old.Last, t})
		}
	}
	slices.SortFunc(cands, func(a, b cand) int {
		if c := a.last.Compare(b.last); c != 0 {
			return c
		}
		return strings.Compare(a.src, b.src)
	})
	for i, c := range cands {
		if i == MaxHAProxyBatch {
			break
		}
		if p.Change.Seen == nil {
			p.Change.Seen = map[string]time.Time{}
		}
		p.Change.Seen[c.src] = c.t
	}
	for src, old := range rec {
		if t, ok := seen[src]; ok && now.Sub(t) < HAProxyForget {
			continue
		}
		if now.Sub(old.Last) >= HAProxyForget {
			p.Change.Forget = append(p.Change.Forget, src)
		}
	}
	slices.Sort(p.Change.Forget)
	return p
}
