package confirm

import (
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// serverOf is m as a server of the configuration.
func serverOf(m *member) raft.Server {
	return raft.Server{ID: raft.ServerID(m.id), Address: raft.ServerAddress(m.addr), Suffrage: raft.Voter}
}

// TestLeaderRoundWaitsForABusyPeer: a leader's round in which one peer's
// connection still carries an earlier round's request (a slow peer, or a
// goroutine the scheduler ran late) and the other peer cannot be reached
// waits for the busy connection and confirms with it. Skipping the busy
// peer failed such rounds: in BenchmarkLeaderRoundCost both peers were
// found busy 7–14 times per run, and those rounds' checks went unanswered.
func TestLeaderRoundWaitsForABusyPeer(t *testing.T) {
	net, ms := cluster(t, 3, nil, false, nil)
	l, busy, cut := ms[0].reads, ms[1], ms[2]
	net.setCut(cut.addr, true)

	// Every connection to busy carries an earlier round's request.
	p := l.acks.peer(raft.ServerID(busy.id))
	hold := func(seqs ...uint64) (release func()) {
		var held []*ackConn
		release = func() {
			for _, c := range held {
				c.seq.Store(0)
				p.free <- c
			}
		}
		for _, s := range seqs {
			select {
			case c := <-p.free:
				c.seq.Store(s)
				held = append(held, c)
			case <-time.After(2 * time.Second):
				release() // the rounds waiting for one end, and so does the test
				t.Fatalf("%s has %d ack connections free, want %d: one per round in flight (maxRoundsInFlight)", busy.id, len(held), len(seqs))
			}
		}
		return release
	}
	release := hold(1, 2)
	released := make(chan struct{})
	time.AfterFunc(100*time.Millisecond, func() {
		// Said before the connections are free: the round may take one
		// and end before this goroutine runs again (it did, under load).
		close(released)
		release()
	})
	err := l.confirmLeadership(2, time.Now().Add(2*time.Second))
	select {
	case <-released:
	default:
		t.Fatalf("the round ended (%v) before the busy connection was free: it did not wait for it", err)
	}
	if err != nil {
		t.Fatalf("round with %s busy for 100ms and %s cut off: %v; want it confirmed by %s once its connection is free", busy.id, cut.id, err, busy.id)
	}

	// Busy until the deadline: the round fails and says why.
	release = hold(7, 8)
	err = l.confirmLeadership(2, time.Now().Add(200*time.Millisecond))
	release()
	if err == nil || !strings.Contains(err.Error(), "the requests of rounds [7 8] were still in flight") {
		t.Fatalf("round with %s busy past the deadline and %s cut off: %v; want it failed, naming the request in flight", busy.id, cut.id, err)
	}
}

// TestAckOfARoundThatIsOverSendsNothing: a goroutine of a round that
// ended before it ran neither sends a request nor holds the peer's
// connection.
func TestAckOfARoundThatIsOverSendsNothing(t *testing.T) {
	net, ms := cluster(t, 3, nil, false, nil)
	l := ms[0].reads
	over := make(chan struct{})
	close(over)
	peer := serverOf(ms[1])
	r := l.askAck(peer, ackRequest{ID: ms[0].id, Term: 2, Seq: 42}, time.Now().Add(time.Second), over)
	if r.ok || r.err == nil || !strings.Contains(r.err.Error(), "round 42 was over before its request was sent") {
		t.Fatalf("ack of a round that is over: ok=%v err=%v; want no request sent", r.ok, r.err)
	}
	if p := l.acks.peer(peer.ID); len(p.free) != len(p.all) || net.asks.Load() != 0 {
		t.Fatalf("a connection is held (%d of %d free) or a request was sent (%d) for a round that was over", len(p.free), len(p.all), net.asks.Load())
	}
	if got := testutil.ToFloat64(l.m.confirmAcks.WithLabelValues("not_sent")); got != 1 {
		t.Errorf("hastate_confirm_acks_total{result=not_sent} = %v, want 1", got)
	}
}

// TestLeaderRoundAsksWhatAQuorumNeeds: in a cluster of three a round asks
// one voter, the one whose ack made the last quorum, and the other only
// when that one fails (at once) or has not answered within the hedge.
// Before, every round asked both, and each follower answered every round.
func TestLeaderRoundAsksWhatAQuorumNeeds(t *testing.T) {
	const hedge = 300 * time.Millisecond
	net, ms := cluster(t, 3, nil, false, func(o *Options) { o.AckHedge = hedge })
	l := ms[0].reads
	preferred := func() *member {
		l.acks.mu.Lock()
		defer l.acks.mu.Unlock()
		for _, m := range ms {
			if raft.ServerID(m.id) == l.acks.preferred {
				return m
			}
		}
		return nil
	}

	// Healthy: one request per round.
	const rounds = 100
	for range rounds {
		if err := l.confirmLeadership(2, time.Now().Add(2*time.Second)); err != nil {
			t.Fatalf("round on a healthy cluster: %v", err)
		}
	}
	if n := net.asks.Load(); n != rounds {
		t.Fatalf("%d ack requests for %d rounds of a healthy cluster of three; want one per round (what a quorum needs)", n, rounds)
	}
	p := preferred()
	if p == nil || p == ms[0] {
		t.Fatalf("preferred peer %v after confirmed rounds", p)
	}

	// The preferred peer cut off: its failure has the other asked at once,
	// well before the hedge, and the other is preferred from then on.
	net.setCut(p.addr, true)
	start := time.Now()
	if err := l.confirmLeadership(2, time.Now().Add(2*time.Second)); err != nil {
		t.Fatalf("round with the preferred peer %s cut off: %v; want it confirmed by the other", p.id, err)
	}
	if d := time.Since(start); d >= hedge {
		t.Errorf("round with the preferred peer cut off took %s: the other was asked only at the hedge (%s), not on the failure", d, hedge)
	}
	if q := preferred(); q == p {
		t.Fatalf("the cut peer %s is still preferred", p.id)
	}
	net.setCut(p.addr, false)

	// The (new) preferred peer holds its replies, as a paused process
	// does: the round asks the other after the hedge and confirms.
	p = preferred()
	release := net.silence(p.addr)
	start = time.Now()
	err := l.confirmLeadership(2, time.Now().Add(2*time.Second))
	d := time.Since(start)
	release()
	if err != nil {
		t.Fatalf("round with the preferred peer %s silent: %v; want it confirmed by the other after the hedge", p.id, err)
	}
	if d < hedge {
		t.Errorf("round with the preferred peer silent confirmed after %s, before the hedge (%s): by whom?", d, hedge)
	}
	if q := preferred(); q == p {
		t.Errorf("the silent peer %s is still preferred", p.id)
	}
}

// TestDeposedLeaderDoesNotFallBackToVerifyLeader is the rolling-upgrade
// window of issue 43: leader n1 of term 3, n2 of an older release (it
// answers "ack" with null), n3 already in term 4 (a new leader was
// elected without n1). raft's VerifyLeader on n1 succeeds, credited by
// replies held from before the election (TestPausedLeaderNeverConfirms-
// WithOldReplies shows how). The round must fail: a voter answered a
// newer term, so no fallback. Before the fix it fell back and confirmed
// in term 3 what a term-4 leader may have changed since.
func TestDeposedLeaderDoesNotFallBackToVerifyLeader(t *testing.T) {
	net, ms := cluster(t, 3, nil, false, nil)
	l := ms[0]
	l.raft.set(func(r *fakeRaft) { r.term = 3 })
	net.setLegacy(ms[1].addr)
	ms[2].raft.set(func(r *fakeRaft) { r.term, r.state, r.leaderID = 4, raft.Leader, "n3" })
	verified := 0
	l.raft.set(func(r *fakeRaft) { r.verify = func() error { verified++; return nil } })
	err := l.reads.confirmLeadership(3, time.Now().Add(time.Second))
	if err == nil || !strings.Contains(err.Error(), "term 4") {
		t.Fatalf("round of a leader in term 3 with a legacy voter and a voter in term 4: %v (VerifyLeader asked %d times); want it failed, naming term 4", err, verified)
	}
	if verified != 0 {
		t.Errorf("VerifyLeader asked %d times although a voter answered a newer term", verified)
	}

	// Without the newer term (n3 cut off instead), the legacy voter still
	// gets the fallback: older releases keep working during an upgrade.
	ms[2].raft.set(func(r *fakeRaft) { r.term, r.state, r.leaderID = 3, raft.Follower, "n1" })
	net.setCut(ms[2].addr, true)
	if err := l.reads.confirmLeadership(3, time.Now().Add(time.Second)); err != nil || verified != 1 {
		t.Fatalf("round with a legacy voter and the other cut off: %v (VerifyLeader asked %d times), want confirmed by VerifyLeader", err, verified)
	}
}

// TestRoundConfirmsOnlyWhileLeading: a round confirms only if its node
// still leads in the round's term when the round ends, whatever
// confirmed it: a quorum's acknowledgements, or raft's VerifyLeader
// (before the fix, only the term was checked after VerifyLeader, and
// nothing after a quorum).
func TestRoundConfirmsOnlyWhileLeading(t *testing.T) {
	net, ms := cluster(t, 3, nil, false, nil)
	l := ms[0]
	// Acknowledged by a quorum, but no longer the leader (same term).
	l.raft.set(func(r *fakeRaft) { r.state = raft.Follower })
	if err := l.reads.confirmLeadership(2, time.Now().Add(time.Second)); err == nil {
		t.Fatal("a round of a node that stepped down in its term confirmed")
	}
	l.raft.set(func(r *fakeRaft) { r.state = raft.Leader })
	if err := l.reads.confirmLeadership(2, time.Now().Add(time.Second)); err != nil {
		t.Fatalf("a round of the leader: %v", err)
	}
	// Through VerifyLeader (the other voters of an older release), which
	// passes while the node steps down in the same term.
	net.setLegacy(ms[1].addr)
	net.setLegacy(ms[2].addr)
	l.raft.set(func(r *fakeRaft) {
		r.verify = func() error {
			l.raft.set(func(r *fakeRaft) { r.state = raft.Follower })
			return nil
		}
	})
	if err := l.reads.confirmLeadership(2, time.Now().Add(time.Second)); err == nil {
		t.Fatal("a round confirmed by VerifyLeader while the node stepped down in its term confirmed")
	}
	// A one-voter cluster: its own vote, while it leads.
	_, one := cluster(t, 1, nil, false, nil)
	one[0].raft.set(func(r *fakeRaft) { r.state = raft.Candidate })
	if err := one[0].reads.confirmLeadership(2, time.Now().Add(time.Second)); err == nil {
		t.Fatal("a one-voter round of a node that does not lead confirmed")
	}
}
