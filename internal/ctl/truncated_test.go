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

	"github.com/hastate/hastate/server"
)

// fakeLists is a replica's /v1/cluster, /v1/state and /v1/pollers, which
// answer cut at server.MaxLimit rows of server.MaxLimit+1 when told so.
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
				return server.MaxLimit + 1, true
			}
			return 1, false
		}
		switch r.URL.Path {
		case "/v1/cluster":
			fmt.Fprint(w, `{"node_id":"n1","kv_digest":"d"}`)
		case "/v1/state":
			total, cut := answer(cutState)
			fmt.Fprintf(w, `{"holds_state":true,"servers":[{"backend":"web","server":"a","answer":"ready 100%%"}],"total":%d,"truncated":%v}`, total, cut)
		case "/v1/pollers":
			total, cut := answer(cutPollers)
			fmt.Fprintf(w, `{"scope":"cluster","pollers":[],"total":%d,"truncated":%v}`, total, cut)
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
	want := fmt.Sprintf("limit=%d", server.MaxLimit)

	addr, qs := fakeLists(t, false, false)
	if _, err := FetchState(ctx, addr); err != nil {
		t.Fatalf("FetchState of a whole list: %v", err)
	}
	if problems, n, err := Precheck(ctx, addr, "web/*"); err != nil || n != 1 || len(problems) != 0 {
		t.Fatalf("Precheck of a whole list: %v %d %v", problems, n, err)
	}
	if lag, err := waitLag(ctx, addr, "web/*", "d"); err != nil || len(lag) != 0 {
		t.Fatalf("waitLag of whole lists: %v %v", lag, err)
	}
	for _, q := range qs() {
		if strings.HasPrefix(q, "/v1/state") || strings.HasPrefix(q, "/v1/pollers") {
			if !strings.Contains(q, want) {
				t.Errorf("GET %s: want %s", q, want)
			}
		}
	}

	cutState, _ := fakeLists(t, true, false)
	cutPollers, _ := fakeLists(t, false, true)
	_, err := FetchState(ctx, cutState)
	_, _, perr := Precheck(ctx, cutState, "web/*")
	_, werr := waitLag(ctx, cutState, "web/*", "d")
	_, wperr := waitLag(ctx, cutPollers, "web/*", "d")
	for name, err := range map[string]error{"FetchState": err, "Precheck": perr, "waitLag (state cut)": werr, "waitLag (pollers cut)": wperr} {
		if !errors.Is(err, ErrTruncated) || !strings.Contains(err.Error(), "partial list") || !strings.Contains(err.Error(), "100001") {
			t.Errorf("%s over a cut list: %v; want ErrTruncated saying it refuses a partial list of 100001", name, err)
		}
	}
}
