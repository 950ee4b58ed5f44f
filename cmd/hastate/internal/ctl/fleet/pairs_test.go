package fleet_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/fleet"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/internal/ctltest"
)

// Issue 43: with a replica down, wait decides "seen by a live replica" per
// (server, HAProxy) pair. HAProxy 10.0.0.7 polls canary_web/web-2 on the
// live replica n1, but its checks of web-1 (one connection each, spread by
// the load balancer) all went to n3, which does not answer: what it was
// told for web-1 only n3 may know. The HAProxy is seen by a live replica,
// so the per-HAProxy rule passes; wait must not, and says why (cannot
// confirm). Once n1 sees the pair, wait is done.
func TestWaitDecidesPerServerAndHAProxyPair(t *testing.T) {
	now := time.Now()
	answers := []api.ReplicaAnswer{{ID: "n1", Answered: true}, {ID: "n2", Answered: true}, {ID: "n3", Error: "connection refused"}}
	poll := func(haproxy, server, answer string) api.Poll {
		return api.Poll{HAProxy: haproxy, Backend: "canary_web", Server: server, Answer: answer, Replica: "n1", LastAsked: now, Count: 40}
	}
	for _, tt := range []struct {
		name  string
		polls []api.Poll
		lag   string // "": done
		// seen7: which replicas the cluster's record says saw 10.0.0.7
		// (nil: n1, a live one).
		seen7 map[string]time.Time
	}{
		{"the pair's polls all went to the dead replica", []api.Poll{
			poll("10.0.0.6", "web-1", "ready 100%"), poll("10.0.0.6", "web-2", "ready 50%"),
			poll("10.0.0.7", "web-2", "ready 50%"),
		}, "HAProxy 10.0.0.7 for canary_web/web-1", nil},
		{"the pair moved to a live replica", []api.Poll{
			poll("10.0.0.6", "web-1", "ready 100%"), poll("10.0.0.6", "web-2", "ready 50%"),
			poll("10.0.0.7", "web-2", "ready 50%"), poll("10.0.0.7", "web-1", "ready 100%"),
		}, "", nil},
		// The live replicas do not cover the fleet: 10.0.0.7 was seen
		// only by n3. That is "cannot confirm" (exit 4), not "not done"
		// (exit 1): a pipeline must tell a broken view from a lagging
		// HAProxy.
		{"an HAProxy seen by no live replica", []api.Poll{
			poll("10.0.0.6", "web-1", "ready 100%"), poll("10.0.0.6", "web-2", "ready 50%"),
		}, "HAProxy 10.0.0.7 (last poll", map[string]time.Time{"n3": now}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			seen7 := tt.seen7
			if seen7 == nil {
				seen7 = map[string]time.Time{"n1": now}
			}
			replica := pairsReplica(t, answers, tt.polls, func(w http.ResponseWriter, _ *http.Request) {
				_ = json.NewEncoder(w).Encode(api.HAProxiesView{Recorded: true, Replicas: answers, HAProxies: []api.HAProxyNode{
					{HAProxy: "10.0.0.6", LastSeen: now, SeenBy: map[string]time.Time{"n1": now}},
					{HAProxy: "10.0.0.7", LastSeen: now, SeenBy: seen7},
				}})
			})
			addr := ctltest.FakeConsul(t, 5)
			g := fleet.GateOptions{Consul: consulAt(t, addr), ConsulAddr: addr, Prefix: "hastate/", Replica: replicaAt(t, replica.URL),
				Selectors: []ctl.Selector{{Backend: "canary_web", Server: "web-1"}}, Interval: 50 * time.Millisecond}
			// Long enough for a whole look on a loaded machine (-race):
			// the error names the last whole look's lag.
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			err := fleet.Wait(ctx, g)
			switch {
			case tt.lag == "" && err != nil:
				t.Fatalf("wait: %v, want done", err)
			case tt.lag != "" && (!errors.Is(err, ctl.ErrCannotConfirm) || !strings.Contains(err.Error(), tt.lag)):
				t.Fatalf("wait: %v, want cannot confirm naming %q", err, tt.lag)
			}
		})
	}
}

// A look that the deadline cuts short is not what wait reports: when
// --timeout ends while the record of HAProxy nodes is being read (a slow
// replica), the error names what the last whole look found (an HAProxy
// seen by no live replica), not "did not answer in time".
func TestWaitReportsTheLastWholeLook(t *testing.T) {
	now := time.Now()
	answers := []api.ReplicaAnswer{{ID: "n1", Answered: true}, {ID: "n3", Error: "connection refused"}}
	var looks atomic.Int32
	replica := pairsReplica(t, answers, nil, func(w http.ResponseWriter, r *http.Request) {
		if looks.Add(1) > 1 {
			<-r.Context().Done() // the second look's read outlasts the deadline
			return
		}
		_ = json.NewEncoder(w).Encode(api.HAProxiesView{Recorded: true, Replicas: answers, HAProxies: []api.HAProxyNode{
			{HAProxy: "10.0.0.7", LastSeen: now, SeenBy: map[string]time.Time{"n3": now}},
		}})
	})
	addr := ctltest.FakeConsul(t, 5)
	g := fleet.GateOptions{Consul: consulAt(t, addr), ConsulAddr: addr, Prefix: "hastate/", Replica: replicaAt(t, replica.URL),
		Selectors: []ctl.Selector{{Backend: "canary_web", Server: "web-1"}}, Interval: 10 * time.Millisecond}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	err := fleet.Wait(ctx, g)
	if looks.Load() < 2 {
		t.Fatalf("wait read the record of HAProxy nodes %d times, want a second look cut short (err: %v)", looks.Load(), err)
	}
	if !errors.Is(err, ctl.ErrCannotConfirm) || !strings.Contains(err.Error(), "HAProxy 10.0.0.7 (last poll") || strings.Contains(err.Error(), "in time") {
		t.Fatalf("wait: %v\nwant cannot confirm naming the first look's HAProxy 10.0.0.7, not the look the deadline cut short", err)
	}
}

// pairsReplica is a replica of the cluster ctltest.Fleet describes, whose
// peers answered as answers say, holding polls, and whose record of
// HAProxy nodes is what haproxies writes. It is closed with the test.
func pairsReplica(t *testing.T, answers []api.ReplicaAnswer, polls []api.Poll, haproxies http.HandlerFunc) *httptest.Server {
	v := ctltest.Fleet()
	v.Replicas = answers
	id := ctltest.Identity()
	replica := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/cluster":
			_ = json.NewEncoder(w).Encode(api.ClusterInfo{NodeID: "n1", State: "leader", LeaderID: "n1", KV: api.KVView{SyncedIndex: 5}, KVPrefix: "hastate/", Consul: &id})
		case "/v1/pollers":
			_ = json.NewEncoder(w).Encode(api.PollersView{Pollers: polls, Replicas: answers, Total: len(polls)})
		case "/v1/haproxies":
			haproxies(w, r)
		default:
			_ = json.NewEncoder(w).Encode(v)
		}
	}))
	t.Cleanup(replica.Close)
	return replica
}
