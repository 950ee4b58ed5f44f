package server

import "runtime"

// A replica's operator reads (the status page, /v1/state and the peers'
// summaries of a big table, /v1/pollers) share its CPU with the agent,
// whose checks are what HAProxy waits for. A read that walks the poller
// table or writes thousands of rows yields now and then, so that a check
// that became runnable meanwhile need not wait for the read's time slice
// to end. (Sleeping half of the time instead, to hold a read to half a
// core, doubled the reads and did not lower the agent's p99 measurably:
// server/DESIGN.md.)

// yieldEvery is how many units of work (servers walked, rows written)
// pass between yields.
const yieldEvery = 256

// yielder yields every yieldEvery steps; its zero value is ready. Step it
// once a unit of work, never while holding a lock an agent check takes.
type yielder struct{ n int }

func (y *yielder) step() {
	y.n++
	if y.n%yieldEvery == 0 {
		runtime.Gosched()
	}
}
