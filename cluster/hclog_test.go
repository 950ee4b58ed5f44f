package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/hastate/hastate/internal/testenv"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

type settableClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *settableClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *settableClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// Raft logs an error at every failed RPC to a peer that is down; the
// adapter lets one line per message and peer through per repeatEvery and
// says how many it held back.
func TestRaftLogRepeatsAreLimitedPerMessageAndPeer(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	clock := &settableClock{t: time.Unix(1000, 0)}
	root := &zapHCLog{z: zap.New(core), name: "raft", repeats: newRepeatLimit(repeatEvery, clock.now)}
	hl := root.Named("replication") // derived loggers share the limit
	a := raft.Server{ID: "n1", Address: "127.0.0.1:1"}
	b := raft.Server{ID: "n2", Address: "127.0.0.1:2"}
	refused := errors.New("dial tcp 127.0.0.1:1: connect: connection refused")

	for range 50 {
		hl.Error("failed to heartbeat to", "peer", a, "backoff time", time.Second, "error", refused)
		hl.Error("failed to appendEntries to", "peer", a, "error", refused)
		root.Error("failed to heartbeat to", "peer", b, "error", refused)
		root.Info("entering follower state", "follower", "n0") // not a warning: never held back
		clock.advance(100 * time.Millisecond)
	}
	// 5 s have passed: one line per message and peer, all 50 info lines.
	count := func(msg string) int { return logs.FilterMessage(msg).Len() }
	if got := [3]int{count("failed to heartbeat to"), count("failed to appendEntries to"), count("entering follower state")}; got != [3]int{2, 1, 50} {
		t.Fatalf("after 5 s of 50 repeats: heartbeat %d (two peers), appendEntries %d, info %d lines; want 2, 1, 50", got[0], got[1], got[2])
	}
	clock.advance(repeatEvery)
	hl.Error("failed to heartbeat to", "peer", a, "error", refused)
	last := logs.All()[logs.Len()-1]
	if last.Message != "failed to heartbeat to" || last.Level != zapcore.ErrorLevel || last.ContextMap()["suppressed"] != int64(49) {
		t.Fatalf("the next heartbeat line after %s: %s %q %v; want error with suppressed=49", repeatEvery, last.Level, last.Message, last.ContextMap())
	}
	t.Logf("50 failed heartbeats and 50 appends to one peer in 5 s: %d lines; the next one says suppressed=%v",
		count("failed to appendEntries to")+count("failed to heartbeat to")-2, last.ContextMap()["suppressed"])
}

// A read on a connection this process closed (the stream layer closes
// raft's inbound connections at shutdown) is not an error.
func TestRaftLogClosedConnectionIsDebug(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	hl := newHCLog(zap.New(core), "raft")
	closed := &net.OpError{Op: "read", Net: "tcp", Err: fmt.Errorf("wrapped: %w", net.ErrClosed)}
	hl.Error("failed to decode incoming command", "error", closed)
	hl.Error("failed to decode incoming command", "error", errors.New("unknown rpc type 9"))
	got := logs.All()
	if len(got) != 2 || got[0].Level != zapcore.DebugLevel || got[1].Level != zapcore.ErrorLevel {
		t.Fatalf("levels %v; want the closed connection at debug, the other error at error", got)
	}
}

// With one peer down, the leader's log stays short; a clean shutdown of
// every node logs no error about the connections it closed.
func TestPeerDownAndShutdownLogs(t *testing.T) {
	logs := make([]*observer.ObservedLogs, 3)
	nodes := startCluster(t, func(i int, o *Options) {
		core, l := observer.New(zapcore.WarnLevel)
		logs[i], o.Logger = l, zap.New(core)
	})
	testenv.Eventually(t, 10*time.Second, func() error { return testenv.Expect(leaderOf(nodes) != nil, "no leader") })
	l := leaderOf(nodes)
	var li int
	var followers []*testNode
	for i, n := range nodes {
		if n == l {
			li = i
		} else {
			followers = append(followers, n)
		}
	}
	down := followers[0]
	if err := down.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	downAddr := down.opts.Advertise
	about := func(e observer.LoggedEntry) bool { return strings.Contains(fmt.Sprint(e.ContextMap()), downAddr) }
	// Raft's heartbeat backs off to about one a second with the peer
	// still down; before the limit, that was one error line per failure.
	const watch = 4 * time.Second
	start := time.Now()
	testenv.Eventually(t, 5*time.Second, func() error {
		return testenv.Expect(logs[li].Filter(about).FilterMessage("failed to heartbeat to").Len() > 0, "the leader logged no failed heartbeat to %s", down.opts.ID)
	})
	time.Sleep(watch - time.Since(start)) // the time the lines are counted over
	kinds := map[string]int{}
	for _, e := range logs[li].Filter(about).All() {
		kinds[e.Level.String()+" "+e.Message]++
	}
	t.Logf("leader %s with %s down for %s: %v", l.opts.ID, down.opts.ID, watch, kinds)
	for k, n := range kinds {
		if n > 1 {
			t.Errorf("%q: %d lines in %s, want at most one per %s", k, n, watch, repeatEvery)
		}
	}

	// Followers first: the leader's heartbeats keep their inbound raft
	// connections open, which their stream layer closes under raft.
	for _, n := range []*testNode{followers[1], l} {
		if err := n.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	for i, n := range nodes {
		for _, e := range logs[i].FilterLevelExact(zapcore.ErrorLevel).All() {
			if strings.Contains(fmt.Sprint(e.ContextMap()), "use of closed network connection") {
				t.Errorf("%s at shutdown: error %q %v", n.opts.ID, e.Message, e.ContextMap())
			}
		}
	}
}
