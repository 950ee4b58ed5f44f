package cluster

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/hastate/hastate/internal/testenv"
)

// TestNoAnswerBeforeTheBarrier: a follower that becomes leader answers
// nothing, and confirms nothing for the others, until the barrier of its
// term is done: until then its commit index may miss entries the leader
// before it committed. (The barrier is held open by a test hook.)
func TestNoAnswerBeforeTheBarrier(t *testing.T) {
	var hold [3]atomic.Bool
	release := make(chan struct{})
	nodes, _, l, f := startMesh(t, 3*time.Second, func(i int, o *Options) {
		o.ConfirmTimeout = 200 * time.Millisecond
		o.afterBarrier = func() {
			if hold[i].Load() {
				<-release
			}
		}
	})
	hold[indexOf(nodes, f)].Store(true)
	released := sync.OnceFunc(func() { close(release) })
	defer released()
	if err := l.raft.LeadershipTransferToServer(raft.ServerID(f.opts.ID), raft.ServerAddress(f.opts.Advertise)).Error(); err != nil {
		t.Fatalf("transfer leadership to %s: %v", f.opts.ID, err)
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		return testenv.Expect(f.IsLeader(), "%s does not lead", f.opts.ID)
	})
	testenv.Consistently(t, time.Second, func() error {
		for _, n := range nodes {
			if got := confirmedAnswer(n.Node, "web/a"); got != "" {
				return fmt.Errorf("%s answered %q while the new leader %s has not finished its barrier", n.opts.ID, got, f.opts.ID)
			}
		}
		return nil
	})
	if err := f.reads.LastError(); err == nil || !strings.Contains(err.Error(), "barrier") {
		t.Errorf("new leader %s: last round's error %v, want it to name the barrier", f.opts.ID, err)
	}
	released()
	for _, n := range nodes {
		testenv.Eventually(t, 10*time.Second, func() error {
			return testenv.Expect(confirmedAnswer(n.Node, "web/a") == "ready 1%\n", "%s does not answer after the barrier", n.opts.ID)
		})
	}
}

// TestWipedReplicaLeadsAfterASnapshotAtABarrier is issue 33's liveness
// fault on a real cluster: the leader snapshots right after its barrier
// (the snapshot's raft index is the barrier, the FSM's index the last
// command before it), a replica whose disk was lost rejoins and installs
// that snapshot, and then leads with only its own no-op and barrier in its
// log. Every replica must go on answering without any write: the read
// index is the FSM's, not the barrier's (before the fix every round timed
// out and the whole fleet went unanswered until the next write).
func TestWipedReplicaLeadsAfterASnapshotAtABarrier(t *testing.T) {
	nodes, _, _, f := startMesh(t, 3*time.Second, func(_ int, o *Options) {
		o.SnapshotThreshold, o.SnapshotInterval = 8, 100*time.Millisecond
		o.ConfirmTimeout = 300 * time.Millisecond
	})
	for i := range 40 {
		applyOnLeader(t, nodes, uint64(i+2), map[string]string{"state/web/a": fmt.Sprintf("%d%%", i+2)})
	}
	const want = "ready 41%\n"
	// Leadership moves (a no-op and a barrier of the new term), then the
	// new leader snapshots at its barrier.
	m := leaderOf(nodes)
	if err := m.raft.LeadershipTransfer().Error(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		m = leaderOf(nodes)
		return testenv.Expect(m != nil && m.reads.BarrierTerm() == m.raft.CurrentTerm(), "no new leader past its barrier")
	})
	if err := m.raft.Snapshot().Error(); err != nil {
		t.Fatalf("snapshot on %s: %v", m.opts.ID, err)
	}
	snapIndex := m.raft.LastIndex()
	if fi := m.fsm.Index(); fi >= snapIndex {
		t.Fatalf("the snapshot at %d is at a command (FSM index %d): the scenario needs it past one", snapIndex, fi)
	}

	// f loses its disk and rejoins (the same ID and address).
	if f == m {
		f = followerOf(nodes, m)
	}
	if err := f.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	o := f.opts
	o.DataDir = t.TempDir()
	w := startNode(t, o)
	nodes[indexOf(nodes, f)] = w
	testenv.Eventually(t, 15*time.Second, func() error {
		return testenv.Expect(answer(w.Node, "web/a") == want && w.raft.Stats()["last_snapshot_index"] != "0",
			"wiped %s has not installed a snapshot (stats %v)", w.opts.ID, w.raft.Stats()["last_snapshot_index"])
	})
	if first, _ := w.logs.FirstIndex(); first != 0 && first <= snapIndex {
		t.Fatalf("wiped %s's log starts at %d, at or before the snapshot %d: it did not start from the snapshot", w.opts.ID, first, snapIndex)
	}
	if err := m.raft.LeadershipTransferToServer(raft.ServerID(w.opts.ID), raft.ServerAddress(w.opts.Advertise)).Error(); err != nil {
		t.Fatalf("transfer leadership to %s: %v", w.opts.ID, err)
	}
	testenv.Eventually(t, 10*time.Second, func() error { return testenv.Expect(w.IsLeader(), "%s does not lead", w.opts.ID) })
	for _, n := range nodes {
		testenv.Eventually(t, 5*time.Second, func() error {
			got := confirmedAnswer(n.Node, "web/a")
			return testenv.Expect(got == want, "%s answers %q with %s leading from its snapshot at %d (FSM %d); last round: %v",
				n.opts.ID, got, w.opts.ID, snapIndex, n.fsm.Index(), n.reads.LastError())
		})
	}
}

// TestBarrierOfAnEarlierTermDoesNotCount: a barrier that returns after
// the node lost leadership and led again in a later term proves nothing
// about that term (its no-op may not be committed): the term is read
// before the barrier and recorded only if unchanged, so the new term's
// leader duty starts with its own barrier not yet recorded. (Before the
// fix the term read after the barrier was recorded: the later term
// looked done before its own barrier.)
func TestBarrierOfAnEarlierTermDoesNotCount(t *testing.T) {
	var armed atomic.Bool
	var calls atomic.Int32
	var premature atomic.Bool // barrierTerm said the new term was done before its barrier
	var n0 *testNode
	var hookErr atomic.Pointer[string]
	var nodes []*testNode
	nodes, _ = meshClusterWith(t, 3*time.Second, func(i int, o *Options) {
		if i != 0 {
			return
		}
		o.afterBarrier = func() {
			if !armed.Load() {
				return
			}
			switch calls.Add(1) {
			case 1:
				// Leadership goes away and comes back before this
				// barrier's term is checked.
				term := n0.raft.CurrentTerm()
				if err := n0.raft.LeadershipTransfer().Error(); err != nil {
					msg := "transfer away: " + err.Error()
					hookErr.Store(&msg)
					return
				}
				deadline := time.Now().Add(10 * time.Second)
				for !(n0.IsLeader() && n0.raft.CurrentTerm() > term+1) && time.Now().Before(deadline) {
					if x := leaderOf(nodes[1:]); x != nil {
						_ = x.raft.LeadershipTransferToServer(raft.ServerID(n0.opts.ID), raft.ServerAddress(n0.opts.Advertise)).Error()
					}
					<-time.After(20 * time.Millisecond)
				}
				if !n0.IsLeader() {
					msg := "leadership did not come back"
					hookErr.Store(&msg)
				}
			case 2:
				premature.Store(n0.reads.BarrierTerm() == n0.raft.CurrentTerm())
			}
		}
	})
	n0 = nodes[0]
	testenv.Eventually(t, 10*time.Second, func() error { return testenv.Expect(leaderOf(nodes) != nil, "no leader") })
	if x := leaderOf(nodes); x == n0 {
		if err := n0.raft.LeadershipTransfer().Error(); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		x := leaderOf(nodes)
		return testenv.Expect(x != nil && x != n0, "no leader other than %s", n0.opts.ID)
	})
	applyOnLeader(t, nodes, 1, map[string]string{"state/web/a": "drain"})
	armed.Store(true)
	x := leaderOf(nodes)
	if err := x.raft.LeadershipTransferToServer(raft.ServerID(n0.opts.ID), raft.ServerAddress(n0.opts.Advertise)).Error(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, func() error {
		return testenv.Expect(calls.Load() >= 2, "%s's leader duty ran its barrier %d times, want 2", n0.opts.ID, calls.Load())
	})
	if e := hookErr.Load(); e != nil {
		t.Fatalf("the scenario did not happen: %s", *e)
	}
	if premature.Load() {
		t.Errorf("%s recorded the term it led again in as done with the barrier of the term before", n0.opts.ID)
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		return testenv.Expect(!n0.IsLeader() || n0.reads.BarrierTerm() == n0.raft.CurrentTerm(), "%s never finished its own barrier", n0.opts.ID)
	})
}
