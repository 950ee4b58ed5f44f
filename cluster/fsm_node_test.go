package cluster

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/hastate/hastate/cluster/fsm"
	"github.com/hastate/hastate/internal/testenv"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestReplicaRestartsOverRejectedEntries: a replica whose raft log holds
// entries the FSM rejects (among them issue 7's divide-by-zero) replays them
// at start, comes back ready and serves.
func TestReplicaRestartsOverRejectedEntries(t *testing.T) {
	n := startLeader(t, Options{})
	o := n.opts
	ctx := context.Background()
	if err := n.ApplyKV(ctx, 1, map[string]string{"state/web/b": "maint"}); err != nil {
		t.Fatal(err)
	}
	// Written straight into the log, as an older leader that did not
	// validate them would have.
	for _, data := range testenv.Lines(t, "fsm/testdata/rejected-entries.jsonl") { // the FSM's own fixture
		if err := n.raft.Apply(data, 5*time.Second).Error(); err != nil {
			t.Fatal(err)
		}
	}
	if got := testutil.ToFloat64(n.metrics.applyErrors); got != 5 {
		t.Errorf("hastate_fsm_apply_errors_total = %v, want 5", got)
	}
	if err := n.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}

	n2 := startNode(t, o)
	testenv.Eventually(t, 10*time.Second, func() error { ok, _ := n2.Ready(); return testenv.Expect(ok, "restarted node not ready") })
	// Ready is not enough: the log must have been replayed through the
	// rejected entries (raft applies them once the leader commits again).
	if err := n2.ApplyKV(ctx, 9, map[string]string{"state/web/b": "maint", "state/web/a": "drain"}); err != nil {
		t.Fatal(err)
	}
	for req, want := range map[string]string{"web/a": "drain\n", "web/b": "maint\n", "web/c": "ready 100%\n"} {
		if got := answer(n2.Node, req); got != want {
			t.Errorf("after restart %s answers %q, want %q", req, got, want)
		}
	}
	if got := testutil.ToFloat64(n2.metrics.applyErrors); got != 5 {
		t.Errorf("after replay hastate_fsm_apply_errors_total = %v, want 5 (each rejected entry replayed once)", got)
	}
}

// entry encodes a command as raft log data, as the leader writes it.
func entry(t testing.TB, c fsm.Command) []byte {
	t.Helper()
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
