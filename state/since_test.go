package state

import (
	"testing"
	"time"
)

// Since moves only when a key's last valid value changes state: a new
// reason, an invalid value or an unrelated key leave it where it was.
func TestSinceMovesOnlyWithTheState(t *testing.T) {
	m := NewMirror()
	p := RampPolicy{} // no ramps
	at := func(min int) time.Time { return t0.Add(time.Duration(min) * time.Minute) }
	since := func() time.Time { return m.Snapshot().Resolve("web", "a").Since() }
	steps := []struct {
		name string
		c    Change
		at   time.Time
		want time.Time
	}{
		{"drain", set("state/web/a", "drain"), at(1), at(1)},
		{"same state, a reason", set("state/web/a", `{"state":"drain","reason":"zone b","by":"alice"}`), at(2), at(1)},
		{"an invalid value keeps the last valid one", set("state/web/a", "drian"), at(3), at(1)},
		{"back to the same valid state", set("state/web/a", "DRAIN"), at(4), at(1)},
		{"another key", set("state/web/b", "maint"), at(5), at(1)},
		{"maint", set("state/web/a", "maint"), at(6), at(6)},
		{"an entry without a time", set("state/web/a", "drain"), time.Time{}, at(6)},
		{"a weight", set("state/web/a", "50%"), at(8), at(8)},
		{"deleted", del("state/web/a"), at(9), time.Time{}},
	}
	for _, s := range steps {
		m.ApplyAt(s.c, s.at, p)
		if got := since(); !got.Equal(s.want) {
			t.Fatalf("%s: Since %v, want %v", s.name, got, s.want)
		}
	}
}

func TestSinceSurvivesExportRestore(t *testing.T) {
	m := NewMirror()
	local := t0.In(time.FixedZone("X", 3600))
	m.ApplyAt(set("state/web/a", "drain", "state/web/*", "maint"), local, RampPolicy{})
	m.ApplyAt(set("state/web/a", "bad"), t0.Add(time.Hour), RampPolicy{})
	p := persisted(t, m)
	r := Restore(p).Snapshot()
	for _, srv := range []string{"a", "*", "c"} { // c follows the wildcard
		if got := r.Resolve("web", srv).Since(); !got.Equal(t0) {
			t.Errorf("restored web/%s Since %v, want %v", srv, got, t0)
		}
	}
	// A snapshot from before Since restores with it unknown.
	p.Since = nil
	if got := Restore(p).Snapshot().Resolve("web", "a").Since(); !got.IsZero() {
		t.Errorf("Since restored from an old snapshot: %v, want zero", got)
	}
}

func TestResolutionKindAndSince(t *testing.T) {
	m := NewMirror()
	m.ApplyAt(set("state/web/d", "drain", "state/web/m", "maint", "state/web/w", "0%",
		"state/web/full", "100%", "state/web/r", "ready", "state/web/x", "nonsense", "state/web/u", "drain"), t0, rampPolicy())
	m.ApplyAt(del("state/web/u"), t0.Add(time.Minute), rampPolicy())
	s := m.Snapshot()
	for _, c := range []struct {
		server string
		kind   Kind
		since  time.Time
	}{
		{"d", KindDrain, t0}, {"m", KindMaint, t0}, {"w", KindWeight, t0},
		{"full", KindReady, t0}, {"r", KindReady, t0}, {"x", KindWithheld, time.Time{}},
		{"u", KindRamping, t0.Add(time.Minute)}, {"none", KindReady, time.Time{}},
	} {
		r := s.Resolve("web", c.server)
		if r.Kind() != c.kind || !r.Since().Equal(c.since) {
			t.Errorf("web/%s: kind %s since %v, want %s since %v", c.server, r.Kind(), r.Since(), c.kind, c.since)
		}
	}
}

// StepDue is the first interval at which the schedule moves past the
// applied weight: the time by which the leader owes the next entry.
func TestRampStepDue(t *testing.T) {
	linear := rampPolicy() // 10% to 100% over 10s, 1s steps: 9 points a step
	slow := RampPolicy{Start: 10, Duration: 24 * time.Hour, Interval: 10 * time.Second, Aggression: 1}
	for _, c := range []struct {
		name   string
		p      RampPolicy
		weight int
		want   time.Duration
	}{
		{"fresh: the first step", linear, 10, time.Second},
		{"after two steps", linear, 28, 3 * time.Second},
		{"a step behind the applied weight", linear, 30, 3 * time.Second},
		{"at the last step: the end", linear, 91, 10 * time.Second},
		{"slow ramp: 11% (rounded) after 8 minutes", slow, 10, 480 * time.Second},
		{"no interval grid left", RampPolicy{Start: 10, Duration: 5 * time.Second, Interval: 10 * time.Second, Aggression: 1}, 10, 5 * time.Second},
	} {
		r := Ramp{Target: "web/a", Started: t0, Policy: c.p, Weight: c.weight}
		if got := r.StepDue().Sub(t0); got != c.want {
			t.Errorf("%s: StepDue at +%s, want +%s", c.name, got, c.want)
		}
		// The schedule at StepDue is past the weight (or done); just
		// before it, not.
		due := r.StepDue().Sub(t0)
		if w, done := c.p.Weight(due); !done && w <= c.weight {
			t.Errorf("%s: weight %d at StepDue, not past %d", c.name, w, c.weight)
		}
		if w, done := c.p.Weight(due - time.Nanosecond); done || (w > c.weight && due > c.p.Interval) {
			t.Errorf("%s: weight %d (done %v) just before StepDue", c.name, w, done)
		}
	}
}

// Changed is Since, or the until of an expired key when the answer is
// what that key gave way to: an expiry changes the answer although no key
// changed.
func TestResolutionChanged(t *testing.T) {
	m := NewMirror()
	until := t0.Add(5 * time.Minute).Format(time.RFC3339)
	m.ApplyAt(set("state/web/*", "drain", "state/web/a", `{"state":"maint","until":"`+until+`"}`,
		"state/api/b", `{"state":"drain","until":"`+until+`"}`, "state/api/c", "drain"), t0, RampPolicy{})
	if got := m.Snapshot().Resolve("web", "a").Changed(); !got.Equal(t0) {
		t.Fatalf("before the expiry: web/a Changed %v, want %v", got, t0)
	}
	m.Expire([]string{"state/web/a", "state/api/b"}, t0.Add(6*time.Minute), RampPolicy{})
	s := m.Snapshot()
	for _, c := range []struct {
		backend, server string
		kind            Kind
		want            time.Time
	}{
		{"web", "a", KindDrain, t0.Add(5 * time.Minute)}, // its backend's drain since t0, but the answer changed at the expiry
		{"api", "b", KindReady, t0.Add(5 * time.Minute)}, // no key left in force: the expiry is all that is known
		{"api", "c", KindDrain, t0},                      // its own key
		{"api", "d", KindReady, time.Time{}},             // never set: not known
		{"web", "z", KindDrain, t0},                      // the wildcard
	} {
		r := s.Resolve(c.backend, c.server)
		if r.Kind() != c.kind || !r.Changed().Equal(c.want) {
			t.Errorf("%s/%s: %s changed %v, want %s changed %v", c.backend, c.server, r.Kind(), r.Changed(), c.kind, c.want)
		}
	}
}
