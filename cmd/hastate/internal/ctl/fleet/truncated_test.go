package fleet_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/fleet"
)

// fakeLists is a replica's /v1/cluster, /v1/state and /v1/pollers, which
// answer cut at api.MaxLimit rows of api.MaxLimit+1 when told so.
func fakeLists(t *testing.T, cutState, cutPollers bool) (addr string, queries func() []string) {
	t.Helper()
	var (
		mu sync.Mutex
		qs []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		qs = append(qs, r.URL.RequestURI())
		mu.Unlock()
		answer := func(cut bool) (int, bool) {
			if cut {
				return api.MaxLimit + 1, true
			}
			return 1, false
		}
		switch r.URL.Path {
		case "/v1/cluster":
			fmt.Fprint(w, `{"node_id":"n1","state":"leader","leader_id":"n1","kv":{"synced_index":5},"kv_prefix":"hastate/","consul":{"datacenter":"dc1","cluster":"127.0.0.1:8300"}}`)
		case "/v1/state":
			total, cut := answer(cutState)
			fmt.Fprintf(w, `{"holds_state":true,"servers":[{"backend":"web","server":"a","answer":"ready 100%%","polled":1,"told":1}],"replicas":[{"id":"n1","answered":true}],"total":%d,"truncated":%v}`, total, cut)
		case "/v1/pollers":
			total, cut := answer(cutPollers)
			fmt.Fprintf(w, `{"scope":"cluster","pollers":[],"replicas":[{"id":"n1","answered":true}],"total":%d,"truncated":%v}`, total, cut)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL, func() []string { mu.Lock(); defer mu.Unlock(); return slices.Clone(qs) }
}

// status, wait and precheck ask for the most rows a replica answers, and
// fail closed when the answer is still cut.
func TestListsCutByTheReplicaFailClosed(t *testing.T) {
	ctx := context.Background()
	want := fmt.Sprintf("limit=%d", api.MaxLimit)
	web := []ctl.Selector{{Backend: "web", Server: "*"}}

	addr, qs := fakeLists(t, false, false)
	r := replicaAt(t, addr)
	if _, err := r.Fleet(ctx); err != nil {
		t.Fatalf("Fleet of a whole list: %v", err)
	}
	gate := fleet.GateOptions{Consul: fakeConsul(t, 5), Prefix: "hastate/", Replica: r, Selectors: web}
	if n, blocking, err := fleet.Precheck(ctx, gate); err != nil || n != 1 || len(blocking) != 0 {
		t.Fatalf("Precheck of a whole list: %v %d %v", blocking, n, err)
	}
	if err := fleet.Wait(ctx, gate); err != nil {
		t.Fatalf("Wait over whole lists: %v", err)
	}
	for _, q := range qs() {
		if strings.HasPrefix(q, "/v1/state") || strings.HasPrefix(q, "/v1/pollers") {
			if !strings.Contains(q, want) || !strings.Contains(q, "scope=cluster") {
				t.Errorf("GET %s: want %s and scope=cluster", q, want)
			}
		}
	}

	cutState, _ := fakeLists(t, true, false)
	cutPollers, _ := fakeLists(t, false, true)
	_, err := replicaAt(t, cutState).Fleet(ctx)
	gate.Replica = replicaAt(t, cutState)
	_, _, perr := fleet.Precheck(ctx, gate)
	werr := fleet.Wait(ctx, gate)
	gate.Replica = replicaAt(t, cutPollers)
	wperr := fleet.Wait(ctx, gate)
	for name, err := range map[string]error{"Fleet": err, "Precheck": perr, "Wait (state cut)": werr, "Wait (pollers cut)": wperr} {
		if !errors.Is(err, api.ErrTruncated) || !strings.Contains(err.Error(), "partial list") || !strings.Contains(err.Error(), "100001") {
			t.Errorf("%s over a cut list: %v; want api.ErrTruncated saying it refuses a partial list of 100001", name, err)
		}
	}
}
