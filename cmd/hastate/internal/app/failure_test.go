package app

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
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

// "Synced" means the watch itself answered: a watch stuck in a blocking
// call is not made fresh by a probe that succeeds meanwhile (it hid a
// stuck watch for up to about 74s).
func TestSyncedAtIsTheWatchsOwnAnswer(t *testing.T) {
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	a := newApp(t, consul.Addr(), "a")
	var answered atomic.Int64
	stuck := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("index") != "" {
			<-r.Context().Done() // the blocking call never returns
			return
		}
		rw.Header().Set("X-Consul-Index", "7")
		rw.Header().Set("X-Consul-KnownLeader", "true")
		rw.Header().Set("X-Consul-LastContact", "0")
		switch q := r.URL.Query(); {
		case q.Has("keys"): // the leader's proof that its token may read the prefix
			_, _ = rw.Write([]byte(`["hastate/state/"]`))
		case q.Has("recurse"): // the watch's listing
			answered.Add(1)
			_, _ = rw.Write([]byte(`[{"Key":"hastate/state/web/s1","Value":"ZHJhaW4="}]`))
		default: // the proof's direct reads: absent, as Consul answers
			rw.WriteHeader(http.StatusNotFound)
		}
	}))
	t.Cleanup(stuck.Close)
	watchClient, err := kvsync.NewClient(stuck.URL)
	if err != nil {
		t.Fatal(err)
	}
	a.newWatcher = func() (*kvsync.Watcher, error) {
		return kvsync.New(kvsync.Options{Client: watchClient, Prefix: a.o.KVPrefix, Sink: a.node, WaitTime: time.Minute})
	}
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Stop(context.Background()) })
	var synced time.Time
	testenv.Eventually(t, 10*time.Second, func() error {
		synced = a.consulHealth().SyncedAt
		return testenv.Expect(!synced.IsZero() && answered.Load() == 1, "the watch's first read was not applied (synced %s, %d reads answered)", synced, answered.Load())
	})
	before := a.probe.Health().LastOK
	testenv.Eventually(t, 10*time.Second, func() error {
		return testenv.Expect(a.probe.Health().LastOK.After(before) && a.probe.Health().LastOK.After(synced), "the probe did not succeed again")
	})
	if h := a.consulHealth(); !h.SyncedAt.Equal(synced) {
		t.Errorf("SyncedAt moved from %s to %s while the watch was stuck (the probe's %s)", synced, h.SyncedAt, a.probe.Health().LastOK)
	}
}
