// Package accept is the accept loop of hastate's two TCP servers, the
// agent-check port (server.AgentServer) and the raft port (the cluster's
// stream layer), so that both treat Accept errors the same way, as Go's
// net/http Server does: a temporary error (out of file descriptors, say)
// is retried after a pause growing from 5 ms to 1 s, and any other error
// ends the loop and is returned to its owner, who stops the replica so
// that it is restarted (a port that accepts nothing must not look alive).
package accept

import (
	"errors"
	"net"
	"time"
)

// Backoff is the pause after a temporary Accept error, given the pause
// before it (0 for the first): 5 ms, doubling, at most 1 s.
func Backoff(prev time.Duration) time.Duration {
	const first, most = 5 * time.Millisecond, time.Second
	if prev == 0 {
		return first
	}
	return min(2*prev, most)
}

// Temporary reports whether an Accept error is worth retrying: the error
// says so (syscall.EMFILE, ENFILE and timeouts do).
func Temporary(err error) bool {
	var te interface{ Temporary() bool }
	return errors.As(err, &te) && te.Temporary()
}

// Loop accepts connections on ln and hands each to serve, which must not
// block (it starts the connection's goroutine). It returns nil once done
// is closed, which the owner does before closing ln to stop the loop, and
// the Accept error that ended it otherwise. Before each retry of a
// temporary error it calls retrying with the error and the pause (the
// owner logs it, rate-limited).
func Loop(ln net.Listener, done <-chan struct{}, serve func(net.Conn), retrying func(err error, pause time.Duration)) error {
	var pause time.Duration
	for {
		c, err := ln.Accept()
		if err == nil {
			pause = 0
			serve(c)
			continue
		}
		select {
		case <-done:
			return nil
		default:
		}
		if !Temporary(err) {
			return err
		}
		pause = Backoff(pause)
		retrying(err, pause)
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-done:
			t.Stop()
			return nil
		}
	}
}
