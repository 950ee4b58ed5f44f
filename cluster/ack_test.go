package cluster

import (
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/hastate/hastate/internal/testenv"
	"github.com/prometheus/client_golang/prometheus/testutil"
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

// ackRequests is how many ack requests the leader l made so far (every
// result), and rounds how many confirmation rounds its loop ran.
func ackRequests(l *testNode) (requests, rounds float64) {
	for _, r := range []string{"acked", "failed", "not_sent"} {
		requests += testutil.ToFloat64(l.metrics.confirmAcks.WithLabelValues(r))
	}
	for _, r := range []string{"confirmed", "failed"} {
		rounds += testutil.ToFloat64(l.metrics.confirmRounds.WithLabelValues(r))
	}
	return requests, rounds
}

// TestLeaderRoundAsksWhatAQuorumNeeds: in a cluster of three a round asks
// one voter, the one whose ack made the last quorum, and the other only
// when that one fails (at once) or has not answered within the hedge.
// Before, every round asked both, and each follower answered every round.
func TestLeaderRoundAsksWhatAQuorumNeeds(t *testing.T) {
	const hedge = 300 * time.Millisecond
	nodes, proxies, l, _ := startMesh(t, 5*time.Second, func(i int, o *Options) { o.ackHedge = hedge })
	li := indexOf(nodes, l)
	term := l.raft.CurrentTerm()
	preferred := func() *testNode {
		l.acks.mu.Lock()
		defer l.acks.mu.Unlock()
		for _, n := range nodes {
			if raft.ServerID(n.opts.ID) == l.acks.preferred {
				return n
			}
		}
		return nil
	}

	// Healthy: one request per round (the loop's own rounds, every 250ms
	// when idle, count too). A round slower than the hedge on a loaded
	// machine asks both: a few are allowed.
	req0, rounds0 := ackRequests(l)
	const direct = 100
	for range direct {
		if err := l.confirmLeadership(term, time.Now().Add(2*time.Second)); err != nil {
			t.Fatalf("round on a healthy cluster: %v", err)
		}
	}
	req1, rounds1 := ackRequests(l)
	requests, rounds := req1-req0, rounds1-rounds0+direct
	t.Logf("%v ack requests for %v rounds", requests, rounds)
	if requests > rounds+5 {
		t.Fatalf("%v ack requests for %v rounds of a healthy cluster of three; want one per round (what a quorum needs)", requests, rounds)
	}
	p := preferred()
	if p == nil || p == l {
		t.Fatalf("preferred peer %v after confirmed rounds", p)
	}

	// The preferred peer cut off: its failure has the other asked at once,
	// well before the hedge, and the other is preferred from then on.
	cut := proxies[li][indexOf(nodes, p)]
	cut.setCut(true)
	start := time.Now()
	if err := l.confirmLeadership(term, time.Now().Add(2*time.Second)); err != nil {
		t.Fatalf("round with the preferred peer %s cut off: %v; want it confirmed by the other", p.opts.ID, err)
	}
	if d := time.Since(start); d >= hedge {
		t.Errorf("round with the preferred peer cut off took %s: the other was asked only at the hedge (%s), not on the failure", d, hedge)
	}
	if q := preferred(); q == p {
		t.Fatalf("the cut peer %s is still preferred", p.opts.ID)
	}
	cut.setCut(false)

	// The (new) preferred peer holds its replies, as a paused process
	// does: the round asks the other after the hedge and confirms.
	p = preferred()
	slow := proxies[li][indexOf(nodes, p)]
	slow.holdKind(true, true, connQuery)
	start = time.Now()
	err := l.confirmLeadership(term, time.Now().Add(2*time.Second))
	d := time.Since(start)
	slow.holdKind(true, false, connQuery)
	if err != nil {
		t.Fatalf("round with the preferred peer %s silent: %v; want it confirmed by the other after the hedge", p.opts.ID, err)
	}
	if d < hedge {
		t.Errorf("round with the preferred peer silent confirmed after %s, before the hedge (%s): by whom?", d, hedge)
	}
	if q := preferred(); q == p {
		t.Errorf("the silent peer %s is still preferred", p.opts.ID)
	}
	t.Logf("preferred peer silent: confirmed by the other after %s (hedge %s)", d.Round(time.Millisecond), hedge)
}
