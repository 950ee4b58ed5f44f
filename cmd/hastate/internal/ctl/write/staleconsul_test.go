package write

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/fleet"
)

// staleConsul is a Consul right after a restart: a read in the default
// mode answers from a server that has not caught up (no keys, index 3);
// a ?consistent read answers the truth (hastate/state/web/a = drain,
// index 9). It records the transactions it is sent.
type staleConsul struct {
	mu   sync.Mutex
	txns []string
}

func (c *staleConsul) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, consistent := r.URL.Query()["consistent"]
	index := "3"
	if consistent {
		index = "9"
	}
	w.Header().Set("X-Consul-Index", index)
	switch {
	case r.URL.Path == "/v1/status/peers":
		_ = json.NewEncoder(w).Encode([]string{"127.0.0.1:8300"})
	case r.URL.Path == "/v1/agent/self":
		_ = json.NewEncoder(w).Encode(map[string]any{"Config": map[string]string{"Datacenter": "dc1"}})
	case r.URL.Path == "/v1/txn":
		b, _ := io.ReadAll(r.Body)
		c.mu.Lock()
		c.txns = append(c.txns, string(b))
		c.mu.Unlock()
		_, _ = io.WriteString(w, `{"Results":[],"Errors":null}`)
	case !consistent:
		w.WriteHeader(http.StatusNotFound) // the stale server: no keys
	case r.URL.Query().Has("keys"):
		k := strings.TrimPrefix(r.URL.Path, "/v1/kv/")
		switch {
		case r.URL.Query().Get("separator") == "/" && k == "hastate/":
			_ = json.NewEncoder(w).Encode([]string{"hastate/state/"})
		case r.URL.Query().Get("separator") == "/":
			_ = json.NewEncoder(w).Encode([]string{"hastate/state/web/"})
		default:
			_ = json.NewEncoder(w).Encode([]string{"hastate/state/web/a"})
		}
	case strings.HasPrefix("hastate/state/web/a", strings.TrimPrefix(r.URL.Path, "/v1/kv/")):
		_, _ = io.WriteString(w, `[{"Key":"hastate/state/web/a","Value":"ZHJhaW4=","ModifyIndex":9,"CreateIndex":9}]`)
	default:
		w.WriteHeader(http.StatusNotFound)
	}
}

// staleConsulReplica is a replica that has applied Consul index synced and
// knows web/a (its own key, drain) and web/b.
func staleConsulReplica(t *testing.T, synced uint64) *fleet.Replica {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/cluster":
			_ = json.NewEncoder(w).Encode(api.ClusterInfo{NodeID: "n1", State: "leader", LeaderID: "n1", KV: api.KVView{SyncedIndex: synced},
				KVPrefix: "hastate/", Consul: &api.ConsulIdentity{Datacenter: "dc1", Cluster: "127.0.0.1:8300"}})
		default:
			_ = json.NewEncoder(w).Encode(api.StateView{HoldsState: true, KV: api.KVStatus{KVView: api.KVView{Synced: true}},
				Replicas: []api.ReplicaAnswer{{ID: "n1", Answered: true}},
				Servers: []api.ServerState{
					{Backend: "web", Server: "a", Key: "hastate/state/web/a", Source: "state/web/a", Desired: "drain", Answer: "drain", Kind: api.KindDrain, Polled: 1},
					{Backend: "web", Server: "b", Source: "absent", Answer: "ready 100%", Kind: api.KindReady, Weight: 100, Polled: 1},
				}})
		}
	}))
	t.Cleanup(srv.Close)
	r, err := fleet.NewReplica(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// Issue 22.4: the write path and the gates read Consul consistently. In
// the default mode a Consul that just restarted can answer an empty
// prefix at a low index: a clear would then drop a real delete ("nothing
// to clear"), and a gate would pass on a replica that lacks the latest
// writes.
func TestConsulIsReadConsistently(t *testing.T) {
	c := &staleConsul{}
	srv := httptest.NewServer(c)
	t.Cleanup(srv.Close)
	wr, err := NewWriter(strings.TrimPrefix(srv.URL, "http://"), "hastate/")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	plan, err := Write(ctx, Request{Options: Options{Command: "clear", MinReady: 1},
		Selectors: []ctl.Selector{{Backend: "web", Server: "a"}}, Writer: wr, Replica: staleConsulReplica(t, 9)})
	c.mu.Lock()
	txns := strings.Join(c.txns, "\n")
	c.mu.Unlock()
	if err != nil || !plan.Written || !strings.Contains(txns, `"hastate/state/web/a"`) {
		var out strings.Builder
		plan.Report(&out)
		t.Fatalf("clear of a key only a consistent read shows: %v\n%s\ntransactions: %q; want the delete written", err, out.String(), txns)
	}

	// A gate: the replica has applied index 5; Consul's consistent index
	// is 9 (the default mode says 3): it must not pass.
	g := fleet.GateOptions{Consul: wr.Client, ConsulAddr: wr.Addr, Prefix: "hastate/", Replica: staleConsulReplica(t, 5)}
	gctx, gcancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer gcancel()
	if err := g.WaitSynced(gctx); err == nil {
		t.Fatal("WaitSynced passed on a replica at index 5 while Consul is at 9 (read in the default mode: 3)")
	}
}
