package cluster

// This file gives memory back after a large change. A raft entry that sets
// or deletes tens of thousands of keys (a new leader's first read of a
// large prefix, a restored snapshot) allocates several times the mirror
// while it is decoded and applied; the Go runtime keeps the heap it grew to
// and returns it to the OS only slowly, so a replica would sit at its peak
// (about 110 MB at 50,000 keys for a mirror of 30 MB) long after. Once
// such a change is applied, the node returns the idle heap at once.

import (
	"runtime"
	"runtime/debug"
	"time"

	"go.uber.org/zap"
)

const (
	// releaseGap is the least time between two returns: a run of large
	// entries is followed by one.
	releaseGap = 5 * time.Second
	// releaseSettle is how long after a large change memory is returned.
	releaseSettle = 250 * time.Millisecond
)

// noteLarge asks releaseLoop to return memory; it never blocks.
func (n *Node) noteLarge() {
	select {
	case n.release <- struct{}{}:
	default:
	}
}

// releaseLoop returns the idle heap to the OS after each large change, at
// most once per releaseGap. It runs until the node stops.
func (n *Node) releaseLoop() {
	defer n.wg.Done()
	for {
		select {
		case <-n.stop:
			return
		case <-n.release:
		}
		// What follows a large change (the leader's reply to the watch,
		// the replies to the gates' polls, a follower catching up) still
		// holds garbage for a moment; return the heap once it is.
		select {
		case <-n.stop:
			return
		case <-time.After(releaseSettle):
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		debug.FreeOSMemory()
		runtime.ReadMemStats(&after)
		n.log.Debug("returned memory to the OS after a large change",
			zap.Uint64("heap_live_bytes", after.HeapAlloc),
			zap.Uint64("released_bytes", after.HeapReleased-min(before.HeapReleased, after.HeapReleased)))
		select {
		case <-n.stop:
			return
		case <-time.After(releaseGap):
		}
	}
}
