package fleet_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/fleet"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/internal/ctltest"
)

// withhold makes row the row of a server whose key holds "300%" with no
// last valid value: every replica withholds its answer.
func withhold(row *api.ServerState) {
	row.Key, row.Value = "state/"+row.Backend+"/"+row.Server, "300%"
	row.Answer, row.Withheld, row.Kind, row.Weight, row.Valid = "", true, api.KindWithheld, 0, false
	row.Error = `invalid value "300%": a weight is 0% to 256%`
}

// Issue 45: wait passed ("every HAProxy ... was told the current answer")
// for a server whose answer every replica withholds. It fails at once,
// not done (exit 1), in the words precheck blocks with, naming the key
// and the fix.
func TestWaitAndPrecheckRefuseAWithheldAnswer(t *testing.T) {
	v := ctltest.Fleet()
	withhold(&v.Servers[3]) // canary_web/web-2
	sels := []ctl.Selector{{Backend: "canary_web", Server: "web-2"}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	werr := fleet.Wait(ctx, fakeGate(t, v, sels))
	took := time.Since(start)
	_, blocking, perr := fleet.Precheck(ctx, fakeGate(t, v, sels))
	want := `canary_web/web-2: not told: every replica withholds its answer (HAProxy keeps its last state), because key hastate/state/canary_web/web-2 holds "300%", which is invalid`
	fix := "fix the key: hastate ready|drain|maint canary_web/web-2, hastate weight <N>% canary_web/web-2, or hastate clear canary_web/web-2"
	switch {
	case !errors.Is(werr, ctl.ErrNotDone) || errors.Is(werr, ctl.ErrCannotConfirm):
		t.Fatalf("wait for a withheld answer: %v, want not done (exit 1)", werr)
	case !strings.Contains(werr.Error(), want) || !strings.Contains(werr.Error(), fix):
		t.Fatalf("wait for a withheld answer says:\n%v\nwant %q and %q", werr, want, fix)
	case took > 2*time.Second:
		t.Fatalf("wait for a withheld answer took %s: it needs a write, not time, so it fails at once", took)
	case perr != nil || len(blocking) != 1 || blocking[0] != werr.Error():
		t.Fatalf("precheck of a withheld answer: %q %v; want it blocked (exit 1) in wait's words:\n%s", blocking, perr, werr)
	}
	// A backend-wide key at fault is fixed on backend/*.
	v = ctltest.Fleet()
	withhold(&v.Servers[3])
	v.Servers[3].Key = "state/canary_web/*"
	if err := fleet.Wait(ctx, fakeGate(t, v, sels)); err == nil || !strings.Contains(err.Error(), "hastate clear canary_web/*") {
		t.Fatalf("wait under an invalid backend-wide key: %v, want the fix on canary_web/*", err)
	}
}

// leaderlessReplica is a replica that knows no raft leader (ci), at
// Consul index 5, whose state is ctltest.Fleet() with the stale sync a
// replica without a leader reports.
func leaderlessReplica(t *testing.T, ci api.ClusterInfo) *fleet.Replica {
	t.Helper()
	v := ctltest.Fleet()
	v.KV = api.KVStatus{KVView: api.KVView{Warning: "Consul not synced for 40s: the leader has not reported", Synced: false}}
	id := ctltest.Identity()
	ci.KV, ci.KVPrefix, ci.Consul = api.KVView{SyncedIndex: 5}, "hastate/", &id
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/cluster" {
			_ = json.NewEncoder(w).Encode(ci)
			return
		}
		_ = json.NewEncoder(w).Encode(v)
	}))
	t.Cleanup(srv.Close)
	return replicaAt(t, srv.URL)
}

// Issue 45: with the quorum lost, precheck waited its whole --timeout and
// blamed Consul. precheck and wait say there is no leader, what HAProxy
// does meanwhile and the runbook section, at once when the replica has
// given up on a leader (withholding "leaderless"), at the timeout during
// what may be an election.
func TestGatesSayThereIsNoLeader(t *testing.T) {
	sels := []ctl.Selector{{Backend: "canary_web", Server: "*"}}
	for _, tt := range []struct {
		name    string
		ci      api.ClusterInfo
		timeout time.Duration
		atOnce  bool
		want    string
	}{
		{"quorum lost", api.ClusterInfo{NodeID: "n3", State: "candidate", LeaderlessSeconds: 12, Withholding: []string{"leaderless"}}, 5 * time.Second, true,
			"no raft leader: replica n3 has known no leader for 12s (the cluster has lost its quorum"},
		{"an election", api.ClusterInfo{NodeID: "n3", State: "candidate", LeaderlessSeconds: 1}, 400 * time.Millisecond, false,
			"no raft leader: replica n3 has known no leader for 1s (an election is under way, or the cluster lost its quorum)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for cmd, run := range map[string]func(context.Context, fleet.GateOptions) error{
				"precheck": func(ctx context.Context, g fleet.GateOptions) error { _, _, err := fleet.Precheck(ctx, g); return err },
				"wait":     fleet.Wait,
			} {
				g := fakeGate(t, ctltest.Fleet(), sels)
				g.Replica = leaderlessReplica(t, tt.ci)
				ctx, cancel := context.WithTimeout(context.Background(), tt.timeout)
				start := time.Now()
				err := run(ctx, g)
				took := time.Since(start)
				cancel()
				msg := ""
				if err != nil {
					msg = err.Error()
				}
				switch {
				case !errors.Is(err, ctl.ErrCannotConfirm):
					t.Errorf("%s: %v, want cannot confirm (exit 4)", cmd, err)
				case !strings.Contains(msg, tt.want) || !strings.Contains(msg, "HAProxy keeps each server's last state") || !strings.Contains(msg, fleet.RunbookNoLeader):
					t.Errorf("%s says:\n%s\nwant %q, what HAProxy does and %s", cmd, msg, tt.want, fleet.RunbookNoLeader)
				case strings.Contains(msg, "Consul not synced"):
					t.Errorf("%s blames Consul for a lost leader:\n%s", cmd, msg)
				case tt.atOnce && took > tt.timeout/2:
					t.Errorf("%s took %s of its %s timeout: a replica past --leaderless-grace has no election to wait for", cmd, took, tt.timeout)
				}
			}
		})
	}
}

// Issue 45: through a load balancer with no ready replica behind it, a
// command printed HAProxy's "HTTP 503: <html>...". It says "no replica is
// ready", and cannot confirm (exit 4).
func TestA503IsNoReplicaReady(t *testing.T) {
	lb := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte("<html><body><h1>503 Service Unavailable</h1>\nNo server is available to handle this request.\n</body></html>"))
	}))
	defer lb.Close()
	_, err := replicaAt(t, lb.URL).Fleet(context.Background())
	if !errors.Is(err, ctl.ErrCannotConfirm) || !strings.HasPrefix(err.Error(), "no replica is ready: "+lb.URL+" answered HTTP 503") ||
		strings.Contains(err.Error(), "<html>") || !strings.Contains(err.Error(), fleet.RunbookNoLeader) {
		t.Fatalf("a 503 from a load balancer: %v; want cannot confirm, \"no replica is ready\", without HAProxy's page", err)
	}
}

// Issue 45: an HAProxy node killed, wait failed after its timeout with
// `last told "ready 100%" ... 16s ago`. It says that the HAProxy has not
// polled for 16s and when it drops out of the wait.
func TestWaitSaysAnHAProxyStoppedPolling(t *testing.T) {
	stopped := api.Poll{HAProxy: "127.0.0.9", Backend: "canary_web", Server: "web-1", Answer: "drain", Replica: "n2",
		LastAsked: time.Now().Add(-16 * time.Second), Count: 40}
	g := fakeGate(t, ctltest.Fleet(), []ctl.Selector{{Backend: "canary_web", Server: "web-1"}})
	g.Replica, g.Interval = pollsReplica(t, []api.Poll{stopped}), 50*time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err := fleet.Wait(ctx, g)
	want := `HAProxy 127.0.0.9 for canary_web/web-1: has not polled for 16s (last told "drain" by n2, current "ready 100%"); it drops out of the wait 1m0s after its last poll, in 44s`
	if !errors.Is(err, ctl.ErrNotDone) || !strings.Contains(err.Error(), want) {
		t.Fatalf("wait for an HAProxy that stopped polling: %v\nwant %q", err, want)
	}
}

// Issue 45: a TCP load balancer with no ready replica behind it closes the
// connection; the command said `Get "...": EOF`. It says what that may
// mean and where to look.
func TestAClosedConnectionMayBeALoadBalancerWithNoReplica(t *testing.T) {
	lb := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			c.Close()
		}
	}))
	defer lb.Close()
	_, err := replicaAt(t, lb.URL).Fleet(context.Background())
	if !errors.Is(err, ctl.ErrCannotConfirm) || !strings.HasPrefix(err.Error(), lb.URL+" closed the connection without an answer: if it is a load balancer, no replica behind it may be ready") {
		t.Fatalf("a connection closed without an answer: %v", err)
	}
}
