package cluster

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/hastate/hastate/internal/testenv"
)

// confirmedAnswer is the answer a check arriving now gets: confirmed first.
func confirmedAnswer(n *Node, req string) string {
	i := strings.IndexByte(req, '/')
	return string(n.Confirmed().Lookup([]byte(req), i))
}

// startMesh starts meshCluster and waits until every node answers, with
// the leader and one follower.
func startMesh(t *testing.T, grace time.Duration, tweak func(i int, o *Options)) (nodes []*testNode, proxies [3][3]*cutProxy, l, f *testNode) {
	t.Helper()
	nodes, proxies = meshClusterWith(t, grace, tweak)
	testenv.Eventually(t, 10*time.Second, func() error {
		return testenv.Expect(leaderOf(nodes) != nil, "no leader")
	})
	l = applyOnLeader(t, nodes, 1, map[string]string{"state/web/a": "1%"})
	for _, n := range nodes {
		testenv.Eventually(t, 5*time.Second, func() error {
			ok, d := n.Ready()
			return testenv.Expect(ok && confirmedAnswer(n.Node, "web/a") == "ready 1%\n", "%s not ready: %s", n.opts.ID, d)
		})
		if n != l && f == nil {
			f = n
		}
	}
	return nodes, proxies, l, f
}

// followerOf is a node of nodes other than l.
func followerOf(nodes []*testNode, l *testNode) *testNode {
	for _, n := range nodes {
		if n != l {
			return n
		}
	}
	return nil
}

// TestConfirmedSeesEveryCommittedWrite: a check on a follower that arrives
// after a write was committed on the leader is answered with that write,
// every time, although the follower learns of the commit only later
// (CommitTimeout); its unconfirmed snapshot at that instant often is older.
func TestConfirmedSeesEveryCommittedWrite(t *testing.T) {
	nodes, _, _, _ := startMesh(t, time.Second, nil)
	staleUnconfirmed, unanswered := 0, 0
	const writes = 100
	for i := range writes {
		w := i%99 + 2
		l := applyOnLeader(t, nodes, uint64(i+2), map[string]string{"state/web/a": fmt.Sprintf("%d%%", w)})
		f := followerOf(nodes, l)
		want := fmt.Sprintf("ready %d%%\n", w)
		if answer(f.Node, "web/a") != want {
			staleUnconfirmed++
		}
		// Nothing (an election on a loaded machine) is allowed, older is not.
		for _, n := range []*testNode{f, l} {
			switch got := confirmedAnswer(n.Node, "web/a"); got {
			case want:
			case "":
				unanswered++
			default:
				t.Fatalf("write %d: %s answered %q after the leader %s committed %q", i, n.opts.ID, got, l.opts.ID, want)
			}
		}
	}
	if unanswered > writes/4 {
		t.Errorf("%d of %d checks unanswered", unanswered, 2*writes)
	}
	t.Logf("%d of %d writes: a follower's unconfirmed state right after the commit was older than the write; every confirmed answer was current", staleUnconfirmed, writes)
	var rounds float64
	for _, n := range nodes {
		rounds += metricOf(t, n, "hastate_confirm_rounds_total", "result=confirmed")
	}
	if rounds < 2*writes {
		t.Errorf("hastate_confirm_rounds_total{confirmed} = %v over the nodes, want at least %d", rounds, 2*writes)
	}
}

// TestCutOffFollowerAnswersNothingAtOnce: from the instant its raft links
// are cut, a follower answers no check (every confirmation fails), long
// before --leaderless-grace; it stays ready within the grace, saying it
// cannot confirm, and the majority follows a write made meanwhile.
func TestCutOffFollowerAnswersNothingAtOnce(t *testing.T) {
	const grace = 3 * time.Second
	nodes, proxies, _, f := startMesh(t, grace, func(_ int, o *Options) { o.ConfirmTimeout = 200 * time.Millisecond })
	isolate(proxies, indexOf(nodes, f), true)
	cut := time.Now()
	applyOnLeader(t, othersThan(nodes, f), 2, map[string]string{"state/web/a": "drain"}) // the majority still has a leader
	for range 5 {
		if got := confirmedAnswer(f.Node, "web/a"); got != "" {
			t.Fatalf("cut-off %s answered %q %s after the cut; want nothing", f.opts.ID, got, time.Since(cut))
		}
	}
	if time.Since(cut) < grace {
		ok, d := f.Ready()
		if !ok || !strings.Contains(d, "cannot confirm with the leader for") {
			t.Errorf("cut-off %s within the grace: Ready %v %q; want ready, saying it cannot confirm", f.opts.ID, ok, d)
		}
		if ci := f.Info().Confirm; ci.Answering || !strings.Contains(ci.NotAnswering, "cannot confirm with the leader for") {
			t.Errorf("cut-off %s: /v1/cluster confirm %+v; want not answering, saying why", f.opts.ID, ci)
		}
	}
	if v := metricOf(t, f, "hastate_agent_unconfirmed_total", ""); v < 5 {
		t.Errorf("hastate_agent_unconfirmed_total = %v, want at least 5", v)
	}
	if v := metricOf(t, f, "hastate_confirm_failing_seconds", ""); v <= 0 {
		t.Errorf("hastate_confirm_failing_seconds = %v, want > 0", v)
	}
	for _, n := range nodes {
		if n != f {
			if got := confirmedAnswer(n.Node, "web/a"); got != "drain\n" {
				t.Errorf("majority %s answers %q, want drain", n.opts.ID, got)
			}
		}
	}
	isolate(proxies, indexOf(nodes, f), false)
	testenv.Eventually(t, 10*time.Second, func() error {
		return testenv.Expect(confirmedAnswer(f.Node, "web/a") == "drain\n", "healed %s does not answer drain: %+v", f.opts.ID, f.Info().Confirm)
	})
}

// TestConfirmAgainstAnOlderLeader: a leader of a release before the
// read-index query answers it null; the follower then confirms with the
// leader's status (its state index) and still answers every write the
// leader applied before the check. Once that leader is upgraded (restarted
// with this release) and leads again, the follower asks it the read index
// again: the fallback holds only for the term the older leader led.
func TestConfirmAgainstAnOlderLeader(t *testing.T) {
	nodes, _, _, _ := startMesh(t, time.Second, func(_ int, o *Options) { o.legacyReadIndex = true })
	var f, l *testNode
	for i := range 20 {
		w := i + 2
		l = applyOnLeader(t, nodes, uint64(i+2), map[string]string{"state/web/a": fmt.Sprintf("%d%%", w)})
		f = followerOf(nodes, l)
		if got, want := confirmedAnswer(f.Node, "web/a"), fmt.Sprintf("ready %d%%\n", w); got != want {
			t.Fatalf("write %d: follower %s of an older leader answered %q, want %q", i, f.opts.ID, got, want)
		}
	}
	if old := f.reads.LegacyLeader(); old != l.opts.ID {
		t.Fatalf("follower %s did not note that its leader %s is older: %+v", f.opts.ID, l.opts.ID, old)
	}

	// Upgrade the leader: stop it (it hands over), start it with this
	// release on the same data, and give it leadership back.
	if err := l.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	o := l.opts
	o.legacyReadIndex = false
	up := startNode(t, o)
	nodes[indexOf(nodes, l)] = up
	testenv.Eventually(t, 10*time.Second, func() error {
		cur := leaderOf(nodes)
		if cur == nil || cur == up {
			return testenv.Expect(cur == up, "no leader")
		}
		if ok, _ := up.Ready(); !ok {
			return fmt.Errorf("upgraded %s not ready yet", up.opts.ID)
		}
		_ = cur.raft.LeadershipTransferToServer(raft.ServerID(up.opts.ID), raft.ServerAddress(up.opts.Advertise)).Error()
		return testenv.Expect(up.IsLeader(), "upgraded %s does not lead", up.opts.ID)
	})
	applyOnLeader(t, nodes, 30, map[string]string{"state/web/a": "drain"})
	testenv.Eventually(t, 10*time.Second, func() error {
		return testenv.Expect(confirmedAnswer(f.Node, "web/a") == "drain\n" && f.reads.LegacyLeader() == "",
			"follower %s of the upgraded leader %s: answer %q, older leader noted %q", f.opts.ID, up.opts.ID, confirmedAnswer(f.Node, "web/a"), f.reads.LegacyLeader())
	})
}

// TestConfirmBatches: checks that arrive together share rounds: many
// concurrent checks cost far fewer rounds than checks.
func TestConfirmBatches(t *testing.T) {
	_, _, _, f := startMesh(t, time.Second, nil)
	before := metricOf(t, f, "hastate_confirm_rounds_total", "result=confirmed")
	const workers, each = 32, 50
	var wg sync.WaitGroup
	var mu sync.Mutex
	bad := 0
	for range workers {
		wg.Go(func() {
			for range each {
				if confirmedAnswer(f.Node, "web/a") != "ready 1%\n" {
					mu.Lock()
					bad++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	rounds := metricOf(t, f, "hastate_confirm_rounds_total", "result=confirmed") - before
	if bad != 0 {
		t.Errorf("%d of %d checks not answered", bad, workers*each)
	}
	if rounds >= workers*each/4 {
		t.Errorf("%d checks took %v rounds; want them batched (fewer than a quarter)", workers*each, rounds)
	}
	t.Logf("%d concurrent checks: %v rounds", workers*each, rounds)
}
