package app

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/hastate/hastate/internal/testenv"
	"github.com/hastate/hastate/kvsync"
)

// A listener that stops while the replica runs is not silent: Failed
// reports it (cmd/hastate then exits non-zero and Kubernetes restarts the
// pod), while Stop's own closing of the listeners reports nothing.
func TestListenerStopIsReported(t *testing.T) {
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	a := startApp(t, consul.Addr(), "a")
	select {
	case err := <-a.Failed():
		t.Fatalf("Failed before anything broke: %v", err)
	default:
	}
	a.agentLn.Close() // what a broken socket looks like to Serve
	select {
	case err := <-a.Failed():
		if !strings.Contains(err.Error(), "agent-check listener stopped") {
			t.Errorf("Failed = %v, want it to name the agent-check listener", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the agent listener stopped and Failed said nothing")
	}

	b := startApp(t, consul.Addr(), "b")
	if err := b.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-b.Failed():
		t.Fatalf("Stop reported as a failure: %v", err)
	default:
	}
}

type failingKV struct{}

func (failingKV) List(string, *api.QueryOptions) (api.KVPairs, *api.QueryMeta, error) {
	return nil, nil, errors.New("403 (Permission denied)")
}

// The leader's Consul health counts its watch, not only the probe: with a
// probe that reaches Consul but a watch that fails every read, the leader
// reports Consul unreachable (so --kv-failover-after hands over) and the
// cluster's view says the KV is not synced.
func TestLeaderHealthCountsTheWatch(t *testing.T) {
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	a := newApp(t, consul.Addr(), "a")
	a.newWatcher = func() (*kvsync.Watcher, error) {
		return kvsync.New(kvsync.Options{KV: failingKV{}, Prefix: a.o.KVPrefix, Sink: a.node, BackoffMax: 100 * time.Millisecond})
	}
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Stop(context.Background()) })
	testenv.Eventually(t, 10*time.Second, func() error { return testenv.Expect(a.probe.Health().Reachable, "the probe never reached Consul") })
	testenv.Eventually(t, 10*time.Second, func() error {
		h := a.consulHealth()
		return testenv.Expect(!h.Reachable && !h.FailingSince.IsZero(), "the leader's health ignores a failing watch")
	})
	if v := a.node.KVView(); v.Reachable || !strings.Contains(v.Warning, "Consul not synced") {
		t.Errorf("KV view %+v, want unreachable with a warning", v)
	}
}

// A leader that cannot build its Consul watch does not sit on leadership:
// the duty's error makes it retry (alone) or hand over (with peers; see
// cluster's TestFailingLeaderDutyHandsOver), and the failure is counted.
func TestWatchThatCannotBeBuiltIsCounted(t *testing.T) {
	a := newApp(t, "127.0.0.1:1", "a")
	built := make(chan struct{}, 8)
	a.newWatcher = func() (*kvsync.Watcher, error) {
		built <- struct{}{}
		return kvsync.New(kvsync.Options{})
	}
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Stop(context.Background()) })
	select {
	case <-built:
	case <-time.After(10 * time.Second):
		t.Fatal("the leader never tried to build its watch")
	}
	testenv.Eventually(t, 5*time.Second, func() error {
		_, m := httpGet(t, a, "/-/metrics")
		return testenv.Expect(strings.Contains(m, "hastate_leader_duty_failures_total 1"), "the failed duty was not counted")
	})
}
