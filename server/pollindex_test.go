package server

import (
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/state"
)

// fillPollers records every source of srcs polling every server of
// servers once at at, told line.
func fillPollers(p *Pollers, srcs []*net.TCPAddr, servers []string, line string, at time.Time) {
	for _, s := range servers {
		for _, a := range srcs {
			p.Record(a, []byte(s), []byte(line), at)
		}
	}
}

func sources(n int) []*net.TCPAddr {
	out := make([]*net.TCPAddr, n)
	for i := range out {
		out[i] = &net.TCPAddr{IP: net.IPv4(10, 0, byte(i/250), byte(1+i%250)), Port: 4000}
	}
	return out
}

func serverNames(backends, per int) []string {
	var out []string
	for b := range backends {
		for s := range per {
			out = append(out, fmt.Sprintf("be%02d/s%02d", b, s))
		}
	}
	return out
}

// Sweep forgets the pairs older than its cut, and the servers left with
// none; a server swept and polled again is recorded anew; Len counts what
// is held.
func TestPollersSweepForgetsPairsAndServers(t *testing.T) {
	p := newPollers(t, PollersOptions{})
	t0 := time.Date(2026, 12, 7, 3, 0, 0, 0, time.UTC)
	srcs := sources(3)
	fillPollers(p, srcs, []string{"web/a", "web/b"}, "drain\n", t0)
	p.Record(srcs[0], []byte("web/a"), []byte("drain\n"), t0.Add(time.Minute))
	if p.Len() != 6 {
		t.Fatalf("Len %d, want 6", p.Len())
	}
	p.Sweep(t0.Add(time.Second))
	got := p.List(time.Time{})
	if len(got) != 1 || got[0].Server != "a" || got[0].HAProxy != "10.0.0.1" || got[0].Count != 2 {
		t.Fatalf("after Sweep: %+v, want only 10.0.0.1's poll of web/a (asked twice)", got)
	}
	if p.Len() != 1 {
		t.Errorf("Len %d after Sweep, want 1", p.Len())
	}
	if b := p.Backends(time.Time{}); len(b) != 1 || !b["web"] {
		t.Errorf("Backends %v, want web", b)
	}
	if rows, total := p.Select(time.Time{}, PollsArg{Selectors: []string{"web/b"}}, "n1"); len(rows) != 0 || total != 0 {
		t.Errorf("web/b after Sweep: %d rows, total %d; want none", len(rows), total)
	}
	// The swept server comes back with the next poll.
	p.Record(srcs[2], []byte("web/b"), []byte("ready 100%\n"), t0.Add(2*time.Minute))
	got = p.List(time.Time{})
	if len(got) != 2 || got[1].Server != "b" || got[1].Count != 1 || got[1].Answer != "ready 100%" {
		t.Fatalf("after a new poll of web/b: %+v", got)
	}
	p.Sweep(t0.Add(time.Hour))
	if p.Len() != 0 || len(p.List(time.Time{})) != 0 || len(p.sorted()) != 0 {
		t.Errorf("after sweeping everything: Len %d, %d polls, %d servers indexed", p.Len(), len(p.List(time.Time{})), len(p.sorted()))
	}
}

// The window of a read (since) leaves out older pairs before Sweep does.
func TestPollersReadsHonourSince(t *testing.T) {
	p := newPollers(t, PollersOptions{})
	t0 := time.Date(2026, 12, 7, 3, 0, 0, 0, time.UTC)
	srcs := sources(2)
	p.Record(srcs[0], []byte("web/a"), []byte("drain\n"), t0)
	p.Record(srcs[0], []byte("web/a"), []byte("drain\n"), t0)
	p.Record(srcs[1], []byte("web/a"), []byte("drain\n"), t0.Add(time.Minute))
	p.Record(srcs[1], []byte("web/a"), []byte("drain\n"), t0.Add(time.Minute))
	since := t0.Add(time.Second)
	if got := p.List(since); len(got) != 1 || got[0].HAProxy != "10.0.0.2" {
		t.Errorf("List(since) = %+v, want 10.0.0.2's poll only", got)
	}
	if s := p.Summary(since, SummaryArg{}); len(s.Servers) != 1 || len(s.Servers[0].Polls) != 1 {
		t.Errorf("Summary(since) = %+v, want one poll", s)
	}
	if got := p.Sightings(since, t0.Add(time.Minute)); len(got) != 1 || !got["10.0.0.2"].Equal(t0.Add(time.Minute)) {
		t.Errorf("Sightings(since) = %v, want 10.0.0.2 at %s", got, t0.Add(time.Minute))
	}
	if b := p.Backends(t0.Add(time.Hour)); len(b) != 0 {
		t.Errorf("Backends after every poll = %v, want none", b)
	}
}

// Sightings (the sources by position from one server to the next, found
// by look-up only where they differ) agree with the polls listed: every
// source that asked since since more than once over all servers, at its
// latest poll. Random tables whose servers share their sources, in order,
// or a random few of them, some IPv6, some polled once.
func TestSightingsAgreeWithThePolls(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 13, 0, 0, 0, time.UTC)
	srcs := sources(12)
	srcs = append(srcs, &net.TCPAddr{IP: net.ParseIP("::1")}, &net.TCPAddr{IP: net.ParseIP("fd00::7")})
	for seed := range uint64(40) {
		rng := rand.New(rand.NewPCG(seed, 46))
		p := newPollers(t, PollersOptions{})
		for _, s := range serverNames(4, 8) {
			for _, a := range srcs {
				if seed%2 == 1 && rng.IntN(3) == 0 {
					continue // this server is not polled by a
				}
				for range 1 + rng.IntN(2) {
					p.Record(a, []byte(s), []byte("ready 100%\n"), t0.Add(-time.Duration(rng.IntN(600))*time.Second))
				}
			}
		}
		since := t0.Add(-time.Duration(rng.IntN(600)) * time.Second)
		want := map[string]time.Time{}
		counts := map[string]uint64{}
		for _, pl := range p.List(since) {
			counts[pl.HAProxy] += pl.Count
			if pl.LastAsked.After(want[pl.HAProxy]) {
				want[pl.HAProxy] = pl.LastAsked
			}
		}
		for src, n := range counts {
			if n <= 1 {
				delete(want, src)
			}
		}
		if got := p.Sightings(since, t0); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("seed %d: Sightings %v, the polls listed %v", seed, got, want)
		}
	}
}

// Pages of /v1/pollers, followed by their cursor, read every poll once in
// cursor order (server, then HAProxy by its text, not its bytes), also
// with selectors; total counts the selected pairs held.
func TestPollersSelectPages(t *testing.T) {
	p := newPollers(t, PollersOptions{})
	now := time.Now()
	// 10.0.0.10 sorts before 10.0.0.2 as text.
	fillPollers(p, sources(12), serverNames(4, 5), "ready 100%\n", now)
	p.Record(&net.TCPAddr{IP: net.ParseIP("::1")}, []byte("be01/s03"), nil, now)
	for _, tc := range []struct {
		sels  []string
		limit int
	}{
		{nil, 7},
		{nil, 1},
		{[]string{"be01"}, 5},
		{[]string{"be0[13]/s0[24]", "be02/s01"}, 4},
		{[]string{"*/s03"}, 10},
		{[]string{"nothing"}, 3},
	} {
		t.Run(fmt.Sprintf("%v/%d", tc.sels, tc.limit), func(t *testing.T) {
			all, total := p.Select(time.Time{}, PollsArg{Selectors: tc.sels}, "n1")
			if total != len(all) {
				t.Errorf("total %d, want the %d polls selected", total, len(all))
			}
			f, _ := api.ParseFilter(tc.sels)
			want := 0
			for _, pl := range p.List(time.Time{}) {
				if f.Match(pl.Backend, pl.Server) {
					want++
				}
			}
			if len(all) != want {
				t.Fatalf("%d polls selected, want %d", len(all), want)
			}
			if !slices.IsSortedFunc(all, func(a, b api.Poll) int { return strings.Compare(api.PollCursor(a), api.PollCursor(b)) }) {
				t.Fatalf("not in cursor order: %+v", all)
			}
			var paged []api.Poll
			q := PollsArg{Selectors: tc.sels, Limit: tc.limit}
			for range 1000 {
				rows, tot := p.Select(time.Time{}, q, "n1")
				if tot != total || len(rows) > tc.limit {
					t.Fatalf("a page of %d rows (limit %d), total %d (want %d)", len(rows), tc.limit, tot, total)
				}
				paged = append(paged, rows...)
				if len(rows) < tc.limit {
					break
				}
				q.After = api.PollCursor(rows[len(rows)-1])
			}
			if !slices.Equal(paged, all) {
				t.Fatalf("pages read %d polls, want the %d of one read in order", len(paged), len(all))
			}
		})
	}
}

// A read of a few servers looks only at those: the walk visits the
// servers within the selectors' literal prefixes, not the table.
func TestPollersWalkVisitsOnlyTheSelectedRange(t *testing.T) {
	p := newPollers(t, PollersOptions{})
	fillPollers(p, sources(2), serverNames(50, 20), "drain\n", time.Now())
	for _, tc := range []struct {
		sels    []string
		visited int
	}{
		{[]string{"be07/s03"}, 1},
		{[]string{"be07"}, 20},
		{[]string{"be07/s1*", "be09/s00"}, 11},
		{[]string{"be4*"}, 200},
		{nil, 1000},
	} {
		f, err := api.ParseFilter(tc.sels)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		p.walk(f, "", func(*serverPolls, string, string) bool { n++; return true })
		if n != tc.visited {
			t.Errorf("%v: visited %d servers, want %d", tc.sels, n, tc.visited)
		}
	}
}

// Recording, reading every way and sweeping at once: run with -race. At
// the end the table holds each pair once with every poll counted, and
// every read saw pages in order.
func TestPollersConcurrentRecordReadSweep(t *testing.T) {
	p := newPollers(t, PollersOptions{})
	srcs := sources(20)
	servers := serverNames(10, 10)
	const perWorker = 2000
	t0 := time.Now()
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for i := range perWorker {
				a, s := srcs[r.IntN(len(srcs))], servers[r.IntN(len(servers))]
				line := []byte("drain\n")
				if i%3 == 0 {
					line = nil
				}
				p.Record(a, []byte(s), line, t0.Add(time.Duration(i)*time.Millisecond))
			}
		})
	}
	done := make(chan struct{})
	var readers sync.WaitGroup
	readers.Go(func() {
		untilClosed(done, func() {
			rows, _ := p.Select(time.Time{}, PollsArg{Limit: 50, After: "be05/s05"}, "n1")
			if !slices.IsSortedFunc(rows, func(a, b api.Poll) int { return strings.Compare(api.PollCursor(a), api.PollCursor(b)) }) {
				t.Error("a page out of cursor order")
			}
			_ = p.Summary(time.Time{}, SummaryArg{Selectors: []string{"be0[2-4]"}, Limit: 30})
			_ = p.Summary(time.Time{}, SummaryArg{Selectors: []string{"be0[5-7]"}, Counts: true})
			// /v1/state's read of its own table, in place.
			x := indexSummaries(nil, p.own(t0.Add(-time.Hour), time.Now().UnixMilli(), api.Filter{}))
			for i := range x.list {
				_, _ = x.told(&x.list[i], time.Now().UnixMilli())
				_ = x.fromHAProxy(&x.list[i], time.Now().UnixMilli())
			}
			_ = p.Sightings(time.Time{}, time.Now())
			_ = p.Backends(time.Time{})
		})
	})
	readers.Go(func() {
		untilClosed(done, func() { p.Sweep(t0.Add(-time.Hour)) }) // forgets nothing: every poll is newer
	})
	wg.Wait()
	close(done)
	readers.Wait()
	all := p.List(time.Time{})
	if p.Len() != len(all) {
		t.Errorf("Len %d, List %d", p.Len(), len(all))
	}
	var polls uint64
	seen := map[string]bool{}
	for _, pl := range all {
		polls += pl.Count
		k := pl.HAProxy + " " + pl.Backend + "/" + pl.Server
		if seen[k] {
			t.Errorf("pair %s twice", k)
		}
		seen[k] = true
	}
	if polls != 4*perWorker {
		t.Errorf("%d polls counted, want %d", polls, 4*perWorker)
	}
	// Once still, the table read in place counts what its summary does.
	since, nowMs := t0.Add(-time.Hour), time.Now().UnixMilli()
	inPlace := indexSummaries(nil, p.own(since, nowMs, api.Filter{}))
	summed := indexSummaries([]PollSummary{p.summary(since, nowMs, SummaryArg{})}, nil)
	for i := range summed.list {
		tgt := summed.list[i].t
		e := inPlace.find(tgt)
		if e == nil {
			t.Errorf("%v summarized, not in place", tgt)
			continue
		}
		a, ak := inPlace.told(e, nowMs)
		b, bk := summed.told(&summed.list[i], nowMs)
		if a.polled != b.polled || fmt.Sprint(a.answers, ak) != fmt.Sprint(b.answers, bk) {
			t.Errorf("%v in place: %d %v %v; summarized: %d %v %v", tgt, a.polled, a.answers, ak, b.polled, b.answers, bk)
		}
	}
	if len(inPlace.own.list) != len(summed.list) {
		t.Errorf("%d servers in place, %d summarized", len(inPlace.own.list), len(summed.list))
	}
	// Sweeping while recording: a pair recorded after the cut survives.
	var sw sync.WaitGroup
	cut := t0.Add(time.Hour)
	sw.Go(func() {
		for i := range 500 {
			p.Record(srcs[i%len(srcs)], []byte(servers[i%len(servers)]), []byte("maint\n"), cut.Add(time.Second))
		}
	})
	sw.Go(func() {
		for range 20 {
			p.Sweep(cut)
		}
	})
	sw.Wait()
	p.Sweep(cut)
	left := p.List(time.Time{})
	if p.Len() != len(left) || len(left) == 0 {
		t.Fatalf("after sweeping while recording: Len %d, %d polls", p.Len(), len(left))
	}
	for _, pl := range left {
		if pl.Answer != "maint" {
			t.Fatalf("a poll older than the cut survived: %+v", pl)
		}
	}
}

// The bound holds under concurrent new pairs: never more than Max pairs
// held, the rest counted as dropped.
func TestPollersBoundUnderConcurrency(t *testing.T) {
	p := newPollers(t, PollersOptions{Max: 100})
	srcs := sources(50)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range 100 {
				p.Record(srcs[(i+w)%len(srcs)], fmt.Appendf(nil, "b/s%d", i), []byte("drain\n"), time.Now())
			}
		})
	}
	wg.Wait()
	if n := len(p.List(time.Time{})); n != 100 || p.Len() != 100 {
		t.Errorf("%d pairs held (Len %d), want the bound 100", n, p.Len())
	}
}

// untilClosed calls f until done is closed.
func untilClosed(done <-chan struct{}, f func()) {
	for {
		select {
		case <-done:
			return
		default:
			f()
		}
	}
}

// compareCursors orders targets as their cursors do.
func TestCompareCursors(t *testing.T) {
	names := []string{"a/b", "a-x/a", "a/a", "ab/a", "a/", "b/a", "a.b/z", "a/b-c", "A/z"}
	for _, x := range names {
		for _, y := range names {
			bx, sx, _ := strings.Cut(x, "/")
			by, sy, _ := strings.Cut(y, "/")
			got := compareCursors(state.Target{Backend: bx, Server: sx}, state.Target{Backend: by, Server: sy})
			if want := strings.Compare(x, y); got != want {
				t.Errorf("compareCursors(%q, %q) = %d, want %d", x, y, got, want)
			}
		}
	}
}
