// Package ratelog limits log lines: at most one event of a kind per
// interval gets through, and the next line says how many were held back.
// The agent-check server and the raft port use it against floods.
package ratelog

import (
	"sync/atomic"
	"time"
)

// Limiter lets at most one event of a kind through per interval and
// counts the events it suppressed in between, so that a flood of bad probes
// produces one log line per second that says how many were hidden, not one
// line per probe.
//
// It is lock-free: a hot-path caller never waits on another. The zero value
// is not usable; build it with New.
type Limiter struct {
	interval int64            // nanoseconds
	now      func() time.Time // injected clock
	next     atomic.Int64     // unix nanoseconds from which the next event may pass
	hidden   atomic.Int64     // events suppressed since the last one let through
}

// New returns a limiter that lets one event through per interval,
// reading time from now (time.Now when nil).
func New(interval time.Duration, now func() time.Time) *Limiter {
	if now == nil {
		now = time.Now
	}
	return &Limiter{interval: int64(interval), now: now}
}

// Allow reports whether this event may be logged. When it may, suppressed is
// the number of events held back since the previous one that was allowed;
// the caller puts it in the log line.
func (l *Limiter) Allow() (ok bool, suppressed int64) {
	now := l.now().UnixNano()
	next := l.next.Load()
	if now < next || !l.next.CompareAndSwap(next, now+l.interval) {
		l.hidden.Add(1)
		return false, 0
	}
	return true, l.hidden.Swap(0)
}

// Flush returns and resets the count of suppressed events, for a last log
// line when the server stops.
func (l *Limiter) Flush() int64 { return l.hidden.Swap(0) }
