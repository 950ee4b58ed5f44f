package cluster

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hastate/hastate/internal/testenv"
	"github.com/prometheus/client_golang/prometheus"
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
	ctx := context.Background()
	kv := map[string]string{}
	var l *testNode
	for i := range 50 {
		kv[fmt.Sprintf("state/web/s%02d", i)] = "drain"
		l = applyOnLeader(t, nodes, uint64(i+1), kv)
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
	testenv.Eventually(t, 10*time.Second, func() error {
		return testenv.Expect(logs.FilterMessageSnippet("not bootstrapping").Len() == 1, "the node with an empty data dir did not decide against bootstrapping: %v", logs.All())
	})
	testenv.Eventually(t, 15*time.Second, func() error {
		ok, d := r.Ready()
		return testenv.Expect(ok && answer(r.Node, "web/s49") == "drain\n", "rejoined %s not ready: %s %+v", o.ID, d, r.Info())
	})
	if got := r.Info().KVDigest; got != l.Info().KVDigest {
		t.Fatalf("rejoined %s serves kv_digest %.12s, the leader %.12s", o.ID, got, l.Info().KVDigest)
	}
	if logs.FilterMessage("raft bootstrapped").Len() != 0 {
		t.Fatalf("the node with an empty data dir bootstrapped: %v", logs.All())
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
	ctx := context.Background()
	applyOnLeader(t, nodes, 1, map[string]string{"state/web/a": "drain"})
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

// TestEmptyReplicasWaitForAPeerThatMayHoldTheCluster: all three stopped,
// two lose their disks and start while the third, which holds the
// cluster, is still down. They do not bootstrap (two are a quorum of
// --peers: they would form a second cluster); readiness and the metric
// name the peer they wait for. Once it starts, it leads them: one cluster,
// its state on all three.
func TestEmptyReplicasWaitForAPeerThatMayHoldTheCluster(t *testing.T) {
	nodes := startCluster(t, nil)
	testenv.Eventually(t, 10*time.Second, func() error { return testenv.Expect(leaderOf(nodes) != nil, "no leader") })
	ctx := context.Background()
	applyOnLeader(t, nodes, 1, map[string]string{"state/web/a": "drain"})
	for _, n := range nodes {
		testenv.Eventually(t, 5*time.Second, func() error { ok, d := n.Ready(); return testenv.Expect(ok, "%s not ready: %s", n.opts.ID, d) })
	}
	for _, n := range nodes {
		if err := n.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
	}
	holder := nodes[2]
	var empty []*testNode
	var logs []*observer.ObservedLogs
	for _, n := range nodes[:2] {
		o := n.opts
		o.DataDir = t.TempDir()
		core, l := observer.New(zap.InfoLevel)
		o.Logger = zap.New(core)
		logs = append(logs, l)
		empty = append(empty, startNode(t, o))
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		for _, n := range empty {
			_, d := n.Ready()
			if !strings.Contains(d, "waiting for "+holder.opts.ID+" unreachable") {
				return fmt.Errorf("%s readiness %q does not say it waits for %s", n.opts.ID, d, holder.opts.ID)
			}
		}
		return nil
	})
	testenv.Consistently(t, 3*time.Second, func() error {
		for i, n := range empty {
			if n.Info().Term != 0 || n.raft.LastIndex() != 0 || logs[i].FilterMessage("raft bootstrapped").Len() != 0 {
				return fmt.Errorf("%s bootstrapped while a peer that may hold the cluster was down: %+v", n.opts.ID, n.Info())
			}
		}
		return nil
	})
	if got := metricValue(t, empty[0], "hastate_raft_bootstrap_waiting"); got != 1 {
		t.Errorf("hastate_raft_bootstrap_waiting = %v, want 1 for peer %s", got, holder.opts.ID)
	}
	back := startNode(t, holder.opts)
	all := append(empty, back)
	testenv.Eventually(t, 20*time.Second, func() error {
		for _, n := range all {
			if ok, d := n.Ready(); !ok || answer(n.Node, "web/a") != "drain\n" {
				return fmt.Errorf("%s not serving the cluster's state: %s %+v", n.opts.ID, d, n.Info())
			}
		}
		return nil
	})
	l := leaderOf(all)
	for _, n := range all {
		if in := n.Info(); in.LeaderID != l.opts.ID || in.Term != l.Info().Term || len(in.Members) != 3 {
			t.Errorf("%s: leader %s term %d members %d; want one cluster (leader %s, term %d, 3 members)", n.opts.ID, in.LeaderID, in.Term, len(in.Members), l.opts.ID, l.Info().Term)
		}
	}
	for i, n := range empty {
		if logs[i].FilterMessage("raft bootstrapped").Len() != 0 {
			t.Errorf("%s bootstrapped", n.opts.ID)
		}
	}
}

// metricValue sums the samples of the named metric in the node's registry.
func metricValue(t *testing.T, n *testNode, name string) float64 {
	t.Helper()
	mfs, err := n.opts.Registerer.(*prometheus.Registry).Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetGauge().GetValue()
			}
		}
	}
	return sum
}
