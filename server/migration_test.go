package server

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/state"
)

// TestMigrationShown: a marked migration (the mirrored marker key) is in
// /v1/state and in the status page's header; none, no line.
func TestMigrationShown(t *testing.T) {
	m := state.NewMirror()
	m.Apply(state.Change{Set: map[string]string{"state/web/a": "drain"}})
	snap := m.Snapshot()
	marker := ""
	h := NewHTTPHandler(HTTPOptions{Replica: &fakeReplica{
		snap:  func() *state.Snapshot { return snap },
		ready: func() (bool, string) { return true, "" },
	}, Raw: func(key string) (string, bool) {
		return marker, key == state.MigrationKey && marker != ""
	}})
	for _, tt := range []struct{ marker, want string }{
		{"", ""},
		{`{"started":"2026-12-02T01:00:00Z","by":"alice","reason":"gstg rollout"}`, "migration from the per-node agent marked since 2026-12-02 01:00:00 UTC by alice: gstg rollout"},
		{"yes", "migration from the per-node agent marked (migration marker \"yes\" is not the JSON"},
	} {
		marker = tt.marker
		code, body := get(t, h, "/v1/state")
		var v api.StateView
		if err := json.Unmarshal([]byte(body), &v); code != http.StatusOK || err != nil {
			t.Fatalf("/v1/state: %d %v", code, err)
		}
		_, page := get(t, h, "/")
		switch {
		case tt.want == "" && (v.Migration != nil || strings.Contains(page, `id="migration"`)):
			t.Errorf("no marker: /v1/state migration %+v, page shows a migration line", v.Migration)
		case tt.want != "" && (v.Migration == nil || !strings.Contains(v.Migration.String(), tt.want) || !strings.Contains(page, `id="migration"`)):
			t.Errorf("marker %q: /v1/state migration %v; page has the line: %v", tt.marker, v.Migration, strings.Contains(page, `id="migration"`))
		}
	}
}
