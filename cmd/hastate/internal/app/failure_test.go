package app

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

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

// The leader's Consul health counts its watch, not only the probe: with a
// probe that reaches Consul but a watch that fails every read, the leader
// reports Consul unreachable (so --kv-failover-after hands over) and the
// cluster's view says the KV is not synced.
func TestLeaderHealthCountsTheWatch(t *testing.T) {
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	a := newApp(t, consul.Addr(), "a")
	// The watch's Consul refuses every listing, as Consul does for a
	// token without key_prefix read.
	denied := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		http.Error(rw, "Permission denied", http.StatusForbidden)
	}))
	t.Cleanup(denied.Close)
	watchClient, err := kvsync.NewClient(denied.URL)
	if err != nil {
		t.Fatal(err)
	}
	a.newWatcher = func() (*kvsync.Watcher, error) {
		return kvsync.New(kvsync.Options{Client: watchClient, Prefix: a.o.KVPrefix, Sink: a.node, BackoffMax: 100 * time.Millisecond})
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

// A Start that fails half-way stops what it started, in order, and leaves
// nothing bound or running (TestMain checks for goroutines): each step
// registered its stop. Stop after it is a no-op, twice.
func TestFailedStartStopsWhatItStarted(t *testing.T) {
	for _, busy := range []string{"http", "raft"} {
		t.Run(busy, func(t *testing.T) {
			taken, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer taken.Close()
			agent := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
			a := newApp(t, "127.0.0.1:1", "a", func(o *Options) {
				o.AgentAddr = agent
				if busy == "http" {
					o.HTTPAddr = taken.Addr().String()
				} else {
					o.RaftAddr, o.RaftAdvertise = taken.Addr().String(), taken.Addr().String()
				}
			})
			err = a.Start(context.Background())
			if err == nil {
				t.Fatalf("Start with the %s port taken succeeded", busy)
			}
			if busy == "http" && !strings.Contains(err.Error(), "--http-addr") {
				t.Errorf("Start = %v, want it to name --http-addr", err)
			}
			// The agent listener was bound before and is closed again.
			ln, err := net.Listen("tcp", agent)
			if err != nil {
				t.Fatalf("the agent port is still bound after the failed Start: %v", err)
			}
			ln.Close()
			for range 2 {
				if err := a.Stop(context.Background()); err != nil {
					t.Errorf("Stop after a failed Start = %v", err)
				}
			}
		})
	}
}
