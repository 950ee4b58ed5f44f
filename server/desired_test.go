package server

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/hastate/hastate/state"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// Every server the replica knows has one answer series, labelled as
// HAProxy's exporter labels it: a server with a key of its own, and one an
// HAProxy polls (a backend-wide key's server, a server at the default).
// The backend-wide key itself, a server probed once, and a server polled
// before the window have none; the change time is exported where known,
// for DesiredChangedWindow.
func TestDesiredCollector(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	now := t0.Add(time.Hour)
	m := state.NewMirror()
	m.ApplyAt(state.Change{Set: map[string]string{
		"state/web/a": "drain", "state/web/b": "maint", "state/web/c": "40%", "state/web/d": "bad",
		"state/api/*": "drain", "state/web/old": "drain",
	}}, now.Add(-DesiredChangedWindow+time.Second), state.RampPolicy{})
	// A change older than DesiredChangedWindow has no change time.
	m.ApplyAt(state.Change{Set: map[string]string{"state/web/old": "maint"}}, t0, state.RampPolicy{})
	snap := m.Snapshot()
	p := newPollers(t, PollersOptions{})
	h := &net.TCPAddr{IP: net.ParseIP("127.0.0.2"), Port: 4000}
	for _, at := range []time.Time{now.Add(-2 * time.Second), now.Add(-time.Second)} {
		p.Record(h, []byte("api/x"), []byte("drain\n"), at)      // under the backend-wide key
		p.Record(h, []byte("web/e"), []byte("ready 100%\n"), at) // no key: the default
		p.Record(h, []byte("old/f"), []byte("ready 100%\n"), at.Add(-time.Hour))
	}
	p.Record(h, []byte("web/typo"), []byte("ready 100%\n"), now) // a manual probe asks once
	c := NewDesiredCollector(DesiredOptions{Snapshot: func() *state.Snapshot { return snap }, Pollers: p, Now: func() time.Time { return now }})
	want := `
# HELP hastate_desired_answer ` + desiredAnswerHelp + `
# TYPE hastate_desired_answer gauge
hastate_desired_answer{proxy="api",server="x",state="drain"} 0
hastate_desired_answer{proxy="web",server="a",state="drain"} 0
hastate_desired_answer{proxy="web",server="b",state="maint"} 0
hastate_desired_answer{proxy="web",server="c",state="weight"} 40
hastate_desired_answer{proxy="web",server="d",state="withheld"} 0
hastate_desired_answer{proxy="web",server="e",state="ready"} 100
hastate_desired_answer{proxy="web",server="old",state="maint"} 0
# HELP hastate_desired_changed_timestamp_seconds ` + desiredChangedHelp + `
# TYPE hastate_desired_changed_timestamp_seconds gauge
hastate_desired_changed_timestamp_seconds{proxy="api",server="x"} 1.796043001e+09
hastate_desired_changed_timestamp_seconds{proxy="web",server="a"} 1.796043001e+09
hastate_desired_changed_timestamp_seconds{proxy="web",server="b"} 1.796043001e+09
hastate_desired_changed_timestamp_seconds{proxy="web",server="c"} 1.796043001e+09
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
	// A replica that holds no state exports nothing (not "ready").
	none := NewDesiredCollector(DesiredOptions{Snapshot: func() *state.Snapshot { return nil }, Pollers: p})
	if n := testutil.CollectAndCount(none); n != 0 {
		t.Fatalf("a replica without state exports %d series, want 0", n)
	}
}
