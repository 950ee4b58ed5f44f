package cluster

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hastate/hastate/cluster/leader"
	"github.com/hastate/hastate/cluster/raftport"
	"github.com/hastate/hastate/internal/testenv"
)

type health struct {
	mu    sync.Mutex
	since time.Time // zero: reachable
}

func (h *health) get() leader.ConsulHealth {
	h.mu.Lock()
	defer h.mu.Unlock()
	return leader.ConsulHealth{Reachable: h.since.IsZero(), FailingSince: h.since, Checked: time.Now()}
}

func (h *health) fail() {
	h.mu.Lock()
	h.since = time.Now()
	h.mu.Unlock()
}

func startCluster(t *testing.T, mod func(i int, o *Options)) []*testNode {
	t.Helper()
	return startClusterOf(t, 3, mod)
}

// startClusterOf is startCluster with k voters.
func startClusterOf(t *testing.T, k int, mod func(i int, o *Options)) []*testNode {
	t.Helper()
	var peers []Peer
	for i := range k {
		peers = append(peers, Peer{ID: fmt.Sprintf("n%d", i), Address: fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))})
	}
	nodes := make([]*testNode, k)
	for i := range nodes {
		o := Options{ID: peers[i].ID, BindAddr: peers[i].Address, Advertise: peers[i].Address, Peers: peers, DataDir: t.TempDir()}
		if mod != nil {
			mod(i, &o)
		}
		nodes[i] = startNode(t, o)
	}
	return nodes
}

func leaderOf(nodes []*testNode) *testNode {
	for _, n := range nodes {
		if n.IsLeader() {
			return n
		}
	}
	return nil
}

// applyOnLeader applies kv through whichever of nodes leads now, and again
// through the next leader when raft takes leadership away meanwhile (an
// election on a loaded machine: ErrNotLeader, which also wraps
// raft.ErrLeadershipLost). Retrying is safe: the entry sets the same keys
// to the same values, so one that committed although leadership was lost
// makes the retry an empty change (or a repeat of it). Any other error
// fails the test at once, and so does no leader committing within 10s.
// It returns the leader that committed kv; use it, not leaderOf, for what
// the test checks on "the leader" afterwards.
func applyOnLeader(t *testing.T, nodes []*testNode, index uint64, kv map[string]string) *testNode {
	t.Helper()
	var l *testNode
	testenv.Eventually(t, 10*time.Second, func() error {
		if l = leaderOf(nodes); l == nil {
			return errors.New("no leader")
		}
		err := l.ApplyKV(context.Background(), index, kv)
		if err != nil && !errors.Is(err, ErrNotLeader) {
			t.Fatalf("apply kv index %d on leader %s: %v", index, l.opts.ID, err)
		}
		return err
	})
	return l
}

// othersThan is nodes without n.
func othersThan(nodes []*testNode, n *testNode) []*testNode {
	var rest []*testNode
	for _, m := range nodes {
		if m != n {
			rest = append(rest, m)
		}
	}
	return rest
}

func TestLeaderWithoutConsulHandsOverToAFollowerWithConsul(t *testing.T) {
	hs := []*health{{}, {}, {}}
	nodes := startCluster(t, func(i int, o *Options) {
		o.ConsulHealth = hs[i].get
		o.KVFailoverAfter = 500 * time.Millisecond
	})
	testenv.Eventually(t, 10*time.Second, func() error { return testenv.Expect(leaderOf(nodes) != nil, "no leader") })
	old := leaderOf(nodes)
	for i, n := range nodes {
		if n == old {
			hs[i].fail()
		}
	}
	start := time.Now()
	testenv.Eventually(t, 10*time.Second, func() error {
		l := leaderOf(nodes)
		return testenv.Expect(l != nil && l != old, "leadership stayed on the leader that lost Consul")
	})
	t.Logf("leadership moved off the leader without Consul %s after failover-after elapsed", time.Since(start)-500*time.Millisecond)

	// The members report each other's Consul reachability.
	info := leaderOf(nodes).Info()
	seen := 0
	for _, m := range info.Members {
		if m.Status != nil {
			seen++
			if (m.ID == old.opts.ID) == m.Status.ConsulReachable {
				t.Errorf("member %s reports consul_reachable=%v", m.ID, m.Status.ConsulReachable)
			}
		}
	}
	if seen != 3 {
		t.Errorf("statuses from %d members, want 3: %+v", seen, info.Members)
	}
}

func TestNoHandOverWhenNoFollowerReachesConsul(t *testing.T) {
	hs := []*health{{}, {}, {}}
	for _, h := range hs {
		h.fail()
	}
	nodes := startCluster(t, func(i int, o *Options) {
		o.ConsulHealth = hs[i].get
		o.KVFailoverAfter = 200 * time.Millisecond
	})
	testenv.Eventually(t, 10*time.Second, func() error { return testenv.Expect(leaderOf(nodes) != nil, "no leader") })
	l := leaderOf(nodes)
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		if !l.IsLeader() {
			t.Fatal("leadership moved although no follower can reach Consul")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// writeCerts makes a CA and a leaf for 127.0.0.1/localhost signed by it.
func writeCerts(t *testing.T, dir string) (cert, key, ca string) {
	t.Helper()
	return testenv.WriteRaftTLS(t, dir)
}

func TestMutualTLSOnTheRaftPort(t *testing.T) {
	cert, key, ca := writeCerts(t, t.TempDir())
	conf, err := raftport.MutualTLS(cert, key, ca)
	if err != nil {
		t.Fatal(err)
	}
	nodes := startCluster(t, func(_ int, o *Options) { o.TLS = conf })
	testenv.Eventually(t, 10*time.Second, func() error { return testenv.Expect(leaderOf(nodes) != nil, "no leader over TLS") })
	applyOnLeader(t, nodes, 1, map[string]string{"state/a/b": "drain"})
	for _, n := range nodes {
		testenv.Eventually(t, 5*time.Second, func() error {
			return testenv.Expect(answer(n.Node, "a/b") == "drain\n", "%s did not replicate over TLS", n.opts.ID)
		})
	}

	// A client without a certificate from the CA is refused.
	other, otherKey, otherCA := writeCerts(t, t.TempDir())
	bad, err := raftport.MutualTLS(other, otherKey, otherCA)
	if err != nil {
		t.Fatal(err)
	}
	c, err := tls.Dial("tcp", nodes[0].opts.BindAddr, bad)
	if err == nil {
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		_, err = c.Write([]byte{raftport.KindStatus})
		if err == nil {
			_, err = c.Read(make([]byte, 1))
		}
		c.Close()
	}
	if err == nil {
		t.Fatal("a peer with a certificate from another CA was served")
	}

	if _, err := raftport.MutualTLS(cert, "", ca); err == nil {
		t.Fatal("partial TLS flags accepted")
	}
}

// HandOver moves leadership away but keeps the node a member: it goes on
// applying entries and answering, which is what a replica draining before
// shutdown needs.
func TestHandOverKeepsTheNodeFollowing(t *testing.T) {
	nodes := startCluster(t, nil)
	testenv.Eventually(t, 10*time.Second, func() error { return testenv.Expect(leaderOf(nodes) != nil, "no leader") })
	ctx := context.Background()
	old := applyOnLeader(t, nodes, 1, map[string]string{"state/web/a": "drain"})
	old.HandOver(ctx)
	if old.IsLeader() {
		t.Fatal("still the leader after HandOver")
	}
	testenv.Eventually(t, 2*time.Second, func() error {
		l := leaderOf(nodes)
		return testenv.Expect(l != nil && l != old, "no other node leads after HandOver")
	})
	applyOnLeader(t, nodes, 2, map[string]string{"state/web/a": "maint"})
	testenv.Eventually(t, 5*time.Second, func() error {
		return testenv.Expect(answer(old.Node, "web/a") == "maint\n", "the node that handed over stopped following")
	})
	// A follower has nothing to hand over.
	old.HandOver(ctx)
}
