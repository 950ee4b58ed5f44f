package server

import (
	"runtime"
	"time"
)

// A replica's operator reads (the status page, /v1/state and the peers'
// summaries of a big table, /v1/pollers) share its CPU with the agent,
// whose checks are what HAProxy waits for. A read that walks the poller
// table or writes thousands of rows yields now and then, so that a check
// that became runnable meanwhile need not wait for the read's time slice
// to end. (Sleeping half of the time instead, to hold a read to half a
// core, doubled the reads and did not lower the agent's p99 measurably:
// server/DESIGN.md.)
//
// A read yields once it has worked yieldAfter since its last yield, not
// every so many servers: a yield is not free (runtime.Gosched wakes an
// idle P, and the read may resume on another thread), and as the reads
// grew faster a yield every 256 servers came every 50-100 µs and cost a
// third of a read through a peer's counts. yieldAfter is about the
// interval the yields had when their effect on the agent was measured
// (256 rows of 2.4 µs).

// yieldAfter is how long a read works between yields; yieldCheck is how
// many units of work (servers walked, rows written) pass between looks
// at the clock.
const (
	yieldAfter = 500 * time.Microsecond
	yieldCheck = 64
)

// yielder yields once yieldAfter passed since its last yield (or its
// first look at the clock), looking every yieldCheck steps; its zero
// value is ready. Step it once a unit of work, never while holding a lock
// an agent check takes.
type yielder struct {
	n    int
	last time.Time
	// now and gosched, when not nil, stand for time.Now and
	// runtime.Gosched (tests).
	now     func() time.Time
	gosched func()
}

func (y *yielder) step() {
	y.n++
	if y.n%yieldCheck != 0 {
		return
	}
	now := time.Now
	if y.now != nil {
		now = y.now
	}
	t := now()
	switch {
	case y.last.IsZero():
		y.last = t
	case t.Sub(y.last) >= yieldAfter:
		y.last = t
		if y.gosched != nil {
			y.gosched()
			return
		}
		runtime.Gosched()
	}
}
