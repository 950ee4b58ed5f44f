package test

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/hastate/hastate/internal/testenv"
)

// TestE2EConsulRestartsNeverUndrain: a one-server Consul with data on disk
// is SIGKILLed and restarted repeatedly while every key is drained. Right
// after a restart Consul's default read mode can answer with older data
// (an empty prefix at a low index); the leader reads in consistent mode, so
// it never applies that. Checks against all three replicas, all along: an
// answer of a replica that holds state is never anything but drain (no
// answer at all is allowed: HAProxy keeps its state).
func TestE2EConsulRestartsNeverUndrain(t *testing.T) {
	const (
		restarts = 5
		servers  = 40
	)
	consul := testenv.StartConsul(t, testenv.ConsulOptions{Persistent: true})
	hs, names, digest := startAllDrained(t, consul, servers)
	checks := startDrainChecks(hs, names)
	for i := range restarts {
		consul.Kill()
		killed := time.Now()
		// Down for a moment: the leader's watch fails and backs off.
		testenv.Eventually(t, 10*time.Second, func() error {
			return testenv.Expect(hs[0].Metric(t, "hastate_kv_reachable") == 0, "%s did not notice Consul down", hs[0].NodeID)
		})
		noticed := time.Now()
		consul.Restart(t)
		up := time.Now()
		// Back: the leader's watch reads again; the state is unchanged.
		testenv.Eventually(t, 30*time.Second, func() error {
			for _, h := range hs {
				if h.Metric(t, "hastate_kv_reachable") != 1 {
					return fmt.Errorf("%s does not see Consul back", h.NodeID)
				}
			}
			return nil
		})
		t.Logf("restart %d: noticed down %s after the kill; Consul answering %s later; replicas see it back %s later",
			i+1, noticed.Sub(killed).Round(time.Millisecond), up.Sub(noticed).Round(time.Millisecond), time.Since(up).Round(time.Millisecond))
	}
	res := checks.stop()
	if got := waitMirrorsConsul(t, 10*time.Second, consul, hs...); got != digest {
		t.Errorf("kv_digest changed across the restarts: %.12s, was %.12s", got, digest)
	}
	res.check(t)
	t.Logf("over %d SIGKILL+restarts of a one-server Consul: %d checks answered drain, %d unanswered, %d anything else", restarts, res.checked, res.silent, len(res.wrong))
}

// startAllDrained writes servers keys, all drain, starts three replicas on
// consul and waits until they serve them; it returns the replicas, the
// servers and the mirrored digest.
func startAllDrained(t *testing.T, consul *testenv.Consul, servers int) ([]*Hastate, []string, string) {
	t.Helper()
	var ops api.KVTxnOps
	var names []string
	for i := range servers {
		name := fmt.Sprintf("be_cr%d/web%02d", i%4, i)
		names = append(names, name)
		ops = append(ops, &api.KVTxnOp{Verb: api.KVSet, Key: stateKey(name), Value: []byte("drain")})
	}
	if ok, resp, _, err := consul.Client(t).KV().Txn(ops, nil); err != nil || !ok {
		t.Fatalf("consul txn: %v %+v", err, resp)
	}
	hs := StartCluster(t, 3, HastateOptions{ConsulAddr: consul.Addr()})
	for _, h := range hs {
		h.WaitAnswer(t, names[servers-1], "drain")
	}
	return hs, names, waitMirrorsConsul(t, 10*time.Second, consul, hs...)
}

// drainChecks probe every replica every 5ms for a random one of names;
// every answer must be drain.
type drainChecks struct {
	stopc chan struct{}
	wg    sync.WaitGroup
	mu    sync.Mutex
	res   drainResult
}

type drainResult struct {
	checked, silent int
	wrong           []string
}

func startDrainChecks(hs []*Hastate, names []string) *drainChecks {
	d := &drainChecks{stopc: make(chan struct{})}
	for _, h := range hs {
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			tickUntil(d.stopc, 5*time.Millisecond, func() {
				name := names[rand.IntN(len(names))]
				kind, ans, err := probeAgent(h.AgentAddr, name)
				d.mu.Lock()
				defer d.mu.Unlock()
				switch {
				case kind == probeAnswered && ans == "drain":
					d.res.checked++
				case kind == probeAnswered:
					d.res.wrong = append(d.res.wrong, fmt.Sprintf("%s %s: %q", h.NodeID, name, ans))
				case kind == probeUnanswered:
					d.res.silent++ // withheld: HAProxy keeps its state
				default:
					d.res.wrong = append(d.res.wrong, fmt.Sprintf("%s %s: %v %v", h.NodeID, name, kind, err))
				}
			})
		}()
	}
	return d
}

func (d *drainChecks) stop() drainResult {
	close(d.stopc)
	d.wg.Wait()
	return d.res
}

func (r drainResult) check(t *testing.T) {
	t.Helper()
	if len(r.wrong) > 0 {
		t.Errorf("%d checks were answered something else than drain (first few): %v", len(r.wrong), r.wrong[:min(len(r.wrong), 10)])
	}
	if r.checked == 0 {
		t.Error("no check was answered")
	}
}

// TestE2EConsulLeaderKilled: a three-server Consul cluster on loopback
// whose leader is SIGKILLed and restarted three times while every key is
// drained; the replicas read through one server (a follower at the start).
// Around each leader change Consul's default mode could answer from a new
// leader that has not applied its log yet; every answer stays drain.
func TestE2EConsulLeaderKilled(t *testing.T) {
	const (
		kills   = 3
		servers = 40
	)
	cc := testenv.StartConsulCluster(t, 3)
	leader := cc.Leader(t, 30*time.Second)
	via := cc.Servers[(leader+1)%len(cc.Servers)]
	hs, names, digest := startAllDrained(t, via, servers)
	checks := startDrainChecks(hs, names)
	for i := range kills {
		l := cc.Leader(t, 30*time.Second)
		cc.Servers[l].Kill()
		killed := time.Now()
		next := cc.Leader(t, 30*time.Second)
		elected := time.Since(killed)
		cc.Servers[l].Restart(t)
		// The replicas read Consul again (the leader may be the server
		// they read through: then they were without Consul meanwhile).
		testenv.Eventually(t, 30*time.Second, func() error {
			for _, h := range hs {
				if h.Metric(t, "hastate_kv_reachable") != 1 {
					return fmt.Errorf("%s does not see Consul", h.NodeID)
				}
			}
			return nil
		})
		t.Logf("kill %d: Consul leader consul-%d killed; consul-%d elected after %s; consul-%d back", i+1, l, next, elected.Round(time.Millisecond), l)
	}
	res := checks.stop()
	if got := waitMirrorsConsul(t, 10*time.Second, via, hs...); got != digest {
		t.Errorf("kv_digest changed across the Consul leader changes: %.12s, was %.12s", got, digest)
	}
	res.check(t)
	t.Logf("over %d kills of the Consul leader (three servers): %d checks answered drain, %d unanswered, %d anything else", kills, res.checked, res.silent, len(res.wrong))
}
