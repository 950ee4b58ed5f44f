package fleet_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/fleet"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/internal/ctltest"
)

func TestPrecheckFollowsTheDeployContract(t *testing.T) {
	ctx := context.Background()
	for _, tt := range []struct {
		name string
		sel  string
		edit func(*api.StateView)
		want string // "ok", "block:<text>", "ERR:<text>"
	}{
		{"all ready", "canary_web/*", nil, "ok"},
		{"maint passes", "main_web/m-3", nil, "ok"},
		{"one drained", "canary_*/*", nil, "block:canary_api/api-1 is drained"},
		{"one ramping", "canary_web/*", func(v *api.StateView) {
			v.Servers[2].Ramping, v.Servers[2].Kind, v.Servers[2].Weight = &api.RampProgress{WeightPercent: 40}, api.KindRamping, 40
		}, "block:canary_web/web-1 is ramping: 40%"},
		{"an invalid key with no valid value", "canary_web/web-1", func(v *api.StateView) {
			withhold(&v.Servers[2])
		}, "block:canary_web/web-1: not told: every replica withholds its answer (HAProxy keeps its last state), because key hastate/state/canary_web/web-1 holds \"300%\", which is invalid"},
		// Issue 15.3: 0% is DRAIN in HAProxy.
		{"one at 0%", "canary_web", func(v *api.StateView) {
			v.Servers[3].Answer, v.Servers[3].Kind, v.Servers[3].Weight = "ready 0%", api.KindWeight, 0
		}, "block:canary_web/web-2 is at 0% (HAProxy shows it as DRAIN)"},
		{"a weight above 0% passes", "canary_web", nil, "ok"},
		// Issue 15.6: a backend-wide key is not a server.
		{"a drained backend-wide key is not counted", "canary_api", nil, "count:1 block:canary_api/api-1 is drained"},
		{"a backend with only a backend-wide key matches no server", "canary_api", func(v *api.StateView) { v.Servers = v.Servers[:1] },
			"ERR:no server matches 'canary_api/*'"},
		{"nothing matched", "canary_wbe/web-1", nil, "ERR:no server matches 'canary_wbe/web-1'; did you mean canary_web/web-1?; known backends: canary_api, canary_web"},
		{"a replica down", "canary_web/*", func(v *api.StateView) {
			v.Replicas[1] = api.ReplicaAnswer{ID: "n2", Error: "i/o timeout"}
		}, "ERR:cannot confirm: replica n2 unreachable"},
		{"Consul not in sync", "canary_web/*", func(v *api.StateView) {
			v.KV.Warning = "Consul not synced for 42s"
		}, "ERR:cannot confirm: Consul not synced for 42s"},
		{"no state", "canary_web/*", func(v *api.StateView) { v.HoldsState = false }, "ERR:holds no state"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			v := ctltest.Fleet()
			if tt.edit != nil {
				tt.edit(v)
			}
			sels, _ := ctl.ParseSelectors([]string{tt.sel})
			ctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			n, blocking, err := fleet.Precheck(ctx, fakeGate(t, v, sels))
			want := tt.want
			if c, rest, ok := strings.Cut(want, " "); ok && strings.HasPrefix(c, "count:") {
				if got := fmt.Sprint(n); got != strings.TrimPrefix(c, "count:") {
					t.Fatalf("precheck checked %d servers, want %s (%v)", n, c, blocking)
				}
				want = rest
			}
			switch kind, text, _ := strings.Cut(want, ":"); kind {
			case "ok":
				if err != nil || len(blocking) > 0 || n == 0 {
					t.Fatalf("precheck = %d %v %v, want ok", n, blocking, err)
				}
			case "block":
				if err != nil || !strings.Contains(strings.Join(blocking, "\n"), text) {
					t.Fatalf("precheck = %v %v, want blocked by %q", blocking, err, text)
				}
			default:
				if err == nil || !strings.Contains(err.Error(), text) {
					t.Fatalf("precheck = %v %v, want error %q", blocking, err, text)
				}
			}
		})
	}
}

// A replica that has not applied the writes made before precheck started
// cannot confirm anything: precheck fails closed when its time is up.
func TestPrecheckWaitsForTheReplicaToCatchUp(t *testing.T) {
	g := fakeGate(t, ctltest.Fleet(), []ctl.Selector{{Backend: "canary_web", Server: "*"}})
	g.Consul = fakeConsul(t, 9) // the replica holds index 5
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, _, err := fleet.Precheck(ctx, g)
	if !errors.Is(err, ctl.ErrCannotConfirm) || !strings.Contains(err.Error(), `has applied Consul index 5 of prefix "hastate/", not yet 9`) {
		t.Fatalf("precheck against a replica behind Consul: %v, want cannot confirm", err)
	}
}

// wait exits 3 on a selector that matches nothing, and times out naming
// the HAProxy that was not told the current answer.
func TestWaitNamesWhatLags(t *testing.T) {
	ctx := context.Background()
	g := fakeGate(t, ctltest.Fleet(), []ctl.Selector{{Backend: "canary_wbe", Server: "*"}})
	if err := fleet.Wait(ctx, g); !errors.Is(err, ctl.ErrNoMatch) {
		t.Errorf("wait on a typo: %v, want ErrNoMatch", err)
	}
	polls := `{"pollers":[{"haproxy":"127.0.0.9","backend":"canary_web","server":"web-1","answer":"drain","last_asked":"` +
		time.Now().UTC().Format(time.RFC3339Nano) + `","replica":"n2"}],"replicas":[{"id":"n1","answered":true}]}`
	replica := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/cluster":
			_ = json.NewEncoder(w).Encode(api.ClusterInfo{NodeID: "n1", State: "leader", LeaderID: "n1", KV: api.KVView{SyncedIndex: 5}, KVPrefix: "hastate/", Consul: new(ctltest.Identity())})
		case "/v1/pollers":
			_, _ = w.Write([]byte(polls))
		default:
			_ = json.NewEncoder(w).Encode(ctltest.Fleet())
		}
	}))
	defer replica.Close()
	g.Replica, g.Selectors, g.Interval = replicaAt(t, replica.URL), []ctl.Selector{{Backend: "canary_web", Server: "web-1"}}, 50*time.Millisecond
	ctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	err := fleet.Wait(ctx, g)
	if !errors.Is(err, ctl.ErrNotDone) || !strings.Contains(err.Error(), `HAProxy 127.0.0.9 for canary_web/web-1: last told "drain" by n2`) {
		t.Errorf("wait with a lagging HAProxy: %v", err)
	}
}

// wait passes only once the replica has applied the Consul index current
// when wait started (every write made before it is in): a replica at
// index 3 of a prefix at 5 is waited for, and at the timeout that is
// "cannot confirm" (exit 4), naming the index, although every HAProxy
// was told what the replica holds.
func TestWaitForTheReplicaToApplyTheIndex(t *testing.T) {
	replica := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/cluster":
			_ = json.NewEncoder(w).Encode(api.ClusterInfo{NodeID: "n1", State: "leader", LeaderID: "n1", KV: api.KVView{SyncedIndex: 3}, KVPrefix: "hastate/", Consul: new(ctltest.Identity())})
		case "/v1/pollers":
			_ = json.NewEncoder(w).Encode(api.PollersView{Replicas: []api.ReplicaAnswer{{ID: "n1", Answered: true}}})
		default:
			_ = json.NewEncoder(w).Encode(ctltest.Fleet())
		}
	}))
	defer replica.Close()
	g := fakeGate(t, ctltest.Fleet(), []ctl.Selector{{Backend: "canary_web", Server: "web-1"}}) // Consul at index 5
	g.Replica, g.Interval = replicaAt(t, replica.URL), 50*time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err := fleet.Wait(ctx, g)
	if !errors.Is(err, ctl.ErrCannotConfirm) || !strings.Contains(err.Error(), "has applied Consul index 3") || !strings.Contains(err.Error(), "waiting for 5") {
		t.Fatalf("wait with a replica behind Consul: %v, want cannot confirm naming index 3 of 5", err)
	}
}

// Issue 15.2: a source that asked once, longer than api.ProbeGrace ago (a
// person's nc), is not waited for; an HAProxy that spread two checks over
// two replicas is, and so is a source whose one ask is fresh (an HAProxy
// that just started).
func TestWaitIgnoresAManualProbe(t *testing.T) {
	now := time.Now()
	poll := func(haproxy, answer, replica string, ago time.Duration, count uint64) api.Poll {
		return api.Poll{HAProxy: haproxy, Backend: "canary_web", Server: "web-1", Answer: answer, Replica: replica,
			LastAsked: now.Add(-ago), Count: count}
	}
	probe := poll("127.0.0.9", "drain", "n1", 20*time.Second, 1)
	current := poll("127.0.0.10", "ready 100%", "n1", time.Second, 40)
	for _, tt := range []struct {
		name  string
		polls []api.Poll
		lag   string // "" : done
	}{
		{"a probe once, 20s ago", []api.Poll{probe, current}, ""},
		{"an HAProxy over two replicas", []api.Poll{probe, current, poll("127.0.0.11", "drain", "n1", 20*time.Second, 1),
			// "for 10s", or 11s on a machine slow enough that a second
			// passed since now: both say it stopped polling.
			poll("127.0.0.11", "drain", "n2", 10*time.Second, 1)}, `HAProxy 127.0.0.11 for canary_web/web-1: has not polled for 1`},
		{"a new HAProxy's first check", []api.Poll{current, poll("127.0.0.12", "drain", "n2", time.Second, 1)}, "HAProxy 127.0.0.12"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			g := fakeGate(t, ctltest.Fleet(), []ctl.Selector{{Backend: "canary_web", Server: "web-1"}})
			g.Replica, g.Interval = pollsReplica(t, tt.polls), 50*time.Millisecond
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			err := fleet.Wait(ctx, g)
			switch {
			case tt.lag == "" && err != nil:
				t.Fatalf("wait: %v, want done", err)
			case tt.lag != "" && (!errors.Is(err, ctl.ErrNotDone) || !strings.Contains(err.Error(), tt.lag)):
				t.Fatalf("wait: %v, want it to wait for %q", err, tt.lag)
			case strings.Contains(tt.lag, "has not polled") && !strings.Contains(err.Error(), `(last told "drain" by n2`):
				t.Fatalf("wait: %v, want it to name what the HAProxy was last told", err)
			}
		})
	}
}

// Issue 15.8: right after a replica starts (it has applied the current
// index, but no leader has reported a KV sync to it yet), precheck waits
// within --timeout instead of failing; a Consul that is really out of
// sync still fails at once.
func TestPrecheckWaitsOutAReplicasStartUp(t *testing.T) {
	starting := func(n int) *api.StateView {
		v := ctltest.Fleet()
		if n < 3 {
			v.KV = api.KVStatus{KVView: api.KVView{Warning: "Consul not synced: no leader has mirrored KV in the 1s since this replica started"}}
		}
		return v
	}
	g := fakeGate(t, ctltest.Fleet(), []ctl.Selector{{Backend: "canary_web", Server: "*"}})
	g.Replica = scriptedReplica(t, 5, nil, starting)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if n, blocking, err := fleet.Precheck(ctx, g); err != nil || len(blocking) != 0 || n != 2 {
		t.Fatalf("precheck during a replica's start-up: %d %v %v, want ok for 2 servers", n, blocking, err)
	}

	g.Replica = scriptedReplica(t, 5, nil, func(int) *api.StateView {
		v := ctltest.Fleet()
		v.KV.Warning = "Consul not synced for 42s: the leader n2 cannot read it"
		return v
	})
	start := time.Now()
	if _, _, err := fleet.Precheck(ctx, g); !errors.Is(err, ctl.ErrCannotConfirm) || !strings.Contains(err.Error(), "cannot read it") {
		t.Fatalf("precheck with Consul out of sync: %v, want cannot confirm", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("precheck with Consul out of sync took %s; it is not a start-up state to wait out", took)
	}
}

// Issue 15.7: wait --settled also waits until no selected server is
// ramping or expires before the timeout; without it wait returns once
// every HAProxy was told.
func TestWaitSettled(t *testing.T) {
	ramping := func(n int) *api.StateView {
		v := ctltest.Fleet()
		if n < 4 {
			r := &v.Servers[2] // canary_web/web-1
			r.Ramping, r.Kind, r.Weight, r.Answer = &api.RampProgress{WeightPercent: 10 * (n + 1)}, api.KindRamping, 10*(n+1), fmt.Sprintf("ready %d%%", 10*(n+1))
		}
		return v
	}
	soon := time.Now().Add(500 * time.Millisecond)
	for _, tt := range []struct {
		name    string
		settled bool
		view    func(int) *api.StateView
		want    string // "" done, else what it still waits for
	}{
		{"not settled", false, ramping, ""},
		{"settled waits for the ramp", true, ramping, ""},
		{"settled and a ramp that does not end", true, func(int) *api.StateView { return ramping(0) }, "canary_web/web-1 is ramping: 10%"},
		{"settled and an expiry before the timeout", true, func(int) *api.StateView {
			v := ctltest.Fleet()
			v.Servers[2].Until = &soon
			return v
		}, "canary_web/web-1 expire"}, // expires at, then expired at (the leader never applies it here)
		{"settled and an expiry after the timeout", true, func(int) *api.StateView {
			v := ctltest.Fleet()
			until := time.Now().Add(time.Hour)
			v.Servers[2].Until = &until
			return v
		}, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			g := fakeGate(t, ctltest.Fleet(), []ctl.Selector{{Backend: "canary_web", Server: "web-1"}})
			g.Replica, g.Settled, g.Interval = scriptedReplica(t, 5, nil, tt.view), tt.settled, 20*time.Millisecond
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			var out strings.Builder
			g.Out = &out
			err := fleet.Wait(ctx, g)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("wait: %v, want done", err)
			case tt.want != "" && (!errors.Is(err, ctl.ErrNotDone) || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("wait: %v, want it to wait for %q", err, tt.want)
			case tt.settled && tt.name == "settled waits for the ramp" && !strings.Contains(out.String(), "is ramping"):
				t.Fatalf("wait --settled returned without waiting for the ramp; progress: %q", out.String())
			}
		})
	}
}

// Issue 18.5: the gates read Consul's index of the prefix without listing
// it, and the index is the one a recursive read of the prefix (the
// leader's watch) reports: writes and deletes under the prefix raise it,
// writes elsewhere do not.
func TestConsulIndexIsThePrefixIndex(t *testing.T) {
	kv, c, addr := realConsul(t)
	g := fleet.GateOptions{Consul: c, ConsulAddr: addr, Prefix: "hastate/"}
	ctx := context.Background()
	check := func(step string) uint64 {
		t.Helper()
		got, err := g.ConsulIndex(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_, meta, err := kv.List("hastate/", nil)
		if err != nil {
			t.Fatal(err)
		}
		if got != meta.LastIndex {
			t.Fatalf("%s: consulIndex %d, a recursive read of the prefix %d", step, got, meta.LastIndex)
		}
		return got
	}
	put := func(k string) {
		if _, err := kv.Put(&consulapi.KVPair{Key: k, Value: []byte("drain")}, nil); err != nil {
			t.Fatal(err)
		}
	}
	put("hastate/state/web/a")
	i1 := check("one key")
	put("other/x")
	if i := check("a write outside the prefix"); i != i1 {
		t.Errorf("a write outside the prefix moved the index %d -> %d", i1, i)
	}
	put("hastate/state/web/b")
	if _, err := kv.Delete("hastate/state/web/b", nil); err != nil {
		t.Fatal(err)
	}
	if i := check("a delete under the prefix"); i <= i1 {
		t.Errorf("a delete under the prefix left the index at %d", i)
	}
}

// Issue 34: precheck with a prefix no replica reads cannot say anything
// about what is served: exit 4 (cannot confirm), not 1 (blocked).
func TestPrecheckOfAPrefixNoReplicaReads(t *testing.T) {
	g := fakeGate(t, ctltest.Fleet(), []ctl.Selector{{Backend: "canary_web", Server: "*"}})
	g.Prefix = "gitlab-haproxy-agent/"
	_, _, err := fleet.Precheck(context.Background(), g)
	if !errors.Is(err, ctl.ErrCannotConfirm) || !errors.Is(err, ctl.ErrWrongReplica) || !strings.Contains(err.Error(), `reads KV prefix "hastate/"`) {
		t.Fatalf("precheck of a prefix no replica reads: %v; want cannot confirm naming the prefix the replica reads", err)
	}
}

// CheckReplica refuses, before anything else, a replica that does not
// read what the command writes: another prefix, or the same prefix of
// another Consul cluster (a write nobody serves, a wait for an index the
// replica never reaches).
func TestCheckReplicaRefusesAnotherPrefixOrCluster(t *testing.T) {
	addr := ctltest.FakeConsul(t, 5) // cluster ctltest.Identity()
	for _, tt := range []struct {
		name   string
		prefix string
		id     api.ConsulIdentity
		want   string // in the refusal; "": none
	}{
		{"the same prefix of the same cluster", "hastate/", ctltest.Identity(), ""},
		{"another prefix", "gitlab-haproxy-agent/", ctltest.Identity(), `reads KV prefix "gitlab-haproxy-agent/"`},
		{"another cluster", "hastate/", api.ConsulIdentity{Datacenter: "dc1", Cluster: "10.9.9.9:8300"}, "of another Consul cluster"},
		{"another datacenter", "hastate/", api.ConsulIdentity{Datacenter: "dc2", Cluster: ctltest.Identity().Cluster}, "of another Consul cluster"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			replica := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_ = json.NewEncoder(w).Encode(api.ClusterInfo{NodeID: "n1", KV: api.KVView{SyncedIndex: 5}, KVPrefix: tt.prefix, Consul: &tt.id})
			}))
			defer replica.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err := fleet.CheckReplica(ctx, consulAt(t, addr), addr, "hastate/", replicaAt(t, replica.URL))
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("a replica that reads what the command writes: %v", err)
			case tt.want != "" && (!errors.Is(err, ctl.ErrWrongReplica) || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("CheckReplica: %v, want a refusal (wrong replica) saying %q", err, tt.want)
			}
		})
	}
}
