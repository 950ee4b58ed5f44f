package cluster

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/hastate/hastate/internal/testenv"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// TestLostDiskRejoinsWithoutBootstrapping: a follower restarted with an
// empty data dir (same ID, same peers) finds that its peers hold the
// cluster, does not bootstrap, is sent what it lost by the leader, and
// serves it; the leader keeps its term (no election was caused).
func TestLostDiskRejoinsWithoutBootstrapping(t *testing.T) {
	nodes := startCluster(t, nil)
	testenv.Eventually(t, 10*time.Second, func() error { return testenv.Expect(leaderOf(nodes) != nil, "no leader") })
	l := leaderOf(nodes)
	ctx := context.Background()
	kv := map[string]string{}
	for i := range 50 {
		kv[fmt.Sprintf("state/web/s%02d", i)] = "drain"
		if err := l.ApplyKV(ctx, uint64(i+1), kv); err != nil {
			t.Fatal(err)
		}
	}
	var f *testNode
	for _, n := range nodes {
		if n != l {
			f = n
		}
	}
	testenv.Eventually(t, 5*time.Second, func() error { ok, d := f.Ready(); return testenv.Expect(ok, "follower not ready: %s", d) })
	term := l.Info().Term
	if err := f.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	o := f.opts
	o.DataDir = t.TempDir() // the disk is lost
	core, logs := observer.New(zap.InfoLevel)
	o.Logger = zap.New(core)
	r := startNode(t, o)
	if logs.FilterMessageSnippet("not bootstrapping").Len() != 1 || logs.FilterMessage("raft bootstrapped").Len() != 0 {
		t.Fatalf("the node with an empty data dir did not decide against bootstrapping: %v", logs.All())
	}
	testenv.Eventually(t, 15*time.Second, func() error {
		ok, d := r.Ready()
		return testenv.Expect(ok && answer(r.Node, "web/s49") == "drain\n", "rejoined %s not ready: %s %+v", o.ID, d, r.Info())
	})
	if got := r.Info().KVDigest; got != l.Info().KVDigest {
		t.Fatalf("rejoined %s serves kv_digest %.12s, the leader %.12s", o.ID, got, l.Info().KVDigest)
	}
	if !l.IsLeader() || l.Info().Term != term {
		t.Fatalf("the leader changed (term %d, was %d): the rejoin caused an election", l.Info().Term, term)
	}
	if n := len(r.Info().Members); n != 3 {
		t.Fatalf("rejoined %s sees %d members, want 3 (the leader's configuration)", o.ID, n)
	}
}

// TestQuorumLostForGoodSurvivorLeadsTheEmptyReplicas: two of three nodes
// are gone with their disks. The survivor alone has no quorum and
// withholds. The two come back with empty data dirs (same IDs, same
// peers): they see the survivor's state, do not bootstrap, vote for it, and
// the cluster is back with the survivor's state on all three.
func TestQuorumLostForGoodSurvivorLeadsTheEmptyReplicas(t *testing.T) {
	nodes := startCluster(t, func(_ int, o *Options) { o.LeaderlessGrace = time.Second })
	testenv.Eventually(t, 10*time.Second, func() error { return testenv.Expect(leaderOf(nodes) != nil, "no leader") })
	l := leaderOf(nodes)
	ctx := context.Background()
	if err := l.ApplyKV(ctx, 1, map[string]string{"state/web/a": "drain"}); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		testenv.Eventually(t, 5*time.Second, func() error { ok, d := n.Ready(); return testenv.Expect(ok, "%s not ready: %s", n.opts.ID, d) })
	}
	survivor := nodes[0]
	for _, n := range nodes[1:] {
		if err := n.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		return testenv.Expect(survivor.Serving() == nil, "the survivor without quorum still answers")
	})
	var back []*testNode
	for _, n := range nodes[1:] {
		o := n.opts
		o.DataDir = t.TempDir()
		back = append(back, startNode(t, o))
	}
	all := append([]*testNode{survivor}, back...)
	testenv.Eventually(t, 20*time.Second, func() error {
		for _, n := range all {
			if ok, d := n.Ready(); !ok || answer(n.Node, "web/a") != "drain\n" {
				return fmt.Errorf("%s not serving: %s %+v", n.opts.ID, d, n.Info())
			}
		}
		return nil
	})
	t.Logf("recovered: leader %s", leaderOf(all).opts.ID)
}
