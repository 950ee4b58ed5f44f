package state

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func rampPolicy() RampPolicy {
	return RampPolicy{Start: 10, Duration: 10 * time.Second, Interval: time.Second, Aggression: 1}
}

func lookup(m *Mirror, req string) string {
	return string(m.Snapshot().Lookup([]byte(req), strings.IndexByte(req, '/')))
}

func set(kv ...string) Change {
	c := Change{Set: map[string]string{}}
	for i := 0; i < len(kv); i += 2 {
		c.Set[kv[i]] = kv[i+1]
	}
	return c
}

func del(keys ...string) Change { return Change{Delete: keys} }

func TestRampStartsOnUndrainAndStepsUp(t *testing.T) {
	m := NewMirror()
	p := rampPolicy()
	m.ApplyAt(set("state/web/a", "drain"), t0, p)
	ev := m.ApplyAt(del("state/web/a"), t0, p)
	if len(ev) != 1 || !ev[0].Start || ev[0].Target != "web/a" {
		t.Fatalf("events %+v, want one start for web/a", ev)
	}
	if got := lookup(m, "web/a"); got != "ready 10%\n" {
		t.Fatalf("answer at ramp start %q", got)
	}
	if got := lookup(m, "web/b"); got != "ready 100%\n" {
		t.Fatalf("other server %q", got)
	}
	steps := NextSteps(m.Ramps(), t0.Add(5*time.Second))
	if steps.Weights["web/a"] != 55 {
		t.Fatalf("steps at 5s: %+v", steps)
	}
	m.ApplySteps(steps)
	if got := lookup(m, "web/a"); got != "ready 55%\n" {
		t.Fatalf("answer after step %q", got)
	}
	// A step back is ignored.
	m.ApplySteps(RampSteps{Weights: map[string]int{"web/a": 30}})
	if got := lookup(m, "web/a"); got != "ready 55%\n" {
		t.Fatalf("weight went down: %q", got)
	}
	steps = NextSteps(m.Ramps(), t0.Add(10*time.Second))
	if len(steps.Done) != 1 {
		t.Fatalf("steps at the end: %+v", steps)
	}
	if ev := m.ApplySteps(steps); len(ev) != 1 || ev[0].Start {
		t.Fatalf("end events %+v", ev)
	}
	if got := lookup(m, "web/a"); got != "ready 100%\n" || len(m.Ramps()) != 0 {
		t.Fatalf("after the end: %q, ramps %v", got, m.Ramps())
	}
}

func TestRampTransitions(t *testing.T) {
	tests := []struct {
		name   string
		policy func(*RampPolicy)
		steps  []Change
		want   map[string]string // request -> answer after the last step
		ramps  int
	}{
		{"explicit ready ramps too", nil,
			[]Change{set("state/web/a", "drain"), set("state/web/a", "ready")},
			map[string]string{"web/a": "ready 10%\n"}, 1},
		{"key ramp 0 disables", nil,
			[]Change{set("state/web/a", "drain"), set("state/web/a", `{"state":"ready","ramp":"0"}`)},
			map[string]string{"web/a": "ready 100%\n"}, 0},
		{"old key's ramp override applies on delete", nil,
			[]Change{set("state/web/a", `{"state":"drain","ramp":"0"}`), del("state/web/a")},
			map[string]string{"web/a": "ready 100%\n"}, 0},
		{"maint does not ramp by default", nil,
			[]Change{set("state/web/a", "maint"), del("state/web/a")},
			map[string]string{"web/a": "ready 100%\n"}, 0},
		{"maint ramps with from_maint", func(p *RampPolicy) { p.FromMaint = true },
			[]Change{set("state/web/a", "maint"), del("state/web/a")},
			map[string]string{"web/a": "ready 10%\n"}, 1},
		{"a weight is not a drain", nil,
			[]Change{set("state/web/a", "25%"), del("state/web/a")},
			map[string]string{"web/a": "ready 100%\n"}, 0},
		{"no ramp with duration 0", func(p *RampPolicy) { p.Duration = 0 },
			[]Change{set("state/web/a", "drain"), del("state/web/a")},
			map[string]string{"web/a": "ready 100%\n"}, 0},
		{"drain during a ramp ends it", nil,
			[]Change{set("state/web/a", "drain"), del("state/web/a"), set("state/web/a", "drain")},
			map[string]string{"web/a": "drain\n"}, 0},
		{"N% during a ramp ends it", nil,
			[]Change{set("state/web/a", "drain"), del("state/web/a"), set("state/web/a", "30%")},
			map[string]string{"web/a": "ready 30%\n"}, 0},
		{"invalid value during a drain keeps the drain, no ramp", nil,
			[]Change{set("state/web/a", "drain"), set("state/web/a", "bogus")},
			map[string]string{"web/a": "drain\n"}, 0},
		{"backend wildcard ramps every server without its own key", nil,
			[]Change{set("state/web/*", "drain", "state/web/m", "maint"), del("state/web/*")},
			map[string]string{"web/x": "ready 10%\n", "web/y": "ready 10%\n", "web/m": "maint\n", "api/x": "ready 100%\n"}, 1},
		{"server falling back to a drained wildcard does not ramp", nil,
			[]Change{set("state/web/*", "drain", "state/web/a", "drain"), del("state/web/a")},
			map[string]string{"web/a": "drain\n", "web/b": "drain\n"}, 0},
		{"wildcard drain ends the ramps of servers following it", nil,
			[]Change{set("state/web/a", "drain"), del("state/web/a"), set("state/web/*", "drain")},
			map[string]string{"web/a": "drain\n"}, 0},
		{"a server's own ready key ignores the wildcard's ramp", nil,
			[]Change{set("state/web/*", "drain", "state/web/a", "ready"), del("state/web/*")},
			map[string]string{"web/a": "ready 100%\n", "web/b": "ready 10%\n"}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := rampPolicy()
			if tt.policy != nil {
				tt.policy(&p)
			}
			m := NewMirror()
			for i, c := range tt.steps {
				m.ApplyAt(c, t0.Add(time.Duration(i)*time.Millisecond), p)
			}
			for req, want := range tt.want {
				if got := lookup(m, req); got != want {
					t.Errorf("%s: %q, want %q", req, got, want)
				}
			}
			if len(m.Ramps()) != tt.ramps {
				t.Errorf("ramps %+v, want %d", m.Ramps(), tt.ramps)
			}
		})
	}
}

func TestRampOverrideDuration(t *testing.T) {
	m := NewMirror()
	m.ApplyAt(set("state/web/a", `{"state":"drain","ramp":"10m"}`), t0, rampPolicy())
	m.ApplyAt(del("state/web/a"), t0, rampPolicy())
	if r := m.Ramps(); len(r) != 1 || r[0].Policy.Duration != 10*time.Minute {
		t.Fatalf("ramps %+v, want the old key's 10m", r)
	}
	m.ApplyAt(set("state/web/b", "drain"), t0, rampPolicy())
	m.ApplyAt(set("state/web/b", `{"state":"ready","ramp":"1m"}`), t0, rampPolicy())
	if r := m.Ramps(); len(r) != 2 || r[1].Policy.Duration != time.Minute {
		t.Fatalf("ramps %+v, want the new key's 1m", r)
	}
}

// A new leader resumes from the recorded start and the last applied weight.
func TestNextStepsResumesWithoutStepBack(t *testing.T) {
	r := Ramp{Target: "web/a", Started: t0, Policy: rampPolicy(), Weight: 60}
	// At 4s the schedule says 46: below the applied 60, so no step.
	if s := NextSteps([]Ramp{r}, t0.Add(4*time.Second)); !s.Empty() {
		t.Fatalf("step back proposed: %+v", s)
	}
	if s := NextSteps([]Ramp{r}, t0.Add(7*time.Second)); s.Weights["web/a"] != 73 {
		t.Fatalf("resume at 7s: %+v", s)
	}
	// A leader whose clock is behind the start proposes nothing.
	if s := NextSteps([]Ramp{r}, t0.Add(-time.Minute)); !s.Empty() {
		t.Fatalf("clock behind: %+v", s)
	}
	if s := NextSteps([]Ramp{r}, t0.Add(time.Hour)); len(s.Done) != 1 {
		t.Fatalf("long after: %+v", s)
	}
}

// persisted returns m's durable form as a raft snapshot carries it:
// through JSON.
func persisted(t *testing.T, m *Mirror) Persisted {
	t.Helper()
	data, err := json.Marshal(m.Export())
	if err != nil {
		t.Fatal(err)
	}
	var p Persisted
	if err := json.Unmarshal(data, &p); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestRampsSurviveExportRestore(t *testing.T) {
	m := NewMirror()
	m.ApplyAt(set("state/web/*", "drain"), t0, rampPolicy())
	m.ApplyAt(del("state/web/*"), t0, rampPolicy())
	m.ApplySteps(RampSteps{Weights: map[string]int{"web/*": 42}})
	r := Restore(persisted(t, m))
	if got := lookup(r, "web/q"); got != "ready 42%\n" {
		t.Fatalf("restored answer %q", got)
	}
	if got := r.Ramps(); len(got) != 1 || !got[0].Started.Equal(t0) || got[0].Policy != rampPolicy() {
		t.Fatalf("restored ramps %+v", got)
	}
	res := r.Snapshot().Resolve("web", "q")
	if res.Ramp == nil || res.Ramp.Weight != 42 || res.Source != SourceAbsent {
		t.Fatalf("resolution %+v", res)
	}
}

// TestRampEntriesBoundedByWeights: weights are whole percents, so however
// small the interval, a leader that asks for steps at every tick writes at
// most one entry per weight change plus the end: about 100 per ramp. Asked
// every millisecond with a 1ms interval (a schedule of 600,000 steps), a
// ramp from 10% costs at most 91 entries, and no entry is empty.
func TestRampEntriesBoundedByWeights(t *testing.T) {
	for _, p := range []RampPolicy{
		{Start: 10, Duration: 10 * time.Minute, Interval: time.Millisecond, Aggression: 1},
		{Start: 0, Duration: 10 * time.Minute, Interval: time.Millisecond, Aggression: 0.2},
		{Start: 10, Duration: 10 * time.Minute, Interval: MinRampInterval, Aggression: 5},
	} {
		// Started directly: a 1ms interval fails Validate today, but a
		// ramp restored from an older snapshot may carry one.
		m := NewMirror()
		m.Apply(Change{})
		w, _ := p.Weight(0)
		m.putRamp(&Ramp{Target: "web/a", Started: t0, Policy: p, Weight: w})
		entries := 0
		for now := t0; len(m.Ramps()) > 0; now = now.Add(time.Millisecond) {
			s := NextSteps(m.Ramps(), now)
			if s.Empty() {
				continue
			}
			entries++
			before := m.Ramps()[0].Weight
			m.ApplySteps(s)
			if len(m.Ramps()) > 0 && m.Ramps()[0].Weight == before {
				t.Fatalf("%+v: entry %d at %s changed no weight: %+v", p, entries, now.Sub(t0), s)
			}
		}
		if max := 100 - p.Start + 1; entries > max || entries < 2 {
			t.Errorf("%+v: %d entries for one ramp, want at most %d", p, entries, max)
		}
		t.Logf("interval %s aggression %v: %d entries for one ramp from %d%%", p.Interval, p.Aggression, entries, p.Start)
	}
}

// An expiring drain ("until"): the leader's Expire treats the key as absent
// once its time has passed, through a ramp; not before; the expired mark
// survives a snapshot; a new value brings the key back.
func TestExpireRampsAnExpiredDrainBackUp(t *testing.T) {
	m := NewMirror()
	p := rampPolicy()
	until := t0.Add(time.Hour).Format(time.RFC3339)
	m.ApplyAt(set("state/web/a", `{"state":"drain","until":"`+until+`"}`, "state/web/*", "maint"), t0, p)
	if due := m.Due(t0.Add(59 * time.Minute)); len(due) != 0 {
		t.Fatalf("due before until: %v", due)
	}
	if ev := m.Expire([]string{"state/web/a"}, t0.Add(59*time.Minute), p); len(ev) != 0 || lookup(m, "web/a") != "drain\n" {
		t.Fatalf("an expire entry before until changed the answer: %v %q", ev, lookup(m, "web/a"))
	}
	at := t0.Add(time.Hour)
	due := m.Due(at)
	if len(due) != 1 || due[0] != "state/web/a" {
		t.Fatalf("due at until: %v", due)
	}
	// The backend-wide maint applies now; no ramp from drain to maint.
	if ev := m.Expire(due, at, p); len(ev) != 0 || lookup(m, "web/a") != "maint\n" {
		t.Fatalf("after expiry: events %v, answer %q; want maint from the wildcard", ev, lookup(m, "web/a"))
	}
	r := m.Snapshot().Resolve("web", "a")
	if r.Expired == nil || r.Expired.Key != "state/web/a" || r.Source != "state/web/*" {
		t.Fatalf("resolution %+v, want the expired key named and the wildcard as source", r)
	}
	if m.Due(at.Add(time.Hour)) != nil {
		t.Fatal("an expired key is due again")
	}
	restored := Restore(m.Export())
	if lookup(restored, "web/a") != "maint\n" {
		t.Fatalf("after a snapshot: %q", lookup(restored, "web/a"))
	}
	// Without the wildcard, an expired drain ramps back up.
	m = NewMirror()
	m.ApplyAt(set("state/web/b", `{"state":"drain","until":"`+until+`"}`), t0, p)
	ev := m.Expire(m.Due(at), at, p)
	if len(ev) != 1 || !ev[0].Start || lookup(m, "web/b") != "ready 10%\n" {
		t.Fatalf("expired drain: events %+v, answer %q; want a ramp from 10%%", ev, lookup(m, "web/b"))
	}
	// A new value brings the key back.
	m.ApplyAt(set("state/web/b", "drain"), at.Add(time.Minute), p)
	if lookup(m, "web/b") != "drain\n" {
		t.Fatalf("a new value after expiry: %q", lookup(m, "web/b"))
	}
}

// dueByScan is Due as it was before the until index: a scan of every
// entry.
func dueByScan(m *Mirror, now time.Time) []string {
	var out []string
	for _, p := range m.parts {
		for k, e := range p.entries {
			if e.due(now) {
				out = append(out, k)
			}
		}
	}
	slices.Sort(out)
	return out
}

// rampsByScan is Ramps as it was before the ramping index: a scan of
// every part.
func rampsByScan(m *Mirror) []Ramp {
	out := []Ramp{}
	for _, p := range m.parts {
		for _, r := range p.ramps {
			out = append(out, *r)
		}
	}
	slices.SortFunc(out, func(a, b Ramp) int { return strings.Compare(a.Target, b.Target) })
	return out
}

// TestIndexesMatchFullScan applies random KV changes (values with and
// without until, invalid values, deletes, misshapen keys), expiries, ramp
// steps and export/restore round trips, and after each one checks that
// Due and Ramps, which read indexes, return what a scan of every entry and
// part returns.
func TestIndexesMatchFullScan(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	var keys []string
	for _, b := range []string{"web", "api", "db"} {
		for _, s := range []string{"a", "b", "c", Wildcard} {
			keys = append(keys, StatePrefix+b+"/"+s)
		}
	}
	keys = append(keys, "state/web", "state/a/b/c", "config/ramp")
	at := t0
	// Values to set, "%s" standing for an until around the step's time.
	forms := []string{"junk", "ready", "drain", "drain", `{"state":"drain","until":"%s"}`,
		`{"state":"drain","until":"%s"}`, `{"state":"ready","until":"%s"}`, `{"state":"maint","ramp":"3s","until":"%s"}`}
	value := func() string {
		f := forms[rng.IntN(len(forms))]
		if !strings.Contains(f, "%s") {
			return f
		}
		return fmt.Sprintf(f, at.Add(time.Duration(rng.IntN(8)-2)*time.Second).Format(time.RFC3339))
	}
	policy := RampPolicy{Start: 10, Duration: 5 * time.Second, Interval: time.Second, Aggression: 1, FromMaint: true}
	m := NewMirror()
	var dues, ramps int // how often each index had something to find
	for step := range 3000 {
		at = at.Add(time.Duration(rng.IntN(1500)) * time.Millisecond)
		switch rng.IntN(8) {
		case 0, 1, 2, 3:
			c := Change{Set: map[string]string{}}
			for range 1 + rng.IntN(3) {
				k := keys[rng.IntN(len(keys))]
				if rng.IntN(4) == 0 {
					c.Delete = append(c.Delete, k)
				} else {
					c.Set[k] = value()
				}
			}
			m.ApplyAt(c, at, policy)
		case 4, 5:
			m.ApplySteps(NextSteps(m.Ramps(), at))
		case 6:
			// Some of the keys given are not due: Expire must leave them.
			m.Expire(append(m.Due(at), keys[rng.IntN(len(keys))]), at, policy)
		default:
			m = Restore(persisted(t, m))
		}
		for _, now := range []time.Time{at.Add(-time.Hour), at, at.Add(2 * time.Second), at.Add(24 * time.Hour)} {
			got, want := m.Due(now), dueByScan(m, now)
			if !slices.Equal(got, want) {
				t.Fatalf("step %d: Due(%s) = %v, a full scan finds %v", step, now.Sub(at), got, want)
			}
			if now == at && len(got) > 0 {
				dues++
			}
		}
		if got, want := m.Ramps(), rampsByScan(m); !slices.Equal(got, want) {
			t.Fatalf("step %d: Ramps() = %+v, a full scan finds %+v", step, got, want)
		} else if len(got) > 0 {
			ramps++
		}
	}
	if dues < 100 || ramps < 100 {
		t.Fatalf("keys were due after %d steps and ramps in progress after %d: the walk exercises too little", dues, ramps)
	}
}

// Issue 15.1: an invalid value written to an expired key changes nothing
// that is served: the key stays expired (absent), no drain comes back and
// no new ramp starts; a valid value afterwards brings the key back. From
// feature level 2 on: below it, replicas do as release 0.13.0 does (see
// TestInvalidValueOnAnExpiredKeyAtLevelBase).
func TestInvalidValueOnAnExpiredKeyChangesNothing(t *testing.T) {
	m := NewMirror()
	m.SetLevel(LevelMeta)
	p := rampPolicy()
	until := t0.Add(2 * time.Second).Format(time.RFC3339)
	m.ApplyAt(set("state/ex/a", `{"state":"drain","until":"`+until+`"}`), t0, p)
	at := t0.Add(2 * time.Second)
	m.Expire(m.Due(at), at, p)
	m.ApplySteps(RampSteps{Done: []string{"ex/a"}})
	if got := lookup(m, "ex/a"); got != "ready 100%\n" || len(m.Ramps()) != 0 {
		t.Fatalf("after expiry and ramp: %q, ramps %v; want ready 100%% and no ramp", got, m.Ramps())
	}
	ev := m.ApplyAt(set("state/ex/a", "drian"), at.Add(time.Minute), p)
	if got := lookup(m, "ex/a"); got != "ready 100%\n" || len(ev) != 0 || len(m.Ramps()) != 0 {
		t.Fatalf("an invalid value on an expired key: answer %q, events %v, ramps %v; want ready 100%%, nothing started",
			got, ev, m.Ramps())
	}
	r := m.Snapshot().Resolve("ex", "a")
	if r.Expired == nil || r.Source != SourceAbsent {
		t.Fatalf("resolution %+v: want the key still expired and the answer from no key", r)
	}
	if restored := Restore(m.Export()); lookup(restored, "ex/a") != "ready 100%\n" {
		t.Fatalf("after a snapshot: %q", lookup(restored, "ex/a"))
	}
	m.ApplyAt(set("state/ex/a", "maint"), at.Add(2*time.Minute), p)
	if got := lookup(m, "ex/a"); got != "maint\n" {
		t.Fatalf("a valid value after the invalid one: %q, want maint", got)
	}
}

// Below feature level 2 (a cluster with a 0.13.0 replica), an invalid
// value brings an expired key back with its last valid value, as 0.13.0
// does: every replica of a mixed cluster answers the same.
func TestInvalidValueOnAnExpiredKeyAtLevelBase(t *testing.T) {
	m := NewMirror()
	p := rampPolicy()
	until := t0.Add(2 * time.Second).Format(time.RFC3339)
	m.ApplyAt(set("state/ex/a", `{"state":"drain","until":"`+until+`"}`), t0, p)
	at := t0.Add(2 * time.Second)
	m.Expire(m.Due(at), at, p)
	m.ApplyAt(set("state/ex/a", "drian"), at.Add(time.Minute), p)
	if got := lookup(m, "ex/a"); got != "drain\n" {
		t.Fatalf("level 1: an invalid value on an expired key: %q, want 0.13.0's drain (the last valid value)", got)
	}
}
