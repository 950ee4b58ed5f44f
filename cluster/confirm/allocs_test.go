//go:build !race

package confirm

import (
	"testing"
	"time"

	"github.com/hastate/hastate/state"
	"github.com/prometheus/client_golang/prometheus/testutil"
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
		if !c.await(c.arrive(), time.Second) {
			t.Fatal("a confirmed round reads as not confirmed")
		}
	}); allocs != 0 {
		t.Errorf("await allocates %v times per check, want 0", allocs)
	}
	pending := newReadNotifier()
	c.next.Store(pending)
	if allocs := testing.AllocsPerRun(100, func() {
		if c.await(c.arrive(), time.Microsecond) {
			t.Fatal("a round in flight reads as confirmed")
		}
	}); allocs != 0 {
		t.Errorf("await that times out allocates %v times per check, want 0", allocs)
	}
}

// TestArrivalAllocs: a check's arrival taken at accept (Arrived, carried
// in an interface value as the agent server does) and its confirmation
// (ConfirmedSince) allocate nothing. (The round itself, which allocates
// per batch in the loop, has ended here.)
func TestArrivalAllocs(t *testing.T) {
	_, ms := cluster(t, 1, nil, false, nil)
	n := ms[0].reads
	n.withheld.set(withholdCatchingUp, false)
	ms[0].state.serving.Store(state.NewMirror().Snapshot())
	done := newReadNotifier()
	close(done.done)
	n.conf.next.Store(done)
	if allocs := testing.AllocsPerRun(1000, func() {
		var arrival any = n.Arrived()
		a, _ := arrival.(Arrival)
		if a.nr != done {
			t.Fatal("the arrival is not the next round's")
		}
		if n.ConfirmedSince(a) == nil {
			t.Fatal("a check whose round confirmed was answered nothing")
		}
	}); allocs != 0 {
		t.Errorf("Arrived and ConfirmedSince allocate %v times per check, want 0", allocs)
	}
}

// TestWithheldCheckAllocsAndCounts: every check Confirmed answers nothing
// is counted under why, without allocating: the first withhold reason in
// force, a round that did not confirm in time, or no state held.
func TestWithheldCheckAllocsAndCounts(t *testing.T) {
	_, ms := cluster(t, 1, nil, false, func(o *Options) { o.Timeout = 10 * time.Millisecond })
	n := ms[0].reads
	count := func(reason string) float64 { return testutil.ToFloat64(n.m.withheldVec.WithLabelValues(reason)) }
	// Catching up (from start): counted as catching_up.
	if allocs := testing.AllocsPerRun(100, func() { n.Confirmed() }); allocs != 0 {
		t.Errorf("a withheld check allocates %v times", allocs)
	}
	if got := count("catching_up"); got < 100 {
		t.Errorf("catching_up counted %v checks, want every one", got)
	}
	// No round runs (no loop started): confirm_timeout.
	n.withheld.set(withholdCatchingUp, false)
	n.Confirmed()
	if got := count("confirm_timeout"); got != 1 {
		t.Errorf("confirm_timeout counted %v, want 1", got)
	}
	// Confirmed, but no state held: no_state.
	startRounds(ms[0])
	if s := n.Confirmed(); s != nil || count("no_state") != 1 {
		t.Errorf("a confirmed check without state: %v, no_state counted %v, want nil and 1", s, count("no_state"))
	}
}

// TestAnswerLineDecodeAllocs: reading a round's answer line allocates
// its strings and nothing else (the id; a read-index error too).
func TestAnswerLineDecodeAllocs(t *testing.T) {
	for _, c := range []struct {
		line string
		want float64
		read func([]byte) bool
	}{
		{`{"id":"replica-2","term":12,"seq":987654321}` + "\n", 1, func(l []byte) bool { var a ackAnswer; return a.DecodeJSONLine(l) }},
		{`{"id":"replica-2","index":1234567}` + "\n", 1, func(l []byte) bool { var a readIndexAnswer; return a.DecodeJSONLine(l) }},
		{`{"id":"replica-2","error":"not the leader"}` + "\n", 2, func(l []byte) bool { var a readIndexAnswer; return a.DecodeJSONLine(l) }},
	} {
		line := []byte(c.line)
		if allocs := testing.AllocsPerRun(1000, func() {
			if !c.read(line) {
				t.Fatalf("%q not read", line)
			}
		}); allocs != c.want {
			t.Errorf("%q: read in %v allocations, want %v (its strings)", line, allocs, c.want)
		}
	}
}
