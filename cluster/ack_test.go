package cluster

import (
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/hastate/hastate/internal/testenv"
)

// TestLeaderRoundWaitsForABusyPeer: a leader's round in which one peer's
// connection still carries an earlier round's request (a slow peer, or a
// goroutine the scheduler ran late) and the other peer cannot be reached
// waits for the busy connection and confirms with it. Skipping the busy
// peer failed such rounds: in BenchmarkLeaderRoundCost both peers were
// found busy 7–14 times per run, and those rounds' checks went unanswered.
func TestLeaderRoundWaitsForABusyPeer(t *testing.T) {
	nodes, proxies, l, _ := startMesh(t, 5*time.Second, nil)
	li := indexOf(nodes, l)
	var busy, cut *testNode
	for _, n := range nodes {
		switch {
		case n == l:
		case busy == nil:
			busy = n
		default:
			cut = n
		}
	}
	proxies[li][indexOf(nodes, cut)].setCut(true)
	t.Cleanup(func() { proxies[li][indexOf(nodes, cut)].setCut(false) })
	// Until the cut takes (a connection the proxy had not tracked yet),
	// the cut peer may still acknowledge.
	open := make(chan struct{})
	cutPeer := raft.Server{ID: raft.ServerID(cut.opts.ID), Address: raft.ServerAddress(cut.opts.Advertise), Suffrage: raft.Voter}
	testenv.Eventually(t, 5*time.Second, func() error {
		r := l.askAck(cutPeer, ackRequest{ID: l.opts.ID, Term: l.raft.CurrentTerm(), Seq: l.ackSeq.Add(1)}, time.Now().Add(200*time.Millisecond), open)
		return testenv.Expect(!r.ok, "%s still acknowledges through the cut", cut.opts.ID)
	})

	c := l.acks.conn(raft.ServerID(busy.opts.ID))
	c.sem <- struct{}{} // an earlier round's request in flight
	c.seq.Store(1)
	released := make(chan struct{})
	time.AfterFunc(100*time.Millisecond, func() {
		c.seq.Store(0)
		<-c.sem
		close(released)
	})
	term := l.raft.CurrentTerm()
	err := l.confirmLeadership(term, time.Now().Add(2*time.Second))
	select {
	case <-released:
	default:
		t.Fatalf("the round ended (%v) before the busy connection was free: it did not wait for it", err)
	}
	if err != nil {
		t.Fatalf("round with %s busy for 100ms and %s cut off: %v; want it confirmed by %s once its connection is free", busy.opts.ID, cut.opts.ID, err, busy.opts.ID)
	}

	// Busy until the deadline: the round fails and says why.
	c.sem <- struct{}{}
	c.seq.Store(7)
	err = l.confirmLeadership(term, time.Now().Add(200*time.Millisecond))
	c.seq.Store(0)
	<-c.sem
	if err == nil || !strings.Contains(err.Error(), "the request of round 7 was still in flight") {
		t.Fatalf("round with %s busy past the deadline and %s cut off: %v; want it failed, naming the request in flight", busy.opts.ID, cut.opts.ID, err)
	}
}

// TestAckOfARoundThatIsOverSendsNothing: a goroutine of a round that
// ended before it ran neither dials nor holds the peer's connection.
func TestAckOfARoundThatIsOverSendsNothing(t *testing.T) {
	_, _, l, _ := startMesh(t, 5*time.Second, nil)
	over := make(chan struct{})
	close(over)
	// An address nothing listens on: a request sent would fail to dial.
	peer := raft.Server{ID: "n9", Address: "127.0.0.1:1", Suffrage: raft.Voter}
	r := l.askAck(peer, ackRequest{ID: l.opts.ID, Term: l.raft.CurrentTerm(), Seq: 42}, time.Now().Add(time.Second), over)
	if r.ok || r.err == nil || !strings.Contains(r.err.Error(), "round 42 was over before its request was sent") {
		t.Fatalf("ack of a round that is over: ok=%v err=%v; want no request sent", r.ok, r.err)
	}
	c := l.acks.conn(peer.ID)
	if len(c.sem) != 0 || c.lc.c != nil {
		t.Fatalf("the connection is held (%d) or open (%v) after a round that was over", len(c.sem), c.lc.c != nil)
	}
}
