package raftport

import (
	"sync"

	"github.com/hashicorp/raft"
)

// heartbeatGuard keeps raft's heartbeat fast path off a closed store.
//
// Raft handles a heartbeat on the transport's connection goroutine, not
// in its main loop (NetworkTransport calls the handler raft installed with
// SetHeartbeatHandler), and checks only at the start whether it was shut
// down. A heartbeat of a newer term that began just before raft.Shutdown
// goes on to save the term after Shutdown returned; if the node closed its
// bolt store by then, raft panics ("failed to save current term: database
// not open"), taking the process with it (seen in go test -race ./cluster
// on a loaded machine). The node stops heartbeats (StopHeartbeats) after
// raft's Shutdown and before it closes the store: that waits for a
// heartbeat in flight, and later ones are not handed to raft (their
// connection waits for its answer until the transport closes, as for any
// RPC raft no longer reads).
type heartbeatGuard struct {
	mu      sync.RWMutex
	stopped bool
}

// SetHeartbeatHandler installs raft's heartbeat handler behind the guard.
func (t *PatientTransport) SetHeartbeatHandler(cb func(raft.RPC)) {
	if cb == nil {
		t.NetworkTransport.SetHeartbeatHandler(nil)
		return
	}
	t.NetworkTransport.SetHeartbeatHandler(func(rpc raft.RPC) {
		t.hb.mu.RLock()
		defer t.hb.mu.RUnlock()
		if t.hb.stopped {
			return
		}
		cb(rpc)
	})
}

// StopHeartbeats waits for a heartbeat being handled and hands raft no
// more: call it after raft's Shutdown, before the raft store is closed.
func (t *PatientTransport) StopHeartbeats() {
	t.hb.mu.Lock()
	defer t.hb.mu.Unlock()
	t.hb.stopped = true
}
