//go:build !race

package confirm

import (
	"testing"
	"time"

	"github.com/hastate/hastate/state"
)

// TestServingAllocs: the agent's read of the serving snapshot, withhold
// check included, allocates nothing, answering or withholding.
func TestServingAllocs(t *testing.T) {
	_, ms := cluster(t, 1, nil, false, nil)
	n := ms[0].reads
	m := state.NewMirror()
	m.ApplyAt(state.Change{Set: map[string]string{"state/web/a": "drain"}}, time.Now(), state.RampPolicy{})
	ms[0].state.serving.Store(m.Snapshot())
	n.withheld.set(withholdCatchingUp, false)
	req := []byte("web/a")
	// A bit no loop sets or clears, so the test owns it.
	const testReason = withholdEnd
	for _, withheld := range []bool{false, true} {
		n.withheld.set(testReason, withheld)
		var line []byte
		if allocs := testing.AllocsPerRun(1000, func() { line = n.Serving().Lookup(req, 3) }); allocs != 0 {
			t.Errorf("withheld %v: Serving().Lookup allocates %v times, want 0", withheld, allocs)
		}
		if (line == nil) != withheld {
			t.Errorf("withheld %v: answer %q", withheld, line)
		}
	}
	n.withheld.set(testReason, false)
}

// TestConfirmWaitAllocs: a check's side of the confirmation (take the
// round's notifier, ask for a round, wait with a pooled timer) allocates
// nothing; rounds allocate per batch, in the loop.
func TestConfirmWaitAllocs(t *testing.T) {
	var c confirmer
	c.init(time.Now())
	done := newReadNotifier()
	close(done.done)
	c.next.Store(done)
	if allocs := testing.AllocsPerRun(1000, func() {
		if !c.await(time.Second) {
			t.Fatal("a confirmed round reads as not confirmed")
		}
	}); allocs != 0 {
		t.Errorf("await allocates %v times per check, want 0", allocs)
	}
	pending := newReadNotifier()
	c.next.Store(pending)
	if allocs := testing.AllocsPerRun(100, func() {
		if c.await(time.Microsecond) {
			t.Fatal("a round in flight reads as confirmed")
		}
	}); allocs != 0 {
		t.Errorf("await that times out allocates %v times per check, want 0", allocs)
	}
}
