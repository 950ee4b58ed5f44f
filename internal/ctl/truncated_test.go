package ctl

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
			fmt.Fprint(w, `{"node_id":"n1","kv":{"synced_index":5},"kv_prefix":"hastate/","consul":{"datacenter":"dc1","cluster":"127.0.0.1:8300"}}`)
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

func replicaAt(t *testing.T, addr string) *Replica {
	t.Helper()
	r, err := NewReplica(addr)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// status, wait and precheck ask for the most rows a replica answers, and
// fail closed when the answer is still cut.
func TestListsCutByTheReplicaFailClosed(t *testing.T) {
	ctx := context.Background()
	want := fmt.Sprintf("limit=%d", api.MaxLimit)
	web := []Selector{{"web", "*"}}

	addr, qs := fakeLists(t, false, false)
	r := replicaAt(t, addr)
	if _, err := r.Fleet(ctx); err != nil {
		t.Fatalf("Fleet of a whole list: %v", err)
	}
	gate := GateOptions{Consul: fakeConsul(t, 5).Client, Prefix: "hastate/", Replica: r, Selectors: web}
	if n, blocking, err := Precheck(ctx, gate); err != nil || n != 1 || len(blocking) != 0 {
		t.Fatalf("Precheck of a whole list: %v %d %v", blocking, n, err)
	}
	if lag, _, err := waitLag(ctx, gate, 5); err != nil || len(lag) != 0 {
		t.Fatalf("waitLag of whole lists: %v %v", lag, err)
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
	_, _, perr := Precheck(ctx, gate)
	_, _, werr := waitLag(ctx, GateOptions{Replica: replicaAt(t, cutState), Selectors: web}, 5)
	_, _, wperr := waitLag(ctx, GateOptions{Replica: replicaAt(t, cutPollers), Selectors: web}, 5)
	for name, err := range map[string]error{"Fleet": err, "Precheck": perr, "waitLag (state cut)": werr, "waitLag (pollers cut)": wperr} {
		if !errors.Is(err, ErrTruncated) || !strings.Contains(err.Error(), "partial list") || !strings.Contains(err.Error(), "100001") {
			t.Errorf("%s over a cut list: %v; want ErrTruncated saying it refuses a partial list of 100001", name, err)
		}
	}
}
