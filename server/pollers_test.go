package server

import (
	"github.com/hastate/hastate/api"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func newPollers(t *testing.T, o PollersOptions) *Pollers {
	t.Helper()
	p, err := NewPollers(o)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPollersRecordAndList(t *testing.T) {
	p := newPollers(t, PollersOptions{})
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	v4 := &net.TCPAddr{IP: net.ParseIP("127.0.0.2"), Port: 4000}
	v6 := &net.TCPAddr{IP: net.ParseIP("::1"), Port: 4000}
	p.Record(v4, []byte("web/a"), []byte("drain\n"), t0)
	p.Record(v4, []byte("web/a"), []byte("ready 100%\n"), t0.Add(time.Second))
	p.Record(v6, []byte("web/a"), nil, t0)
	p.Record(v4, []byte("api/x"), []byte("maint\n"), t0)

	got := p.List(time.Time{})
	if len(got) != 3 {
		t.Fatalf("List = %+v", got)
	}
	want := []api.Poll{
		{HAProxy: "127.0.0.2", Backend: "api", Server: "x", LastAsked: t0, Answer: "maint", Count: 1},
		{HAProxy: "127.0.0.2", Backend: "web", Server: "a", LastAsked: t0.Add(time.Second), Answer: "ready 100%", Count: 2},
		{HAProxy: "::1", Backend: "web", Server: "a", LastAsked: t0, Withheld: true, Count: 1},
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("poll %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	if n := len(p.List(t0.Add(time.Second))); n != 1 {
		t.Errorf("List(since) = %d pairs, want 1", n)
	}
	p.Sweep(t0.Add(time.Second))
	if p.Len() != 1 {
		t.Errorf("after Sweep: %d pairs, want 1", p.Len())
	}
}

// At the bound a new pair is dropped and counted; pairs already known are
// still updated, and the gauge shows the table's size.
func TestPollersBounded(t *testing.T) {
	reg := prometheus.NewRegistry()
	p := newPollers(t, PollersOptions{Max: 2, Registerer: reg})
	a := &net.TCPAddr{IP: net.ParseIP("127.0.0.1")}
	for _, s := range []string{"b/1", "b/2", "b/3", "b/4", "b/3", "b/1"} {
		p.Record(a, []byte(s), []byte("drain\n"), time.Now())
	}
	if p.Len() != 2 {
		t.Fatalf("%d pairs kept, want the bound 2", p.Len())
	}
	if got := p.List(time.Time{}); len(got) != 2 || got[0].Server != "1" || got[0].Count != 2 {
		t.Errorf("List = %+v, want b/1 (asked twice) and b/2", got)
	}
	want := `
# HELP hastate_pollers_entries (HAProxy, server) pairs this replica remembers in its poller table (per replica; at most --pollers-max).
# TYPE hastate_pollers_entries gauge
hastate_pollers_entries 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "hastate_pollers_entries"); err != nil {
		t.Error(err)
	}
	if n := testutil.ToFloat64(p.dropped); n != 3 {
		t.Errorf("hastate_pollers_dropped_total = %v, want 3 (b/3 twice, b/4)", n)
	}
	if n, err := testutil.GatherAndCount(reg, "hastate_pollers_dropped_total"); err != nil || n != 1 {
		t.Errorf("hastate_pollers_dropped_total registered %d times (%v), want once", n, err)
	}
}

func TestNewPollersOptions(t *testing.T) {
	if p := newPollers(t, PollersOptions{}); p.max != DefaultMaxPollers {
		t.Errorf("zero Max: bound %d, want DefaultMaxPollers", p.max)
	}
	if _, err := NewPollers(PollersOptions{Max: -1}); err == nil || !strings.Contains(err.Error(), "--pollers-max") {
		t.Errorf("negative Max: %v, want an error naming --pollers-max", err)
	}
	reg := prometheus.NewRegistry()
	newPollers(t, PollersOptions{Registerer: reg})
	if n, _ := testutil.GatherAndCount(reg); n != 2 {
		t.Errorf("%d metric families registered, want 2", n)
	}
	func() { // one registry per replica: a second table is a programming error
		defer func() {
			if recover() == nil {
				t.Error("a second table on one registry registered its metrics twice")
			}
		}()
		_, _ = NewPollers(PollersOptions{Registerer: reg})
	}()
}

func TestPollersRecordKnownPairDoesNotAllocate(t *testing.T) {
	p := newPollers(t, PollersOptions{Registerer: prometheus.NewRegistry()})
	a := &net.TCPAddr{IP: net.ParseIP("127.0.0.1"), Port: 1}
	req, line := []byte("canary_web/gke-cny-web"), []byte("drain\n")
	now := time.Now()
	p.Record(a, req, line, now)
	if n := testing.AllocsPerRun(1000, func() { p.Record(a, req, line, now) }); n != 0 {
		t.Fatalf("Record of a known pair allocates %v times", n)
	}
	full := newPollers(t, PollersOptions{Max: 1})
	full.Record(a, req, line, now)
	other := []byte("canary_web/gke-cny-api")
	if n := testing.AllocsPerRun(1000, func() { full.Record(a, other, line, now) }); n != 0 {
		t.Fatalf("Record of a pair dropped at the bound allocates %v times", n)
	}
	var nilP *Pollers
	nilP.Record(a, req, line, now) // a nil record is a no-op
}

// A withheld answer keeps, in Kept, the last answer that HAProxy was told:
// what it keeps (issue 27.3).
func TestPollersKeepWhatAWithheldHAProxyKeeps(t *testing.T) {
	p := newPollers(t, PollersOptions{})
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	ha := &net.TCPAddr{IP: net.ParseIP("127.0.0.2"), Port: 4000}
	p.Record(ha, []byte("web/a"), []byte("ready 40%\n"), t0)
	p.Record(ha, []byte("web/a"), nil, t0.Add(time.Second))
	p.Record(ha, []byte("web/a"), nil, t0.Add(2*time.Second))
	got := p.List(time.Time{})
	if len(got) != 1 || !got[0].Withheld || got[0].Kept != "ready 40%" || got[0].Answer != "" {
		t.Fatalf("List = %+v, want one withheld poll that keeps ready 40%%", got)
	}
	p.Record(ha, []byte("web/a"), []byte("drain\n"), t0.Add(3*time.Second))
	if got := p.List(time.Time{}); got[0].Kept != "" || got[0].Answer != "drain" {
		t.Errorf("answered again: %+v, want answer drain and no kept", got[0])
	}
}
