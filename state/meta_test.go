package state

import (
	"testing"
	"time"
)

func TestMetaKeyOf(t *testing.T) {
	for in, want := range map[string]string{
		"state/web/a":                         "meta/web/a",
		"state/web/*":                         "meta/web/*",
		"gitlab-haproxy-agent/state/web/a":    "gitlab-haproxy-agent/meta/web/a",
		"x/state/y/state/web/a":               "x/state/y/meta/web/a",
		"state/web":                           "",
		"state/web/a/b":                       "",
		"config/ramp":                         "",
		"gitlab-haproxy-agent/config/web/a":   "",
		"state//a":                            "",
		"gitlab-haproxy-agent/state/web/a/":   "",
		"gitlab-haproxy-agent/stateful/web/a": "",
	} {
		got, ok := MetaKeyOf(in)
		if got != want || ok != (want != "") {
			t.Errorf("MetaKeyOf(%q) = %q, %v; want %q", in, got, ok, want)
		}
		if ok {
			if back, _ := StateKeyOf(got); back != in {
				t.Errorf("StateKeyOf(%q) = %q, want %q", got, back, in)
			}
		}
	}
}

// meta is a meta key's value for st, with until and ramp when set.
func meta(st, until, ramp string) string {
	v := `{"state":"` + st + `","by":"alice","reason":"zonal","at":"2026-11-30T11:00:00Z"`
	if until != "" {
		v += `,"until":"` + until + `"`
	}
	if ramp != "" {
		v += `,"ramp":"` + ramp + `"`
	}
	return v + `,"added_by_a_later_release":{"x":1}}`
}

// Status, expiry and per-key ramps work from the meta key (at LevelMeta);
// at LevelBase only status does, as release 0.13.0 would.
func TestMetaKeyGivesStatusExpiryAndRamp(t *testing.T) {
	p := rampPolicy() // 10s ramps
	until := t0.Add(time.Minute).Format(time.RFC3339)
	for _, level := range []int{LevelBase, LevelMeta} {
		m := NewMirror()
		m.SetLevel(level)
		m.ApplyAt(set("state/web/a", "drain", "meta/web/a", meta("drain", until, "0"),
			"state/web/b", "drain", "meta/web/b", meta("drain", until, "1m")), t0, p)
		e := m.entry("state/web/a")
		v := e.Last()
		if v.By != "alice" || v.Reason != "zonal" || v.At.IsZero() || v.String() != "drain" {
			t.Fatalf("level %d: value %+v: want by, reason, at from the meta key", level, v)
		}
		due := m.Due(t0.Add(2 * time.Minute))
		if level == LevelBase {
			if len(due) != 0 || !v.Until.IsZero() || e.Note != NoteMetaWaits {
				t.Fatalf("level %d: due %v until %v note %q: the meta key's until must wait", level, due, v.Until, e.Note)
			}
			continue
		}
		if len(due) != 2 || !v.Until.Equal(t0.Add(time.Minute)) || e.Note != "" {
			t.Fatalf("level %d: due %v until %v note %q", level, due, v.Until, e.Note)
		}
		if len(m.Due(t0.Add(30*time.Second))) != 0 {
			t.Fatal("due before until")
		}
		ev := m.Expire(due, t0.Add(2*time.Minute), p)
		// web/a's meta says ramp 0: straight to 100%; web/b's 1m ramp.
		if got := lookup(m, "web/a"); got != "ready 100%\n" {
			t.Errorf("web/a after expiry with ramp 0: %q", got)
		}
		if got := lookup(m, "web/b"); got != "ready 10%\n" || len(ev) != 1 || ev[0].Ramp.Policy.Duration != time.Minute {
			t.Errorf("web/b after expiry: %q, events %+v; want a 1m ramp from 10%%", got, ev)
		}
		if r := m.Snapshot().Resolve("web", "a"); r.Expired == nil {
			t.Error("status does not show web/a expired")
		}
	}
}

// A per-key ramp on undrain (clear deletes both keys) comes from the meta
// key of the drain.
func TestMetaRampOnClear(t *testing.T) {
	m := NewMirror()
	m.SetLevel(LevelMeta)
	m.ApplyAt(set("state/web/a", "drain", "meta/web/a", meta("drain", "", "1m")), t0, rampPolicy())
	ev := m.ApplyAt(del("state/web/a", "meta/web/a"), t0.Add(time.Second), rampPolicy())
	if len(ev) != 1 || ev[0].Ramp.Policy.Duration != time.Minute {
		t.Fatalf("events %+v: want a ramp of the meta key's 1m", ev)
	}
}

// A meta key whose state is not the state key's word (the key was changed
// by `consul kv put` or the runbook's scripts) is ignored: no expiry, no
// ramp override, and status says so; nor does a meta key that is not JSON
// change anything.
func TestMismatchingOrInvalidMetaIsIgnored(t *testing.T) {
	until := t0.Add(time.Minute).Format(time.RFC3339)
	for name, c := range map[string]struct {
		meta, note string
	}{
		"stale state": {meta("maint", until, "0"), NoteOutside},
		"not JSON":    {`{"state":"drain","until":`, "meta key ignored: not a JSON object"},
		"no state":    {`{"until":"` + until + `"}`, `meta key ignored: JSON needs a "state" field`},
		"bad until":   {`{"state":"drain","until":"tomorrow"}`, "meta key ignored: until"},
	} {
		m := NewMirror()
		m.SetLevel(LevelMeta)
		m.ApplyAt(set("state/web/a", "drain", "meta/web/a", c.meta), t0, rampPolicy())
		e := m.entry("state/web/a")
		if len(m.Due(t0.Add(time.Hour))) != 0 || e.Last().RampSet || !e.Valid() || e.Last().String() != "drain" {
			t.Errorf("%s: due %v, value %+v, valid %v: the meta key must be ignored", name, m.Due(t0.Add(time.Hour)), e.Last(), e.Valid())
		}
		if len(e.Note) < len(c.note) || e.Note[:len(c.note)] != c.note {
			t.Errorf("%s: note %q, want %q", name, e.Note, c.note)
		}
		if got := lookup(m, "web/a"); got != "drain\n" {
			t.Errorf("%s: answer %q", name, got)
		}
		ev := m.ApplyAt(del("state/web/a"), t0, rampPolicy())
		if len(ev) != 1 || ev[0].Ramp.Policy.Duration != rampPolicy().Duration {
			t.Errorf("%s: undrain events %+v, want the policy's ramp", name, ev)
		}
	}
	// The state key changed outside hastate, then back: the meta key
	// counts again only while the words match.
	m := NewMirror()
	m.SetLevel(LevelMeta)
	m.ApplyAt(set("state/web/a", "drain", "meta/web/a", meta("drain", until, "")), t0, rampPolicy())
	m.ApplyAt(set("state/web/a", "maint"), t0, rampPolicy())
	if len(m.Due(t0.Add(time.Hour))) != 0 || m.entry("state/web/a").Note != NoteOutside {
		t.Errorf("maint put over a drain with meta: due %v note %q", m.Due(t0.Add(time.Hour)), m.entry("state/web/a").Note)
	}
}

// A JSON state key is read as before, meta key or not, and flagged.
func TestJSONStateKeyStillRead(t *testing.T) {
	m := NewMirror()
	m.SetLevel(LevelMeta)
	until := t0.Add(time.Minute).Format(time.RFC3339)
	m.ApplyAt(set("state/web/a", `{"state":"drain","by":"bob","until":"`+until+`"}`, "meta/web/a", meta("drain", "", "")), t0, rampPolicy())
	e := m.entry("state/web/a")
	if e.Last().By != "bob" || len(m.Due(t0.Add(time.Hour))) != 1 || e.Note != NoteJSONState {
		t.Errorf("JSON state key: %+v note %q", e.Last(), e.Note)
	}
}

// Draining an expired drain again writes the same word and a new meta
// key: the leader's diff sets the state key again beside it, which brings
// the key back on this release and on 0.13.0 (which reads no meta key).
func TestRedrainOfExpiredKeyComesBack(t *testing.T) {
	m := NewMirror()
	m.SetLevel(LevelMeta)
	until := t0.Add(time.Minute).Format(time.RFC3339)
	kv := map[string]string{"state/web/a": "drain", "meta/web/a": meta("drain", until, "0")}
	m.ApplyAt(m.Diff(kv), t0, rampPolicy())
	m.Expire(m.Due(t0.Add(time.Hour)), t0.Add(time.Hour), rampPolicy())
	if got := lookup(m, "web/a"); got != "ready 100%\n" {
		t.Fatalf("after expiry: %q", got)
	}
	kv["meta/web/a"] = meta("drain", t0.Add(3*time.Hour).Format(time.RFC3339), "0")
	c := m.Diff(kv)
	if c.Set["state/web/a"] != "drain" {
		t.Fatalf("diff %+v does not set the state key beside its changed meta key", c)
	}
	c2 := m.DiffKeys(kv, []string{"meta/web/a"})
	if c2.Set["state/web/a"] != "drain" {
		t.Fatalf("DiffKeys %+v does not set the state key beside its changed meta key", c2)
	}
	m.ApplyAt(c, t0.Add(time.Hour), rampPolicy())
	if got := lookup(m, "web/a"); got != "drain\n" {
		t.Fatalf("drained again: %q", got)
	}
	// A meta key applied alone (as a 0.13.0 leader writes it) leaves the
	// key as it stands, as 0.13.0 does.
	m.Expire(m.Due(t0.Add(4*time.Hour)), t0.Add(4*time.Hour), rampPolicy())
	m.ApplyAt(set("meta/web/a", meta("drain", t0.Add(9*time.Hour).Format(time.RFC3339), "0")), t0.Add(4*time.Hour), rampPolicy())
	if got := lookup(m, "web/a"); got != "ready 100%\n" {
		t.Fatalf("a meta key alone brought an expired key back: %q", got)
	}
}

// The level survives a snapshot; a base-level mirror writes no level, so
// release 0.13.0 reads its snapshot as its own.
func TestLevelPersists(t *testing.T) {
	m := NewMirror()
	if m.Export().Level != 0 {
		t.Fatal("a base-level mirror exports a level")
	}
	until := t0.Add(time.Minute).Format(time.RFC3339)
	m.Apply(set("state/web/a", "drain", "meta/web/a", meta("drain", until, "")))
	m.SetLevel(LevelMeta)
	r := Restore(m.Export())
	if r.Level() != LevelMeta || len(r.Due(t0.Add(time.Hour))) != 1 {
		t.Fatalf("restored level %d due %v", r.Level(), r.Due(t0.Add(time.Hour)))
	}
}

// A meta key written for one weight does not describe another: `weight 30%
// --for 1h`, then `consul kv put …/a 40%`, is set outside hastate, so the
// 40% never expires on the 30%'s until (issue 27.1).
func TestMetaForOtherWeightIsOutside(t *testing.T) {
	until := t0.Add(time.Hour).Format(time.RFC3339)
	m := NewMirror()
	m.SetLevel(LevelMeta)
	m.ApplyAt(set("state/web/a", "30%", "meta/web/a", meta("30%", until, "")), t0, rampPolicy())
	if e := m.entry("state/web/a"); e.Note != "" || e.Last().Until.IsZero() {
		t.Fatalf("30%% with its meta key: note %q, until %v: the meta key must count", e.Note, e.Last().Until)
	}
	m.ApplyAt(set("state/web/a", "40%"), t0.Add(time.Minute), rampPolicy())
	e := m.entry("state/web/a")
	if e.Note != NoteOutside || !e.Last().Until.IsZero() || e.Last().By != "" {
		t.Errorf("40%% put over 30%% with meta: note %q, until %v, by %q; want %q and no until", e.Note, e.Last().Until, e.Last().By, NoteOutside)
	}
	if due := m.Due(t0.Add(2 * time.Hour)); len(due) != 0 {
		t.Errorf("40%% put outside hastate is due to expire: %v", due)
	}
	if !e.Since.Equal(t0.Add(time.Minute)) {
		t.Errorf("since %v: a change of weight is a change of state (want %v)", e.Since, t0.Add(time.Minute))
	}
	if got := lookup(m, "web/a"); got != "ready 40%\n" {
		t.Errorf("answer %q, want ready 40%%", got)
	}
}
