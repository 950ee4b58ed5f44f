package state

import (
	"maps"
	"slices"
	"strings"
	"time"
)

// Ramp is one undrain ramp in progress. Target is "backend/server" or
// "backend/*" (every server of the backend without a key of its own).
type Ramp struct {
	Target  string     `json:"target"`
	Started time.Time  `json:"started"`
	Policy  RampPolicy `json:"policy"`
	// Weight is the last applied step, in percent; every replica answers it.
	Weight int `json:"weight"`
}

// ETA is when the ramp reaches 100%.
func (r Ramp) ETA() time.Time { return r.Started.Add(r.Policy.Duration) }

// StepDue is when the ramp's schedule next moves past its last applied
// weight (or, with no weight step left, when it ends): the time by which
// the leader owes the next ramp entry. It depends on the ramp alone, so it
// is the same on every replica; a StepDue well in the past means the
// leader is not stepping.
func (r Ramp) StepDue() time.Time {
	p := r.Policy
	if !p.Enabled() || p.Interval <= 0 {
		return r.ETA()
	}
	// Weight only moves at whole intervals and never goes down: find the
	// first interval whose weight is above the applied one.
	n := int64(p.Duration / p.Interval) // intervals before the end
	lo, hi := int64(0), n+1             // hi: no step before the end
	for lo < hi {
		mid := lo + (hi-lo)/2
		if w, done := p.Weight(time.Duration(mid) * p.Interval); done || w > r.Weight {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	if due := r.Started.Add(time.Duration(lo) * p.Interval); lo <= n && due.Before(r.ETA()) {
		return due
	}
	return r.ETA()
}

// RampEvent reports a ramp that started or ended while applying an entry.
type RampEvent struct {
	Target string
	Start  bool // false: ended
	Reason string
	Ramp   Ramp
}

// RampSteps is the payload of a leader's ramp entry: new weights for ramps
// in progress and ramps that are done.
type RampSteps struct {
	Weights map[string]int `json:"weights,omitempty"`
	Done    []string       `json:"done,omitempty"`
}

// Empty reports whether the steps change nothing.
func (s RampSteps) Empty() bool { return len(s.Weights) == 0 && len(s.Done) == 0 }

// target returns the ramp target of a state key ("" for invalid keys).
func (e *Entry) target() string { return keyTarget(e.Key) }

// keyTarget returns the ramp target a state key names, "backend/server":
// the key without StatePrefix, so no new string. It is "" for a misshapen
// key.
func keyTarget(key string) string {
	if b, _ := splitKey(key); b == "" {
		return ""
	}
	return key[len(StatePrefix):]
}

// effective is what a target is told before ramps, by the precedence
// rule (pick): the last valid value of its own key, else (for a server)
// its backend wildcard's, else ready. ok is false when the answer is
// withheld.
func (m *Mirror) effective(target string) (v Value, ok bool) {
	b, s, _ := strings.Cut(target, "/")
	if e, _ := pick(m.entry, b, s); e != nil {
		return e.Last(), e.HasLast
	}
	return Value{Admin: Ready, Weight: 100}, true
}

func plainReady(v Value, ok bool) bool { return ok && v.Admin == Ready && !v.WeightSet }

func (m *Mirror) startsRamp(before Value, beforeOK bool, p RampPolicy) bool {
	if !beforeOK {
		return false
	}
	return before.Admin == Drain || (before.Admin == Maint && p.FromMaint)
}

// ApplyAt applies a KV change at the leader's time at and starts or ends
// ramps: a target whose effective state goes from drain (or maint, with
// FromMaint) to plain ready starts a ramp under policy, or under the key's
// own "ramp" duration (the new value's, else the old one's); a target that
// becomes anything but plain ready ends its ramp at once. A policy that
// fails Validate, alone or with the key's duration, starts no ramp: the
// target goes straight to ready 100%, the same way on every replica.
func (m *Mirror) ApplyAt(c Change, at time.Time, policy RampPolicy) []RampEvent {
	keys := append(slices.Clone(c.Delete), slices.Collect(maps.Keys(c.Set))...)
	return m.transition(keys, at, policy, func() { m.apply(c, at) })
}

// Expire treats the keys whose "until" has passed at the leader's time at
// as absent, with ApplyAt's ramp rules: an expired drain ramps back up. A
// key that is not due (no until, or until after at) is left alone, so the
// entry means the same on every replica. A later change of the key's value
// brings it back.
func (m *Mirror) Expire(keys []string, at time.Time, policy RampPolicy) []RampEvent {
	var due []string
	for _, k := range keys {
		if e := m.entry(k); e != nil && e.due(at) {
			due = append(due, k)
		}
	}
	return m.transition(due, at, policy, func() {
		for _, k := range due {
			p := m.edit(entryShard(k))
			// A copy: a snapshot may hold the entry.
			e := *p.entries[k]
			e.Expired = true
			m.putEntry(p, &e)
		}
	})
}

// Due returns the keys whose "until" has passed at now and that are not
// yet expired, sorted: what the leader's next expire entry holds. It reads
// the keys that have an until, not every key.
func (m *Mirror) Due(now time.Time) []string {
	var out []string
	for k, until := range m.until {
		if !now.Before(until) {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// due reports whether the entry's until has passed at at.
func (e *Entry) due(at time.Time) bool {
	until := e.Last().Until // zero without a last value
	return !e.Expired && !until.IsZero() && !at.Before(until)
}

// transition runs change on the mirror and starts or ends the ramps of the
// targets of keys as their effective state moved (see ApplyAt).
func (m *Mirror) transition(keys []string, at time.Time, policy RampPolicy, change func()) []RampEvent {
	// What a target was before the change: only what deciding on its ramp
	// needs, since a full read of the prefix notes every target.
	type before struct {
		admin    Admin
		plain    bool // plainReady
		starts   bool // startsRamp under policy
		override *time.Duration
	}
	targets := make(map[string]before, len(keys))
	note := func(k string) {
		if !strings.HasPrefix(k, StatePrefix) {
			return
		}
		t := keyTarget(k)
		if t == "" {
			return
		}
		v, ok := m.effective(t)
		b := before{admin: v.Admin, plain: plainReady(v, ok), starts: m.startsRamp(v, ok, policy)}
		if e := m.entry(k); e != nil && e.Last().RampSet {
			d := e.Last().Ramp
			b.override = &d
		}
		targets[t] = b
	}
	for _, k := range keys {
		note(k)
	}
	change()

	var events []RampEvent
	for _, t := range slices.Sorted(maps.Keys(targets)) {
		b := targets[t]
		v, ok := m.effective(t)
		if !plainReady(v, ok) {
			events = append(events, m.endRamps(t)...)
			continue
		}
		if b.plain || !b.starts {
			continue
		}
		p, err := policy, policy.Validate()
		switch {
		case err != nil:
			continue
		case v.RampSet:
			p, err = policy.WithDuration(v.Ramp)
		case b.override != nil:
			p, err = policy.WithDuration(*b.override)
		}
		if err != nil || !p.Enabled() {
			continue
		}
		w, _ := p.Weight(0)
		r := &Ramp{Target: t, Started: at, Policy: p, Weight: w}
		m.putRamp(r)
		events = append(events, RampEvent{Target: t, Start: true, Reason: "left " + b.admin.String(), Ramp: *r})
	}
	return events
}

// endRamps ends the ramp of target and, for a backend wildcard, the ramps of
// the backend's servers that follow the wildcard.
func (m *Mirror) endRamps(target string) []RampEvent {
	var events []RampEvent
	end := func(t string) {
		if r := m.ramp(t); r != nil {
			m.deleteRamp(t)
			events = append(events, RampEvent{Target: t, Reason: "superseded by a new state", Ramp: *r})
		}
	}
	end(target)
	b, s, _ := strings.Cut(target, "/")
	if p := m.parts[b]; s == Wildcard && p != nil {
		// The backend's ramps are all in its shard.
		for _, t := range slices.Sorted(maps.Keys(p.ramps)) {
			if strings.HasPrefix(t, b+"/") && m.entry(StatePrefix+t) == nil {
				end(t)
			}
		}
	}
	return events
}

// ApplySteps applies a leader's ramp steps. A weight never goes down.
func (m *Mirror) ApplySteps(s RampSteps) []RampEvent {
	for t, w := range s.Weights {
		if r := m.ramp(t); r != nil && w > r.Weight {
			r.Weight = min(w, 100)
			m.edit(shardName(t))
		}
	}
	var events []RampEvent
	for _, t := range s.Done {
		if r := m.ramp(t); r != nil {
			m.deleteRamp(t)
			r.Weight = 100
			events = append(events, RampEvent{Target: t, Reason: "reached 100%", Ramp: *r})
		}
	}
	return events
}

// Ramps returns copies of the ramps in progress, sorted by target.
func (m *Mirror) Ramps() []Ramp {
	out := make([]Ramp, 0, len(m.ramping))
	for _, r := range m.ramping {
		out = append(out, *r)
	}
	slices.SortFunc(out, func(a, b Ramp) int { return strings.Compare(a.Target, b.Target) })
	return out
}

// NextSteps computes, at the leader's time now, the steps due for ramps:
// each ramp's weight is the schedule's weight for the time elapsed since its
// recorded start, never below the last applied weight; ramps past their
// duration are done. A new leader calling it resumes every ramp where it
// stands.
func NextSteps(ramps []Ramp, now time.Time) RampSteps {
	var s RampSteps
	for _, r := range ramps {
		w, done := r.Policy.Weight(now.Sub(r.Started))
		switch {
		case done:
			s.Done = append(s.Done, r.Target)
		case w > r.Weight:
			if s.Weights == nil {
				s.Weights = map[string]int{}
			}
			s.Weights[r.Target] = w
		}
	}
	return s
}
