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
	digest := waitMirrorsConsul(t, 10*time.Second, consul, hs...)

	var (
		mu              sync.Mutex
		checked, silent int
		wrong           []string
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, h := range hs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(5 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				name := names[rand.IntN(len(names))]
				kind, ans, err := probeAgent(h.AgentAddr, name)
				mu.Lock()
				switch {
				case kind == probeAnswered && ans == "drain":
					checked++
				case kind == probeAnswered:
					wrong = append(wrong, fmt.Sprintf("%s %s: %q", h.NodeID, name, ans))
				default:
					silent++
					if kind != probeUnanswered {
						wrong = append(wrong, fmt.Sprintf("%s %s: %v %v", h.NodeID, name, kind, err))
					}
				}
				mu.Unlock()
			}
		}()
	}
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
	close(stop)
	wg.Wait()
	if got := waitMirrorsConsul(t, 10*time.Second, consul, hs...); got != digest {
		t.Errorf("kv_digest changed across the restarts: %.12s, was %.12s", got, digest)
	}
	if len(wrong) > 0 {
		t.Errorf("%d checks were answered something else than drain (first few): %v", len(wrong), wrong[:min(len(wrong), 10)])
	}
	if checked == 0 {
		t.Fatal("no check was answered")
	}
	t.Logf("over %d SIGKILL+restarts of a one-server Consul: %d checks answered drain, %d unanswered, %d anything else", restarts, checked, silent, len(wrong))
}
