package server

import (
	"testing"
	"time"
)

// A yielder yields once yieldAfter has passed since its last yield (the
// first look at the clock starts it), looking at the clock every
// yieldCheck steps only: no yield while the work is quick, one after
// each yieldAfter of it, however many steps that took.
func TestYielderYieldsByTheClock(t *testing.T) {
	at := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	looks, yields := 0, 0
	y := yielder{now: func() time.Time { looks++; return at }, gosched: func() { yields++ }}
	steps := func(n int) {
		for range n {
			y.step()
		}
	}
	steps(10 * yieldCheck) // the clock stands still: no yield
	if yields != 0 || looks != 10 {
		t.Fatalf("%d yields, %d looks at the clock in %d steps of no time, want 0 and 10", yields, looks, 10*yieldCheck)
	}
	at = at.Add(yieldAfter - time.Nanosecond)
	steps(yieldCheck)
	if yields != 0 {
		t.Fatalf("a yield %v after the first look, before yieldAfter (%v)", yieldAfter-time.Nanosecond, yieldAfter)
	}
	at = at.Add(time.Nanosecond)
	steps(yieldCheck - 1) // not a look yet
	if yields != 0 {
		t.Fatal("a yield between looks at the clock")
	}
	steps(1)
	if yields != 1 {
		t.Fatalf("%d yields at yieldAfter after the first look, want 1", yields)
	}
	// The next counts from that yield.
	at = at.Add(yieldAfter / 2)
	steps(yieldCheck)
	if yields != 1 {
		t.Fatalf("%d yields half yieldAfter after a yield, want 1", yields)
	}
	at = at.Add(yieldAfter / 2)
	steps(yieldCheck)
	if yields != 2 {
		t.Fatalf("%d yields yieldAfter after a yield, want 2", yields)
	}
	// A long step (the clock jumped) is one yield, not one per yieldAfter.
	at = at.Add(10 * yieldAfter)
	steps(yieldCheck)
	if yields != 3 {
		t.Fatalf("%d yields after 10 yieldAfter in one look, want 3", yields)
	}
}

// The zero yielder works (the reads declare one and step it): it looks
// at the real clock, and yields (runtime.Gosched) no sooner than
// yieldAfter after its first look.
func TestYielderZeroValue(t *testing.T) {
	var y yielder
	for y.last.IsZero() {
		y.step()
	}
	first, deadline := y.last, time.Now().Add(10*time.Second)
	for y.last.Equal(first) {
		if time.Now().After(deadline) {
			t.Fatalf("no yield 10 s after the first look at the clock (yieldAfter %v)", yieldAfter)
		}
		y.step()
	}
	if d := y.last.Sub(first); d < yieldAfter {
		t.Fatalf("a yield %v after the first look, before yieldAfter (%v)", d, yieldAfter)
	}
}
