package cluster

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/hastate/hastate/internal/testenv"
)

// TestFiveVotersAndANonVoter: a cluster of five voters and one non-voter,
// real raft over TCP. Every member answers confirmed, the non-voter too
// (its read-index request is no acknowledgement: the leader answers it
// from a round of its own), and so does a follower of five voters (its
// request and the leader's vote are no quorum either); the leader's round
// asks what a quorum needs (two voters besides itself), not all four.
// With two voters stopped the three left still answer; with a third
// stopped no quorum is left and nobody answers.
func TestFiveVotersAndANonVoter(t *testing.T) {
	nodes := startClusterOf(t, 5, nil)
	testenv.Eventually(t, 15*time.Second, func() error { return testenv.Expect(leaderOf(nodes) != nil, "no leader of five") })
	// The non-voter: a node with no raft state whose --peers name the
	// voters; it finds that they hold the cluster, does not bootstrap,
	// and waits to be added.
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	peers := append(append([]Peer(nil), nodes[0].opts.Peers...), Peer{ID: "nv", Address: addr})
	nv := startNode(t, Options{ID: "nv", BindAddr: addr, Advertise: addr, Peers: peers, DataDir: t.TempDir()})
	testenv.Eventually(t, 10*time.Second, func() error {
		l := leaderOf(nodes)
		if l == nil {
			return fmt.Errorf("no leader")
		}
		return l.raft.AddNonvoter("nv", raft.ServerAddress(addr), 0, 5*time.Second).Error()
	})
	all := append(append([]*testNode(nil), nodes...), nv)
	l := applyOnLeader(t, nodes, 1, map[string]string{"state/web/a": "drain"})
	for _, n := range all {
		testenv.Eventually(t, 15*time.Second, func() error {
			return testenv.Expect(confirmedAnswer(n.Node, "web/a") == "drain\n", "%s does not answer the drain confirmed: %q", n.opts.ID, confirmedAnswer(n.Node, "web/a"))
		})
	}
	if nv.raft.State() != raft.Follower {
		t.Fatalf("the non-voter is %s", nv.raft.State())
	}

	// The leader's rounds: what a quorum needs, two of its four peers.
	reqs := func() float64 {
		sum := 0.0
		for _, r := range []string{"acked", "failed", "not_sent"} {
			sum += metricOf(t, l, "hastate_confirm_acks_total", "result="+r)
		}
		return sum
	}
	rounds := func() float64 { return metricOf(t, l, "hastate_confirm_rounds_total", "result=confirmed") }
	r0, q0 := rounds(), reqs()
	for range 50 {
		if confirmedAnswer(l.Node, "web/a") != "drain\n" {
			t.Fatal("the leader stopped answering")
		}
	}
	r1, q1 := rounds(), reqs()
	perRound := (q1 - q0) / (r1 - r0)
	t.Logf("leader of five: %.0f ack requests for %.0f rounds (%.2f per round)", q1-q0, r1-r0, perRound)
	if r1 == r0 || perRound < 2 || perRound > 3 {
		t.Errorf("%.2f ack requests per round of a leader of five voters; want 2 (what a quorum needs), a few more when a round waits past the hedge", perRound)
	}

	// Two voters stopped (not the leader): three of five are a quorum.
	var stopped []*testNode
	for _, n := range nodes {
		if n != l && len(stopped) < 2 {
			if err := n.Shutdown(context.Background()); err != nil {
				t.Fatal(err)
			}
			stopped = append(stopped, n)
		}
	}
	l = applyOnLeader(t, nodes, 2, map[string]string{"state/web/a": "maint"})
	for _, n := range all {
		if n == stopped[0] || n == stopped[1] {
			continue
		}
		testenv.Eventually(t, 15*time.Second, func() error {
			return testenv.Expect(confirmedAnswer(n.Node, "web/a") == "maint\n", "%s with two voters stopped: %q", n.opts.ID, confirmedAnswer(n.Node, "web/a"))
		})
	}
	// A third stopped: two voters of five, no quorum; nobody answers
	// (the non-voter neither: its leader can no longer confirm).
	for _, n := range nodes {
		if n != stopped[0] && n != stopped[1] && n != l {
			if err := n.Shutdown(context.Background()); err != nil {
				t.Fatal(err)
			}
			break
		}
	}
	for _, n := range all {
		if n.raft.State() == raft.Shutdown {
			continue
		}
		testenv.Eventually(t, 15*time.Second, func() error {
			return testenv.Expect(confirmedAnswer(n.Node, "web/a") == "", "%s answers %q without a quorum of voters", n.opts.ID, confirmedAnswer(n.Node, "web/a"))
		})
	}
}
