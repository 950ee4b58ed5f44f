package cluster

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hastate/hastate/internal/testenv"
	"github.com/hastate/hastate/state"
)

func weightOf(n *Node, req string) int {
	a := answer(n, req)
	if !strings.HasPrefix(a, "ready ") {
		return -1
	}
	w, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(a, "ready "), "%\n"))
	return w
}

// The ramp engine moves with the leader: a ramp started under one leader
// keeps rising under the next, never steps back, and ends at 100%.
func TestRampContinuesAcrossLeaderChange(t *testing.T) {
	policy := state.RampPolicy{Start: 10, Duration: 3 * time.Second, Interval: 300 * time.Millisecond, Aggression: 1}
	nodes := startCluster(t, func(_ int, o *Options) { o.Ramp = policy })
	testenv.Eventually(t, 10*time.Second, func() error { return testenv.Expect(leaderOf(nodes) != nil, "no leader") })
	ctx := context.Background()
	applyOnLeader(t, nodes, 1, map[string]string{"state/web/a": "drain"})
	l := applyOnLeader(t, nodes, 2, map[string]string{})
	// The ramp's clock is the entry's own timestamp (the leader's time when
	// it wrote the entry), not the test's: ApplyKV returns a moment later.
	ramps := l.Snapshot().Ramps()
	if len(ramps) != 1 {
		t.Fatalf("ramps after the undrain: %+v, want one", ramps)
	}
	start := ramps[0].Started
	last := map[*testNode]int{}
	for _, n := range nodes {
		last[n] = -1 // drain, or no answer yet
	}
	handedOver := false
	for {
		done := true
		for _, n := range nodes {
			if handedOver && n == l {
				// Stopped. Not raft.State(): raft can report Candidate
				// after Shutdown when its election timer fires at once.
				continue
			}
			w := weightOf(n.Node, "web/a")
			if w < last[n] {
				t.Fatalf("%s: weight went down from %d to %d", n.opts.ID, last[n], w)
			}
			last[n] = w
			done = done && w == 100
		}
		if done {
			break
		}
		if !handedOver && last[l] >= 40 {
			// Leader goes away mid-ramp.
			if err := l.Shutdown(ctx); err != nil {
				t.Fatal(err)
			}
			handedOver = true
		}
		if time.Since(start) > 15*time.Second {
			byID := map[string]int{}
			for n, w := range last {
				byID[n.opts.ID] = w
			}
			t.Fatalf("ramp did not finish: weights %v (stopped leader %s)", byID, l.opts.ID)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !handedOver {
		t.Fatal("the leader was never stopped mid-ramp")
	}
	took := time.Since(start)
	if took < policy.Duration {
		t.Fatalf("ramp finished in %s, before its duration %s", took, policy.Duration)
	}
	t.Logf("ramp of %s finished in %s across a leader change", policy.Duration, took)
	for _, n := range nodes {
		if n.Node != l.Node && len(n.Snapshot().Ramps()) != 0 {
			t.Fatalf("%s still has ramps", n.opts.ID)
		}
	}
}

func TestRampPolicyFromKV(t *testing.T) {
	base := state.RampPolicy{Start: 10, Duration: time.Hour, Interval: time.Minute, Aggression: 1}
	nodes := startCluster(t, func(_ int, o *Options) { o.Ramp = base })
	testenv.Eventually(t, 10*time.Second, func() error { return testenv.Expect(leaderOf(nodes) != nil, "no leader") })
	kv := map[string]string{"state/web/a": "drain", RampConfigKey: `{"start":"50%","duration":"1h"}`}
	applyOnLeader(t, nodes, 1, kv)
	delete(kv, "state/web/a")
	l := applyOnLeader(t, nodes, 2, kv)
	if w := weightOf(l.Node, "web/a"); w != 50 {
		t.Fatalf("weight %d, want the KV policy's start 50", w)
	}
	// An invalid policy is ignored: the flags apply.
	kv = map[string]string{"state/web/b": "drain", RampConfigKey: `{"start":"lots"}`}
	applyOnLeader(t, nodes, 3, kv)
	delete(kv, "state/web/b")
	l = applyOnLeader(t, nodes, 4, kv)
	if w := weightOf(l.Node, "web/b"); w != 10 {
		t.Fatalf("weight %d, want the flags' start 10", w)
	}
	// While a migration from the per-node agent is marked, an undrain is
	// not ramped, whatever the policy says: the agent restores full weight
	// at once, and both must serve the same answer (noRampWhile).
	mig := state.MarshalMigration(state.Migration{Started: time.Now(), By: "test"})
	kv = map[string]string{"state/web/c": "drain", RampConfigKey: `{"start":"50%","duration":"1h"}`, state.MigrationKey: mig}
	applyOnLeader(t, nodes, 5, kv)
	delete(kv, "state/web/c")
	l = applyOnLeader(t, nodes, 6, kv)
	if w := weightOf(l.Node, "web/c"); w != 100 {
		t.Fatalf("weight %d during a marked migration, want 100 at once (no ramp)", w)
	}
}
