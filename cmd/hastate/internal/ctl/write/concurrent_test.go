package write

import (
	"context"
	"strings"
	"testing"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/internal/ctltest"
)

// Issue 34: --min-ready depends on every key it counted. Two concurrent
// drains of the two ready servers of canary_web (web-1; web-2 at 50% of
// its own), each with --min-ready 1, against a real Consul: each alone
// leaves one ready, so each plan passes; the second to commit must find
// that the other changed a key it counted and, planned again, refuse.
// The replica's view lags Consul (it shows both ready throughout), as a
// replica does for the milliseconds of a sync: Consul decides.
func TestConcurrentDrainsKeepMinReady(t *testing.T) {
	kv, wr := realConsul(t)
	ctx := context.Background()
	if _, err := kv.Put(&consulapi.KVPair{Key: "hastate/state/canary_web/web-2", Value: []byte("50%")}, nil); err != nil {
		t.Fatal(err)
	}
	replica := scriptedReplicaOf(t, identityOf(t, wr), 1<<50, nil, func(int) *api.StateView { return ctltest.Fleet() })
	drain := func(srv string, hook func(int)) (Plan, error) {
		return Write(ctx, Request{Options: Options{Command: "drain", Value: "drain", MinReady: 1},
			Selectors: []ctl.Selector{{Backend: "canary_web", Server: srv}}, Writer: wr, Replica: replica, beforeApply: hook})
	}
	var second Plan
	var secondErr error
	first, firstErr := drain("web-1", func(attempt int) {
		if attempt == 0 {
			// The other writer plans and commits between this one's
			// plan and its transaction.
			second, secondErr = drain("web-2", nil)
		}
	})
	if secondErr != nil || !second.Written {
		t.Fatalf("the drain that committed first: %+v %v", second, secondErr)
	}
	if firstErr == nil || !strings.Contains(firstErr.Error(), "fewer than --min-ready 1") || first.Written {
		t.Fatalf("the drain overtaken by a drain of the other last ready server: written %v, %v; want it planned again and refused", first.Written, firstErr)
	}
	if first.Retried != 1 {
		t.Errorf("retried %d times, want once (the other drain changed a key it counted)", first.Retried)
	}
	ready := 0
	for _, s := range []string{"web-1", "web-2"} {
		if p, _, err := kv.Get("hastate/state/canary_web/"+s, nil); err != nil {
			t.Fatal(err)
		} else if p == nil || string(p.Value) != "drain" {
			ready++
		}
	}
	if ready != 1 {
		t.Fatalf("%d of web-1, web-2 ready after two concurrent drains with --min-ready 1, want 1", ready)
	}

	// What the transaction depends on: the own key of every server
	// counted ready afterwards, and the backend-wide key.
	if _, err := kv.Delete("hastate/state/canary_web/web-1", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(&consulapi.KVPair{Key: "hastate/state/canary_web/web-2", Value: []byte("50%")}, nil); err != nil {
		t.Fatal(err)
	}
	dry, err := Write(ctx, Request{Options: Options{Command: "drain", Value: "drain", MinReady: 1}, DryRun: true,
		Selectors: []ctl.Selector{{Backend: "canary_web", Server: "web-1"}}, Writer: wr, Replica: replica})
	if err != nil {
		t.Fatal(err)
	}
	var deps []string
	for _, d := range dry.Deps {
		deps = append(deps, d.String())
	}
	got := strings.Join(deps, " ")
	if !strings.Contains(got, "hastate/state/canary_web/web-2 = 50% (index") || !strings.Contains(got, "hastate/state/canary_web/* (absent)") {
		t.Fatalf("drain of web-1 depends on %s; want web-2's key (counted ready) and canary_web/*", got)
	}
}
