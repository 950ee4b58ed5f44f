package server

import (
	"net"
	"testing"
	"time"
)

func TestPollersRecordAndList(t *testing.T) {
	p := NewPollers(0)
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
	want := []Poll{
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

func TestPollersBounded(t *testing.T) {
	p := NewPollers(2)
	a := &net.TCPAddr{IP: net.ParseIP("127.0.0.1")}
	for _, s := range []string{"b/1", "b/2", "b/3"} {
		p.Record(a, []byte(s), []byte("drain\n"), time.Now())
	}
	if p.Len() != 2 {
		t.Fatalf("%d pairs kept, want the bound 2", p.Len())
	}
}

func TestPollersRecordKnownPairDoesNotAllocate(t *testing.T) {
	p := NewPollers(0)
	a := &net.TCPAddr{IP: net.ParseIP("127.0.0.1"), Port: 1}
	req, line := []byte("canary_web/gke-cny-web"), []byte("drain\n")
	now := time.Now()
	p.Record(a, req, line, now)
	if n := testing.AllocsPerRun(1000, func() { p.Record(a, req, line, now) }); n != 0 {
		t.Fatalf("Record of a known pair allocates %v times", n)
	}
	var nilP *Pollers
	nilP.Record(a, req, line, now) // a nil record is a no-op
}
