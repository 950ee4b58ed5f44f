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
)

// Issue 34: with a replica down, the replicas that are up decide, from
// the cluster's record of which HAProxy nodes exist.
func TestLiveDecidesFromTheReplicasThatAreUp(t *testing.T) {
	now := time.Now()
	down := []api.ReplicaAnswer{{ID: "n1", Answered: true}, {ID: "n2", Answered: true}, {ID: "n3", Error: "connection refused"}}
	for _, tt := range []struct {
		name string
		view *api.HAProxiesView // nil: /v1/haproxies answers 404 (0.14.0)
		want string             // "": passes; "note:" a note; else the error says it
	}{
		{"every HAProxy seen by a live replica", &api.HAProxiesView{Recorded: true, Replicas: down, HAProxies: []api.HAProxyNode{
			{HAProxy: "10.0.0.1", LastSeen: now.Add(-10 * time.Second), SeenBy: map[string]time.Time{"n1": now}},
			{HAProxy: "10.0.0.2", LastSeen: now.Add(-5 * time.Minute)}, // stopped for good
		}}, "note:replica n3 (connection refused) did not answer"},
		{"one seen only by the dead replica", &api.HAProxiesView{Recorded: true, Replicas: down, HAProxies: []api.HAProxyNode{
			{HAProxy: "10.0.0.1", LastSeen: now.Add(-10 * time.Second), SeenBy: map[string]time.Time{"n1": now}},
			{HAProxy: "10.0.0.3", LastSeen: now.Add(-20 * time.Second)},
		}}, "HAProxy 10.0.0.3 (last poll 20s ago by the cluster's record; never seen by a live replica)"},
		{"seen only by the replica whose polls are missing, which answered the record's read", &api.HAProxiesView{Recorded: true,
			Replicas:  []api.ReplicaAnswer{{ID: "n1", Answered: true}, {ID: "n2", Answered: true}, {ID: "n3", Answered: true}},
			HAProxies: []api.HAProxyNode{{HAProxy: "10.0.0.4", LastSeen: now.Add(-10 * time.Second), SeenBy: map[string]time.Time{"n3": now}}},
		}, "HAProxy 10.0.0.4"},
		{"record not kept yet (rolling upgrade)", &api.HAProxiesView{Recorded: false, Replicas: down}, "every replica must answer"},
		{"a replica of 0.14.0", nil, "replica n3 unreachable"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != "/v1/haproxies" || tt.view == nil {
					http.NotFound(w, r)
					return
				}
				_ = json.NewEncoder(w).Encode(tt.view)
			}))
			defer srv.Close()
			note, err := replicaAt(t, srv.URL).Live(context.Background(), down)
			switch {
			case strings.HasPrefix(tt.want, "note:"):
				if err != nil || !strings.Contains(note, strings.TrimPrefix(tt.want, "note:")) {
					t.Fatalf("Live: %q, %v; want it to pass with a note %q", note, err, tt.want)
				}
			default:
				if !errors.Is(err, ctl.ErrCannotConfirm) || !strings.Contains(err.Error(), tt.want) {
					t.Fatalf("Live: %v; want cannot confirm saying %q", err, tt.want)
				}
			}
		})
	}
	// Every replica answered: nothing to ask.
	if note, err := replicaAt(t, "http://127.0.0.1:1").Live(context.Background(), down[:2]); err != nil || note != "" {
		t.Fatalf("Live with every replica answering: %q %v", note, err)
	}
}
