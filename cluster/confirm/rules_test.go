package confirm

// The rules of confirmed reads, each with a test that fails when the rule
// is removed (issue 43; `make mutate` removes each and names the test that
// catches it).

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/hastate/hastate/internal/testenv"
	"github.com/hastate/hastate/state"
)

// TestCheckNeverJoinsARoundThatBeganBeforeIt: a check that arrives while a
// round is in flight waits for the next round, which begins after it: the
// round in flight read its commit index before the check arrived, so its
// result says nothing of what was committed since. Here the round in
// flight confirms and every round after it fails: the check must be
// answered nothing.
func TestCheckNeverJoinsARoundThatBeganBeforeIt(t *testing.T) {
	net, ms := cluster(t, 3, nil, false, func(o *Options) { o.Timeout, o.AckHedge = 2*time.Second, time.Minute })
	l := ms[0].reads
	startRounds(ms[0])
	l.conf.wake()
	testEventually(t, func() bool { _, at := l.conf.lastConfirmed(); return l.Rounds() > 0 && at.After(l.o.Started) }, "the leader never confirmed")
	// Every peer silent: the next round waits on its first request.
	releases := []func(){net.silence(ms[1].addr), net.silence(ms[2].addr)}
	asked, rounds := net.asks.Load(), l.Rounds()
	l.conf.wake()
	testEventually(t, func() bool { return l.Rounds() > rounds && net.asks.Load() > asked }, "no round began")

	// A check arrives while that round is in flight: it takes the
	// notifier it will wait on (what Confirmed does first).
	check := l.conf.next.Load()
	// The round in flight will confirm (its request is already sent);
	// every later round fails.
	net.setCut(ms[1].addr, true)
	net.setCut(ms[2].addr, true)
	for _, r := range releases {
		r()
	}
	l.conf.wake()
	select {
	case <-check.done:
	case <-time.After(5 * time.Second):
		t.Fatal("the check's round never ended")
	}
	if check.err == nil {
		t.Fatalf("a check that arrived during a round was confirmed (index %d) by a round that began before it; want the next round's failure", check.index)
	}
}

// TestArrivalNeverJoinsARoundThatBeganBeforeIt: the same rule for a check
// whose arrival is taken when its connection is accepted (Arrived), before
// its request is read: a check accepted while a round is in flight is
// confirmed by a round that begins after its accept, even when its
// request is read only after the round in flight confirmed. Here that
// round confirms and every round after it fails: the check must be
// answered nothing. A check accepted after the round in flight ended is
// confirmed by the next round (its ticket is not spent by the round it
// missed).
func TestArrivalNeverJoinsARoundThatBeganBeforeIt(t *testing.T) {
	net, ms := cluster(t, 3, nil, false, func(o *Options) { o.Timeout, o.AckHedge = 2*time.Second, time.Minute })
	l := ms[0].reads
	l.withheld.set(withholdCatchingUp, false)
	ms[0].state.serving.Store(state.NewMirror().Snapshot())
	startRounds(ms[0])
	if l.Confirmed() == nil {
		t.Fatal("the leader never confirmed")
	}
	// Every peer silent: the next round waits on its first request.
	releases := []func(){net.silence(ms[1].addr), net.silence(ms[2].addr)}
	asked, rounds := net.asks.Load(), l.Rounds()
	l.conf.wake()
	testEventually(t, func() bool { return l.Rounds() > rounds && net.asks.Load() > asked }, "no round began")

	// A check is accepted while that round is in flight.
	accepted := l.Arrived()
	// The round in flight will confirm (its request is already sent);
	// every later round fails.
	net.setCut(ms[1].addr, true)
	net.setCut(ms[2].addr, true)
	_, okAt := l.conf.lastConfirmed()
	for _, r := range releases {
		r()
	}
	testEventually(t, func() bool { _, at := l.conf.lastConfirmed(); return at.After(okAt) }, "the round in flight never confirmed")
	// Its request is read only now, after that round confirmed.
	if s := l.ConfirmedSince(accepted); s != nil {
		t.Fatal("a check accepted during a round was answered once that round confirmed: the round began before the check")
	}
	// The peers answer again: a check accepted now is confirmed by the
	// round that begins after its accept.
	net.setCut(ms[1].addr, false)
	net.setCut(ms[2].addr, false)
	if s := l.ConfirmedSince(l.Arrived()); s == nil {
		t.Fatalf("a check accepted while the peers answer was answered nothing: %v", l.LastError())
	}
}

// TestFollowerRequestIsAnAcknowledgementOnlyWhereItMakesAQuorum: the
// leader answers a follower's read-index request with its commit index at
// once only when the follower's acknowledgement and its own vote are a
// quorum (up to three voters); with five voters, or from a non-voter, the
// request waits for a round of the leader's own, which fails here (the
// other voters are cut off).
func TestFollowerRequestIsAnAcknowledgementOnlyWhereItMakesAQuorum(t *testing.T) {
	for _, c := range []struct {
		name      string
		voters    int
		nonvoters []string
		asker     string
		cut       []string
	}{
		{"five voters, a voter asks", 5, nil, "n2", []string{"n3", "n4", "n5"}},
		{"three voters, a non-voter asks", 4, []string{"n4"}, "n4", []string{"n2", "n3"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			net, ms := cluster(t, c.voters, c.nonvoters, true, func(o *Options) { o.Timeout = 300 * time.Millisecond })
			for _, id := range c.cut {
				net.setCut(id+":9779", true)
			}
			a := ms[0].reads.answerReadIndex(readIndexRequest{ID: c.asker, Term: 2}, nil)
			if a.Error == "" {
				t.Fatalf("read index for %s answered %d at once: its request and the leader's vote are no quorum", c.asker, a.Index)
			}
		})
	}
	// Three voters: the follower's request and the leader's vote are a
	// quorum, so the answer needs no round (the others are cut off).
	net, ms := cluster(t, 3, nil, true, func(o *Options) { o.Timeout = 300 * time.Millisecond })
	net.setCut("n3:9779", true)
	if a := ms[0].reads.answerReadIndex(readIndexRequest{ID: "n2", Term: 2}, nil); a.Error != "" || a.Index != 10 {
		t.Fatalf("read index for a voter of three: %+v, want 10 at once", a)
	}
}

// testEventually waits up to 5s for cond.
func testEventually(t *testing.T, cond func() bool, msg string) {
	t.Helper()
	testenv.Eventually(t, 5*time.Second, func() error { return testenv.Expect(cond(), "%s", msg) })
}

// TestAnAckOfAnotherRoundDoesNotCount: a voter's answer must carry the
// round's sequence number: a reply held in a buffer while the leader was
// paused answers an earlier round and says nothing of this one.
func TestAnAckOfAnotherRoundDoesNotCount(t *testing.T) {
	net, ms := cluster(t, 3, nil, false, nil)
	net.setStale(ms[1].addr)
	net.setCut(ms[2].addr, true)
	if err := ms[0].reads.confirmLeadership(2, time.Now().Add(time.Second)); err == nil {
		t.Fatal("a round confirmed with an answer to an earlier round")
	}
}

// TestBarrierBeforeAnyReadIndex: a new leader answers no read index, its
// own or a follower's (even one whose request is a quorum with its vote),
// until the barrier of its term is done: its commit index may miss what
// the leader before it committed.
func TestBarrierBeforeAnyReadIndex(t *testing.T) {
	_, ms := cluster(t, 3, nil, false, nil)
	l := ms[0].reads
	l.BarrierDone(1) // an earlier term's barrier
	if _, err := l.leaderReadIndex(time.Now().Add(time.Second)); err == nil || !strings.Contains(err.Error(), "barrier") {
		t.Errorf("the leader's own read index before its barrier: %v, want refused naming the barrier", err)
	}
	if a := l.answerReadIndex(readIndexRequest{ID: "n2", Term: 2}, nil); a.Error == "" || !strings.Contains(a.Error, "barrier") {
		t.Errorf("a voter's read index before the leader's barrier: %+v, want refused naming the barrier", a)
	}
	l.BarrierDone(2)
	if i, err := l.leaderReadIndex(time.Now().Add(time.Second)); err != nil || i != 10 {
		t.Errorf("after the barrier: %d, %v; want 10", i, err)
	}
}

// TestRoundWaitsUntilTheStateServesTheIndex: a round confirms only once
// the state serves the read index (the commit index, as the last command
// at or below it), not when the index is learned.
func TestRoundWaitsUntilTheStateServesTheIndex(t *testing.T) {
	_, ms := cluster(t, 1, nil, false, nil)
	l := ms[0]
	if err := l.reads.o.Log.(*raft.InmemStore).StoreLog(&raft.Log{Index: 12, Term: 2, Type: raft.LogCommand}); err != nil {
		t.Fatal(err)
	}
	l.raft.set(func(r *fakeRaft) { r.commit = 12 })
	if _, err := l.reads.confirmRound(time.Now().Add(100 * time.Millisecond)); err == nil {
		t.Fatal("a round confirmed index 12 while the state serves 10")
	}
	done := make(chan error, 1)
	go func() {
		_, err := l.reads.confirmRound(time.Now().Add(5 * time.Second))
		done <- err
	}()
	l.state.index.Store(12)
	l.reads.Advanced()
	if err := <-done; err != nil {
		t.Fatalf("once the state serves 12: %v", err)
	}
}

// TestAReasonThatCameDuringTheRoundWithholds: a check whose round
// confirms is still answered nothing when a reason to withhold came into
// force while it waited (here: an entry of a newer release applied).
func TestAReasonThatCameDuringTheRoundWithholds(t *testing.T) {
	net, ms := cluster(t, 3, nil, false, nil)
	l := ms[0]
	m := state.NewMirror()
	m.ApplyAt(state.Change{Set: map[string]string{"state/web/a": "drain"}}, time.Now(), state.RampPolicy{})
	l.state.serving.Store(m.Snapshot())
	l.reads.withheld.set(withholdCatchingUp, false)
	startRounds(l)
	releases := []func(){net.silence(ms[1].addr), net.silence(ms[2].addr)}
	got := make(chan *state.Snapshot, 1)
	go func() { got <- l.reads.Confirmed() }()
	testEventually(t, func() bool { return net.asks.Load() > 0 }, "the check's round never asked a voter")
	l.reads.NotUnderstood(errors.New("an entry of a newer release"))
	for _, r := range releases {
		r()
	}
	if s := <-got; s != nil {
		t.Fatal("a check was answered although a reason to withhold came into force while it waited")
	}
}

// TestRoundsArePipelined: a round may begin while another is in flight,
// so a check that arrives during a round waits for the next one to begin,
// not for the one in flight to end first; at most maxRoundsInFlight run
// at once, and every one ends.
func TestRoundsArePipelined(t *testing.T) {
	net, ms := cluster(t, 3, nil, false, func(o *Options) { o.Timeout, o.AckHedge = 5*time.Second, time.Minute })
	l := ms[0].reads
	startRounds(ms[0])
	releases := []func(){net.silence(ms[1].addr), net.silence(ms[2].addr)}
	first := l.conf.next.Load()
	l.conf.wake()
	testEventually(t, func() bool { return l.Rounds() == 1 && net.asks.Load() == 1 }, "no first round")
	// A check arrives during the first round: the next round begins at
	// once, the first still in flight.
	second := l.conf.next.Load()
	l.conf.wake()
	testEventually(t, func() bool { return l.Rounds() == 2 }, "no round began while the first was in flight")
	select {
	case <-first.done:
		t.Fatal("the first round ended while its peers were silent")
	default:
	}
	// A third wish waits for a free slot.
	third := l.conf.next.Load()
	l.conf.wake()
	testenv.Consistently(t, 100*time.Millisecond, func() error {
		return testenv.Expect(l.Rounds() == 2, "%d rounds at once, want at most %d", l.Rounds(), maxRoundsInFlight)
	})
	for _, r := range releases {
		r()
	}
	for i, nr := range []*readNotifier{first, second, third} {
		select {
		case <-nr.done:
			if nr.err != nil {
				t.Errorf("round %d: %v", i+1, nr.err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("round %d never ended", i+1)
		}
	}
}

// TestEveryRoundWaitingForTheStateWakes: rounds in flight together wait
// for the state's index; one advance of the state wakes them all.
func TestEveryRoundWaitingForTheStateWakes(t *testing.T) {
	_, ms := cluster(t, 1, nil, false, nil)
	l := ms[0]
	done := make(chan error, 2)
	for range 2 {
		go func() { done <- l.reads.waitApplied(12, time.Now().Add(5*time.Second)) }()
	}
	testenv.Consistently(t, 50*time.Millisecond, func() error { return testenv.Expect(len(done) == 0, "a wait ended before the state served 12") })
	l.state.index.Store(12)
	l.reads.Advanced()
	for range 2 {
		if err := <-done; err != nil {
			t.Fatalf("a round waiting for 12 once the state serves it: %v", err)
		}
	}
}
