package cluster

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/internal/testenv"
)

// verdicts is a settable mirror verdict per node.
type verdicts struct {
	mu sync.Mutex
	v  []api.MirrorVerdict
}

func (vs *verdicts) health(i int) func() ConsulHealth {
	return func() ConsulHealth {
		vs.mu.Lock()
		defer vs.mu.Unlock()
		v := vs.v[i]
		return ConsulHealth{Reachable: true, Checked: time.Now(), Verdict: v}
	}
}

func (vs *verdicts) set(i int, v api.MirrorVerdict) {
	vs.mu.Lock()
	vs.v[i] = v
	vs.mu.Unlock()
}

// A leader whose Consul is another cluster hands leadership at once (not
// after KVFailoverAfter, an hour here) to the follower that can mirror,
// never to one that cannot; the verdicts are reported over the raft port.
func TestLeaderOfAnotherConsulHandsOverToAFollowerThatMatches(t *testing.T) {
	ok := api.MirrorVerdict{Reason: api.MirrorOK}
	vs := &verdicts{v: []api.MirrorVerdict{ok, ok, ok}}
	nodes := startCluster(t, func(i int, o *Options) {
		o.ConsulHealth = vs.health(i)
		o.KVFailoverAfter = time.Hour
	})
	old := applyOnLeader(t, nodes, 5, map[string]string{"state/web/s1": "drain"})
	var good *testNode
	for i, n := range nodes {
		switch {
		case n == old:
			vs.set(i, api.MirrorVerdict{Reason: api.MirrorOtherCluster, Detail: "cluster ID b, recorded a"})
		case good == nil:
			good = n
		default:
			vs.set(i, api.MirrorVerdict{Reason: api.MirrorOtherPrefix, Detail: `prefix "x/", recorded "hastate/"`})
		}
	}
	start := time.Now()
	testenv.Eventually(t, 10*time.Second, func() error {
		l := leaderOf(nodes)
		return testenv.Expect(l == good, "leader is %v, want %s, the one follower that can mirror", l, good.opts.ID)
	})
	t.Logf("leadership moved to the matching follower %s after %s", good.opts.ID, time.Since(start).Round(time.Millisecond))
	if got := old.MirrorVerdict(); got.Reason != api.MirrorOtherCluster {
		t.Errorf("old leader's verdict %v, want other_cluster", got)
	}
	info := good.Info()
	if info.Mirror == nil || !info.Mirror.CanMirror() {
		t.Errorf("/v1/cluster mirror of the new leader: %+v, want ok", info.Mirror)
	}
	for _, m := range info.Members {
		if m.Status == nil || m.Status.Mirror == nil {
			t.Errorf("member %s reports no mirror verdict: %+v", m.ID, m.Status)
			continue
		}
		if want := m.ID == good.opts.ID; m.Status.Mirror.CanMirror() != want {
			t.Errorf("member %s reports %v", m.ID, *m.Status.Mirror)
		}
	}
	testenv.Eventually(t, 5*time.Second, func() error {
		ready, d := old.Ready()
		return testenv.Expect(ready && strings.Contains(d, "cannot mirror Consul") && strings.Contains(d, "other_cluster"),
			"readiness of the replica of another Consul: %v %q, want ready (it serves raft's state) naming other_cluster", ready, d)
	})

	// No follower can mirror: the leader keeps leadership.
	for i := range nodes {
		vs.set(i, api.MirrorVerdict{Reason: api.MirrorOtherCluster})
	}
	testenv.Consistently(t, 3*time.Second, func() error {
		return testenv.Expect(leaderOf(nodes) == good, "leadership moved although no follower can mirror")
	})
}

// A release before 0.15.0 reports only consul_reachable.
func TestPeerStatusVerdictOfAnOlderRelease(t *testing.T) {
	if v := (api.PeerStatus{ConsulReachable: true}).Verdict(); !v.CanMirror() {
		t.Errorf("reachable old release: %v, want ok", v)
	}
	if v := (api.PeerStatus{}).Verdict(); v.Reason != api.MirrorConsulUnreachable {
		t.Errorf("unreachable old release: %v, want consul_unreachable", v)
	}
}
