package confirm

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestDecideWithhold is the withhold decision as a table: each case is the
// inputs the loops gather, and the reasons that follow from them.
func TestDecideWithhold(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const grace = 3 * time.Second
	cu, ll, uc, nu := uint32(withholdCatchingUp), uint32(withholdLeaderless), uint32(withholdUnconfirmed), uint32(withholdNotUnderstood)
	base := withholdInputs{Now: t0, LastContact: t0, Grace: grace, ConfirmedIndex: 5, StateIndex: 5}
	with := func(f func(*withholdInputs)) withholdInputs {
		in := base
		f(&in)
		return in
	}
	for _, tc := range []struct {
		name string
		in   withholdInputs
		want uint32
	}{
		{"healthy: answers", base, 0},
		{"just started, not caught up yet", with(func(in *withholdInputs) { in.Was = cu }), cu},
		{"caught up clears catching_up", with(func(in *withholdInputs) { in.Was = cu; in.CaughtUp = true }), 0},
		{"caught up does not set anything when nothing was in force", with(func(in *withholdInputs) { in.CaughtUp = false }), 0},
		{"contact at the grace exactly: still within", with(func(in *withholdInputs) { in.LastContact = t0.Add(-grace) }), 0},
		{"contact older than the grace: leaderless and catching up", with(func(in *withholdInputs) { in.LastContact = t0.Add(-grace - time.Millisecond) }), ll | cu},
		{"leaderless even if the catching-up rule holds", with(func(in *withholdInputs) {
			in.LastContact = t0.Add(-time.Minute)
			in.CaughtUp = true
		}), ll | cu},
		{"back in contact: leaderless clears, catching_up stays until caught up", with(func(in *withholdInputs) { in.Was = ll | cu }), cu},
		{"back in contact and caught up", with(func(in *withholdInputs) { in.Was = ll | cu; in.CaughtUp = true }), 0},
		{"rounds failing within the grace: ready (each check waits --confirm-timeout)", with(func(in *withholdInputs) { in.FailingSince = t0.Add(-grace) }), 0},
		{"rounds failing for longer than the grace with contact", with(func(in *withholdInputs) { in.FailingSince = t0.Add(-grace - time.Millisecond) }), uc},
		{"unconfirmed is not said when leaderless says more", with(func(in *withholdInputs) {
			in.FailingSince = t0.Add(-time.Minute)
			in.LastContact = t0.Add(-time.Minute)
		}), ll | cu},
		{"state went back below the confirmed index", with(func(in *withholdInputs) { in.StateIndex = 4 }), uc},
		{"confirmed again clears unconfirmed", with(func(in *withholdInputs) { in.Was = uc }), 0},
		{"not understood, whatever else holds", with(func(in *withholdInputs) { in.NotUnderstood = true }), nu},
		{"not understood and cut off", with(func(in *withholdInputs) {
			in.NotUnderstood = true
			in.LastContact = t0.Add(-time.Minute)
		}), nu | ll | cu},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := decideWithhold(tc.in); got != tc.want {
				t.Errorf("decideWithhold = %s, want %s", reasonsOf(got), reasonsOf(tc.want))
			}
		})
	}
}

// TestCaughtUp is the catching-up rule as a table.
func TestCaughtUp(t *testing.T) {
	for _, tc := range []struct {
		leading, barrier   bool
		state, leaderState uint64
		want               bool
	}{
		{true, true, 0, 0, true},
		{true, false, 9, 9, false},
		{false, false, 9, 0, false}, // the leader's index not known yet
		{false, false, 8, 9, false},
		{false, false, 9, 9, true},
		{false, false, 10, 9, true},
	} {
		if got := caughtUp(tc.leading, tc.barrier, tc.state, tc.leaderState); got != tc.want {
			t.Errorf("caughtUp(leading %v, barrier %v, state %d, leader's %d) = %v, want %v", tc.leading, tc.barrier, tc.state, tc.leaderState, got, tc.want)
		}
	}
}

func reasonsOf(bits uint32) string {
	var s withholdSet
	s.bits.Store(bits)
	return fmt.Sprint(s.labels())
}

func TestWithholdSet(t *testing.T) {
	var s withholdSet
	if s.any() || s.details() != "" {
		t.Fatal("zero set withholds")
	}
	if !s.set(withholdLeaderless, true) || s.set(withholdLeaderless, true) {
		t.Fatal("set reports changes wrongly")
	}
	s.set(withholdCatchingUp, true)
	if got := s.labels(); strings.Join(got, ",") != "catching_up,leaderless" {
		t.Fatalf("labels %v", got)
	}
	if d := s.details(); !strings.Contains(d, "caught up") || !strings.Contains(d, "--leaderless-grace") {
		t.Fatalf("details %q", d)
	}
	s.set(withholdCatchingUp, false)
	s.set(withholdLeaderless, false)
	if s.any() {
		t.Fatal("cleared set still withholds")
	}
	for _, r := range withholdReasons() {
		if l, _ := r.info(); l == "unknown" {
			t.Errorf("reason %d has no label: add it to withholdReason.info", r)
		}
	}
}
