package cluster

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/cluster/leader"

	"github.com/hashicorp/raft"
	"github.com/hastate/hastate/internal/testenv"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// syncHealth is a node's ConsulHealth with a settable sync time.
type syncHealth struct {
	mu     sync.Mutex
	h      leader.ConsulHealth
	synced bool
}

func (s *syncHealth) get() leader.ConsulHealth {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.h
	if s.synced && h.Reachable {
		h.SyncedAt = time.Now() // in sync right now
	}
	return h
}

func (s *syncHealth) set(reachable bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if reachable {
		s.h = leader.ConsulHealth{Reachable: true, Checked: time.Now()}
	} else {
		s.h = leader.ConsulHealth{FailingSince: time.Now(), Checked: time.Now(), SyncedAt: time.Now()}
	}
	s.synced = true
}

// TestKVViewIsTheSameOnEveryReplica: the leader's sync report reaches the
// followers, so every replica says "Consul not synced" and exports the same
// hastate_kv_reachable, within seconds of the leader losing Consul.
func TestKVViewIsTheSameOnEveryReplica(t *testing.T) {
	hs := []*syncHealth{{}, {}, {}}
	nodes := startCluster(t, func(i int, o *Options) {
		o.ConsulHealth = hs[i].get
		o.KVFailoverAfter = -1 // this test is about the view, not failover
	})
	testenv.Eventually(t, 10*time.Second, func() error { return testenv.Expect(leaderOf(nodes) != nil, "no leader") })
	for _, n := range nodes {
		if v := n.KVView(); v.Synced || !strings.Contains(v.Warning, "not synced") {
			t.Errorf("%s before any sync: %+v, want a warning", n.opts.ID, v)
		}
	}
	for _, h := range hs {
		h.set(true)
	}
	everywhere := func(cond func(api.KVView) bool) func() bool {
		return func() bool {
			for _, n := range nodes {
				if !cond(n.KVView()) {
					return false
				}
			}
			return true
		}
	}
	l := applyOnLeader(t, nodes, 1, map[string]string{})
	testenv.Eventually(t, 5*time.Second, func() error {
		return testenv.Expect(everywhere(func(v api.KVView) bool {
			return v.Known && v.Reachable && v.Synced && v.Warning == "" && v.SyncAge < 3*time.Second && v.LeaderID == l.opts.ID
		})(), "the replicas never agreed that Consul is in sync")
	})

	for i, n := range nodes {
		if n == l {
			hs[i].set(false)
		}
	}
	lost := time.Now()
	testenv.Eventually(t, 5*time.Second, func() error {
		return testenv.Expect(everywhere(func(v api.KVView) bool {
			return !v.Reachable && strings.Contains(v.Warning, "Consul not synced for")
		})(), "the replicas never said Consul is lost")
	})
	t.Logf("Consul loss seen on every replica after %s", time.Since(lost).Round(time.Millisecond))
	for _, n := range nodes {
		if got := testutil.ToFloat64(reachableGauge{n.Node}); got != 0 {
			t.Errorf("%s: hastate_kv_reachable %v, want 0", n.opts.ID, got)
		}
		if ok, detail := n.Ready(); !ok || !strings.Contains(detail, "Consul not synced for") {
			t.Errorf("%s: readiness %v %q, want ready with the warning", n.opts.ID, ok, detail)
		}
	}
}

// reachableGauge collects only hastate_kv_reachable of a node.
type reachableGauge struct{ n *Node }

func (r reachableGauge) Describe(ch chan<- *prometheus.Desc) { ch <- r.n.metrics.kvReachable }
func (r reachableGauge) Collect(ch chan<- prometheus.Metric) {
	all := make(chan prometheus.Metric, 64)
	go func() { r.n.metrics.Collect(all); close(all) }()
	for m := range all {
		if m.Desc() == r.n.metrics.kvReachable {
			ch <- m
		}
	}
}

// TestFailingLeaderDutyHandsOver: a leader whose duty fails (it cannot
// build its Consul watch) hands leadership to a replica whose duty runs.
func TestFailingLeaderDutyHandsOver(t *testing.T) {
	nodes := startCluster(t, func(i int, o *Options) {
		o.LeaderDuty = func(ctx context.Context) error {
			if i != 2 {
				return errors.New("cannot build the Consul watch")
			}
			<-ctx.Done()
			return nil
		}
	})
	testenv.Eventually(t, 10*time.Second, func() error { return testenv.Expect(leaderOf(nodes) != nil, "no leader") })
	if l := leaderOf(nodes); l == nodes[2] {
		// Elected first by chance: make a failing node lead.
		if err := l.raft.LeadershipTransferToServer("n0", raft.ServerAddress(nodes[0].opts.Advertise)).Error(); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 30*time.Second, func() error {
		l := leaderOf(nodes)
		return testenv.Expect(l != nil && l.opts.ID == "n2", "leadership never reached the node whose duty works")
	})
	failures := 0.0
	for _, n := range nodes[:2] {
		failures += metricOf(t, n, "hastate_leader_duty_failures_total", "")
	}
	if failures < 1 {
		t.Errorf("no failed duty counted (hastate_leader_duty_failures_total)")
	}
	time.Sleep(time.Second) // and it stays there
	if l := leaderOf(nodes); l != nodes[2] {
		t.Errorf("leadership left n2 again: %v", l)
	}
}
