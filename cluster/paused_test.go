package cluster

import (
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/hastate/hastate/cluster/raftport"
	"github.com/hastate/hastate/internal/history"
	"github.com/hastate/hastate/internal/testenv"
)

// recorder is the history of a test: writes with their call and return
// times, checks as reads (internal/history's porcupine check).
type recorder struct {
	mu      sync.Mutex
	writes  []history.Write
	answers []history.Answer
}

// write applies kv (one key) through the leader of nodes and records it
// from the call until ApplyKV returned (committed).
func (r *recorder) write(t *testing.T, nodes []*testNode, index uint64, key, value string) *testNode {
	t.Helper()
	ans, ok := history.AnswerFor(value)
	if !ok {
		t.Fatalf("value %q: not one the history knows", value)
	}
	began := time.Now()
	l := applyOnLeader(t, nodes, index, map[string]string{"state/" + key: value})
	r.mu.Lock()
	r.writes = append(r.writes, history.Write{Server: key, Answer: ans, Began: began, Ended: time.Now(), By: "apply on " + l.opts.ID})
	r.mu.Unlock()
	return l
}

// check asks n for key's confirmed answer and records it as a read (an
// empty answer records no operation; it is counted by the caller).
func (r *recorder) check(n *testNode, who, key string) string {
	began := time.Now()
	got := confirmedAnswer(n.Node, key)
	a := history.Answer{Poller: who, Server: key, Began: began, Ended: time.Now()}
	if len(got) > 0 {
		a.Line = got[:len(got)-1]
	}
	r.mu.Lock()
	r.answers = append(r.answers, a)
	r.mu.Unlock()
	return a.Line
}

// verdict checks the whole history with porcupine; a failing one is
// written as HTML under the artifacts directory (history.ArtifactsDir:
// cluster/artifacts/ unless HASTATE_ARTIFACTS says otherwise), named in
// the failure.
func (r *recorder) verdict(t *testing.T) history.LinearResult {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	res := history.Linearizable(r.writes, r.answers, time.Minute)
	if !res.Ok() {
		dir, err := history.ArtifactsDir()
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, fmt.Sprintf("%s-%d.html", t.Name(), time.Now().Unix()))
		if err := res.Visualize(path); err != nil {
			t.Errorf("visualise: %v", err)
		}
		t.Errorf("history not linearizable: %s (porcupine's visualisation: %s)", res, path)
	}
	return res
}

// queueChecks starts n checks at node l (recorded by rec) and returns
// once a confirmation round began after all of them; answered waits for
// their answers.
func queueChecks(t *testing.T, rec *recorder, l *testNode, n int) (answered func() []string) {
	t.Helper()
	var wg sync.WaitGroup
	started := make(chan struct{}, n)
	lines := make(chan string, n)
	for i := range n {
		wg.Go(func() {
			started <- struct{}{}
			lines <- rec.check(l, fmt.Sprintf("check %d at %s", i, l.opts.ID), "web/a")
		})
	}
	for range n {
		<-started
	}
	queued := l.reads.Rounds()
	testenv.Eventually(t, 5*time.Second, func() error {
		return testenv.Expect(l.reads.Rounds() > queued, "no round began after the checks")
	})
	return func() []string {
		wg.Wait()
		close(lines)
		var out []string
		for line := range lines {
			out = append(out, line)
		}
		return out
	}
}

// TestPausedLeaderNeverConfirmsWithOldReplies is issue 33's scenario with
// its timing controlled: the leader L's links are held (every byte kept,
// no connection closed, as the sockets of a stopped process), starting
// with the followers' replies, so that replies they sent in L's term to
// RPCs in flight wait in the proxies. L keeps leading in its own view (its
// own heartbeat timeout, and so its lease, is long: a stopped process's
// lease check does not run either). The followers elect a new leader,
// which commits a drain. Then checks arrive at L, a confirmation round
// begins for them, and only then are the held replies released to L, the
// replies first. No check may be answered the state before the drain:
// the history (writes with their call and return, checks as reads) is
// linearizable (porcupine).
//
// Against raft's VerifyLeader (the confirmation before issue 33) this
// fails: the held replies credit the VerifyLeader futures registered
// while the RPCs were in flight (notifyAll in replication.go), and L
// answers maint after the drain was committed.
func TestPausedLeaderNeverConfirmsWithOldReplies(t *testing.T) {
	nodes, proxies := meshClusterWith(t, 5*time.Second, func(i int, o *Options) {
		o.ConfirmTimeout = time.Second
		if i == 0 {
			o.HeartbeatTimeout, o.ElectionTimeout = 10*time.Second, 10*time.Second
		}
	})
	l := nodes[0]
	testenv.Eventually(t, 10*time.Second, func() error {
		return testenv.Expect(leaderOf(nodes) != nil, "no leader")
	})
	if x := leaderOf(nodes); x != l {
		if err := x.raft.LeadershipTransferToServer(raft.ServerID(l.opts.ID), raft.ServerAddress(l.opts.Advertise)).Error(); err != nil {
			t.Fatalf("transfer leadership to %s: %v", l.opts.ID, err)
		}
	}
	testenv.Eventually(t, 10*time.Second, func() error { return testenv.Expect(l.IsLeader(), "%s does not lead", l.opts.ID) })
	var rec recorder
	rec.write(t, nodes[:1], 1, "web/a", "maint")
	for _, n := range nodes {
		testenv.Eventually(t, 10*time.Second, func() error {
			return testenv.Expect(rec.check(n, "before "+n.opts.ID, "web/a") == "maint", "%s does not answer maint", n.opts.ID)
		})
	}
	term := l.raft.CurrentTerm()

	// The pause: the followers' replies to L first, until one is held on
	// each link (an RPC was in flight), then everything else to and from L.
	for j := 1; j < 3; j++ {
		proxies[0][j].hold(false, true)
	}
	testenv.Eventually(t, 5*time.Second, func() error {
		return testenv.Expect(proxies[0][1].heldSoFar(false) > 0 && proxies[0][2].heldSoFar(false) > 0, "no reply to L held yet")
	})
	for j := 1; j < 3; j++ {
		proxies[0][j].hold(true, true)
		proxies[j][0].hold(true, true)
		proxies[j][0].hold(false, true)
	}
	released := false
	release := func() {
		if released {
			return
		}
		released = true
		for j := 1; j < 3; j++ {
			proxies[0][j].hold(false, false) // the held replies, first
		}
		for j := 1; j < 3; j++ {
			proxies[0][j].hold(true, false)
			proxies[j][0].hold(false, false)
			proxies[j][0].hold(true, false)
		}
	}
	defer release()

	majority := nodes[1:]
	testenv.Eventually(t, 10*time.Second, func() error {
		x := leaderOf(majority)
		return testenv.Expect(x != nil && x.raft.CurrentTerm() > term, "the followers elected nobody")
	})
	x := rec.write(t, majority, 2, "web/a", "drain")
	for _, n := range majority {
		testenv.Eventually(t, 5*time.Second, func() error {
			return testenv.Expect(answer(n.Node, "web/a") == "drain\n", "%s does not serve the drain", n.opts.ID)
		})
	}
	if !l.IsLeader() || l.raft.CurrentTerm() != term {
		t.Fatalf("held leader %s no longer leads in term %d before the release (state %s, term %d): the scenario needs it to", l.opts.ID, term, l.raft.State(), l.raft.CurrentTerm())
	}

	// Checks queued at L; once a round began after them, the release.
	const checks = 20
	answered := queueChecks(t, &rec, l, checks)
	release()
	stale, empty := 0, 0
	for _, line := range answered() {
		switch line {
		case "":
			empty++
		case "maint":
			stale++
		}
	}
	if stale > 0 {
		t.Errorf("%d of %d checks at the held leader %s answered maint after %s committed the drain", stale, checks, l.opts.ID, x.opts.ID)
	}
	// After the release L follows the new leader and answers the drain.
	testenv.Eventually(t, 10*time.Second, func() error {
		return testenv.Expect(rec.check(l, "after "+l.opts.ID, "web/a") == "drain", "released %s does not answer the drain: %+v", l.opts.ID, l.Info().Confirm)
	})
	res := rec.verdict(t)
	t.Logf("held leader %s (term %d), new leader %s: %d checks queued at the held leader: %d stale, %d unanswered; replies held to L %d and %d bytes; history: %s",
		l.opts.ID, term, x.opts.ID, checks, stale, empty, proxies[0][1].heldSoFar(false), proxies[0][2].heldSoFar(false), res)
}

// TestLeaderChangeInTheMiddleOfARound: the leader's round has asked its
// voters (their "ack" query connections to it held, raft's own links
// untouched), then leadership moves to another node, which commits a
// drain, and only then do the requests reach the voters (requests held)
// or their answers reach the old leader (answers held). Requests answered
// after the change say the new term: the round fails and the checks get
// nothing. Answers given before the change are acknowledgements of a
// round that began before it, so the old state is a linearizable answer
// to checks that arrived before the round. Either way the history
// (porcupine) is linearizable, and a check arriving after the drain gets
// the drain or nothing.
func TestLeaderChangeInTheMiddleOfARound(t *testing.T) {
	for _, c := range []struct {
		name string
		up   bool // hold the requests (else the answers)
	}{{"requests reach the voters after the change", true}, {"answers reach the old leader after the change", false}} {
		t.Run(c.name, func(t *testing.T) {
			nodes, proxies := meshClusterWith(t, 5*time.Second, func(i int, o *Options) { o.ConfirmTimeout = 3 * time.Second })
			testenv.Eventually(t, 10*time.Second, func() error { return testenv.Expect(leaderOf(nodes) != nil, "no leader") })
			var rec recorder
			l := rec.write(t, nodes, 1, "web/a", "maint")
			for _, n := range nodes {
				testenv.Eventually(t, 10*time.Second, func() error {
					return testenv.Expect(rec.check(n, "before "+n.opts.ID, "web/a") == "maint", "%s does not answer maint", n.opts.ID)
				})
			}
			li := indexOf(nodes, l)
			term := l.raft.CurrentTerm()
			for j := range 3 {
				if j != li {
					proxies[li][j].holdKind(c.up, true, raftport.KindQuery)
				}
			}
			released := false
			release := func() {
				if !released {
					released = true
					for j := range 3 {
						if j != li {
							proxies[li][j].holdKind(c.up, false, raftport.KindQuery)
						}
					}
				}
			}
			defer release()
			const checks = 10
			answered := queueChecks(t, &rec, l, checks)
			if !c.up {
				// The voters answered in the old term before the change.
				testenv.Eventually(t, 5*time.Second, func() error {
					var held int
					for j := range 3 {
						if j != li {
							held += proxies[li][j].heldSoFar(false)
						}
					}
					return testenv.Expect(held > 0, "no answer held yet")
				})
			}
			switch err := l.raft.LeadershipTransfer().Error(); {
			case errors.Is(err, raft.ErrNotLeader):
				t.Logf("leadership had left %s already (an election on a loaded machine): the round is mid-change all the same", l.opts.ID)
			case err != nil:
				t.Fatalf("transfer leadership away from %s: %v", l.opts.ID, err)
			}
			x := rec.write(t, othersThan(nodes, l), 2, "web/a", "drain")
			if x.raft.CurrentTerm() <= term {
				t.Fatalf("new leader %s in term %d, not after %d", x.opts.ID, x.raft.CurrentTerm(), term)
			}
			release()
			got := map[string]int{}
			for _, line := range answered() {
				got[line]++
			}
			// A check after the drain, on every node: the drain or nothing.
			for _, n := range nodes {
				if a := rec.check(n, "after "+n.opts.ID, "web/a"); a != "drain" && a != "" {
					t.Errorf("%s answered %q after the drain was committed", n.opts.ID, a)
				}
			}
			res := rec.verdict(t)
			t.Logf("old leader %s (term %d), new leader %s (term %d): the %d checks in the round got %v; history: %s",
				l.opts.ID, term, x.opts.ID, x.raft.CurrentTerm(), checks, got, res)
		})
	}
}
