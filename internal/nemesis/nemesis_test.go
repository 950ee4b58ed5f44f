package nemesis

import (
	"slices"
	"testing"
	"time"
)

func TestPlanRepeatsForASeed(t *testing.T) {
	o := Options{Duration: 4 * time.Minute}
	a, b := Plan(42, o), Plan(42, o)
	if !slices.Equal(a, b) {
		t.Fatalf("seed 42 gave two schedules:\n%v\n%v", a, b)
	}
	if slices.Equal(a, Plan(43, o)) {
		t.Fatal("seeds 42 and 43 gave the same schedule")
	}
	var total time.Duration
	seen := map[Kind]bool{}
	for _, f := range a {
		total += f.Gap + f.Hold
		seen[f.Kind] = true
		if f.Hold < time.Second || (f.Hold > 6*time.Second && f.Kind != Token) || f.Gap < time.Second || f.Gap > 3*time.Second {
			t.Errorf("%v: outside the default bounds", f)
		}
		switch f.Kind {
		case PauseLong:
			if f.Target != Leader || f.Hold < LongPause {
				t.Errorf("%v: a long pause is of the leader, for %s at least", f, LongPause)
			}
		case Transfer:
			if f.Target != Leader {
				t.Errorf("%v: a transfer is the leader's", f)
			}
		case Token:
			if f.Target != Leader || f.Hold != TokenHold {
				t.Errorf("%v: a token fault is the leader's, held %s (every default hold is shorter)", f, TokenHold)
			}
		case Wipe:
			if f.Target != Follower {
				t.Errorf("%v: a wipe is a follower's", f)
			}
		}
		if (f.Kind == Consul) != (f.Target == None) {
			t.Errorf("%v: a replica fault needs a target, a Consul fault has none", f)
		}
	}
	if total < o.Duration || total > o.Duration+3*time.Second+TokenHold {
		t.Errorf("schedule fills %s, want %s (plus one fault at most)", total, o.Duration)
	}
	if len(seen) != len(Kinds) {
		t.Errorf("four minutes of faults drew only %v", seen)
	}
}

func TestSeed(t *testing.T) {
	if s, env, err := Seed("12345"); err != nil || !env || s != 12345 {
		t.Fatalf("Seed(12345) = %d, %v, %v", s, env, err)
	}
	if _, env, err := Seed(""); err != nil || env {
		t.Fatalf("Seed(\"\") = %v, %v", env, err)
	}
	if _, _, err := Seed("x"); err == nil {
		t.Fatal("Seed(x): no error")
	}
}
