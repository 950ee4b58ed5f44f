package server

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/hastate/hastate/api"
)

// TestToldCacheAgreesWithTheWalk: the counts a server keeps (toldCounts)
// are, at every read, the counts of its polls walked at that time
// (countPolls, the walk /v1/state made before the cache), through 20,000
// random steps (randomPollSteps): polled, told, kept, whether one counts
// as an HAProxy, and the sources in the window.
func TestToldCacheAgreesWithTheWalk(t *testing.T) {
	kept, recounted := 0, 0
	randomPollSteps(t, 4, func(p *Pollers, servers []string, step int, since, at time.Time) {
		sinceNs, nowMs := since.UnixNano(), at.UnixMilli()
		for _, s := range servers {
			sh := &p.shards[shardOf([]byte(s))]
			sh.mu.RLock()
			sp := sh.m[s]
			sh.mu.RUnlock()
			if sp == nil {
				continue
			}
			sp.mu.Lock()
			hit := sp.told.holds(sinceNs, nowMs)
			c := sp.toldCounts(sinceNs, nowMs)
			var srcs []pollAddr
			sourceAddrs(c.sources.Value(), func(a pollAddr) { srcs = append(srcs, a) })
			got := fmt.Sprint(c.polled, counted(c.answers), counted(c.kept), c.fromHAProxy, srcs)
			want := fmt.Sprint(countPolls(sp.polls, sinceNs, nowMs))
			sp.mu.Unlock()
			if got != want {
				t.Fatalf("step %d, %s at %s, window from %s (cached: %v): counts %s, the walk %s", step, s, at, since, hit, got, want)
			}
			if hit {
				kept++
			} else {
				recounted++
			}
		}
	})
	if kept < 1000 || recounted < 1000 {
		t.Fatalf("reads from the cache %d, recounted %d: want both tried at least 1000 times", kept, recounted)
	}
	t.Logf("%d reads from the cache, %d recounted", kept, recounted)
}

// randomPollSteps runs 20,000 random steps over 3 servers and 6 sources,
// calling read at each read: records of the same answer (which keep the
// cache), of other answers and withheld ones, records out of order,
// single polls (manual probes within ProbeGrace), sweeps, and reads at
// times around PollerTTL and ProbeGrace from the polls, sometimes earlier
// than the last read, of a window that starts PollerWindow before the
// read or, for a while, a few seconds or a minute before it (so that
// polls leave it, and records land before it), or earlier than the last
// read's.
func randomPollSteps(t *testing.T, seed uint64, read func(p *Pollers, servers []string, step int, since, at time.Time)) {
	t.Helper()
	r := rand.New(rand.NewPCG(46, seed))
	p := newPollers(t, PollersOptions{})
	servers := []string{"web/a", "web/b", "api/x"}
	lines := [][]byte{nil, []byte("ready 100%\n"), []byte("drain\n"), []byte("ready 50%\n")}
	now := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	window := PollerWindow
	for step := range 20000 {
		switch k := r.IntN(10); {
		case k < 6: // a record, mostly of the answer the source was told
			src := &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(2+r.IntN(6)))}
			line := lines[1]
			if r.IntN(4) == 0 {
				line = lines[r.IntN(len(lines))]
			}
			at := now
			if r.IntN(20) == 0 {
				at = now.Add(-time.Duration(r.IntN(3000)) * time.Millisecond) // out of order
			}
			p.Record(src, []byte(servers[r.IntN(len(servers))]), line, at)
		case k < 7: // time passes: a little, or to either side of a bound
			bounds := []time.Duration{api.PollerTTL, api.ProbeGrace, time.Millisecond, 500 * time.Millisecond, 2 * time.Second}
			now = now.Add(bounds[r.IntN(len(bounds))] + time.Duration(r.IntN(3)-1)*time.Millisecond)
		case k < 8 && r.IntN(20) == 0:
			p.Sweep(now.Add(-time.Duration(r.IntN(90)) * time.Second))
		default: // a read, now or a little before
			at := now
			if r.IntN(10) == 0 {
				at = now.Add(-time.Duration(r.IntN(5000)) * time.Millisecond)
			}
			switch r.IntN(40) {
			case 0:
				window = PollerWindow
			case 1:
				window = time.Duration(r.IntN(4000)) * time.Millisecond
			case 2:
				window = api.PollerTTL + time.Duration(r.IntN(3)-1)*time.Millisecond
			}
			since := at.Add(-window)
			if r.IntN(20) == 0 {
				since = since.Add(-time.Duration(r.IntN(3000)) * time.Millisecond)
			}
			read(p, servers, step, since, at)
		}
	}
}

// countPolls counts polls as /v1/state and a peer's counts did before
// toldCache: of those asked since sinceNs, every polling one, by answer
// and, withheld, by kept answer; whether one counts as an HAProxy; and
// their sources.
func countPolls(polls []poll, sinceNs, nowMs int64) (int32, map[int32]int32, map[int32]int32, bool, []pollAddr) {
	var n int32
	answers, kept := map[int32]int32{}, map[int32]int32{}
	fromHAProxy := false
	var srcs []pollAddr
	for _, e := range polls {
		if e.last < sinceNs {
			continue
		}
		srcs = append(srcs, e.addr)
		fromHAProxy = fromHAProxy || e.merged().fromHAProxy(nowMs)
		if !e.merged().polling(nowMs) {
			continue
		}
		n++
		answers[int32(e.answer)]++
		if e.answer == 0 && e.kept != 0 {
			kept[int32(e.kept)]++
		}
	}
	return n, answers, kept, fromHAProxy, srcs
}

func counted(c []AnswerCount) map[int32]int32 {
	m := map[int32]int32{}
	for _, a := range c {
		m[a.Answer] += a.N
	}
	return maps.Clone(m)
}

// TestToldCacheDropsARecordBackInTime: a record older than the poll's
// last (two checks of one source, recorded out of order) makes the poll
// stop polling earlier than the counts kept said: they are counted again.
func TestToldCacheDropsARecordBackInTime(t *testing.T) {
	p := newPollers(t, PollersOptions{})
	src, req, line := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}, []byte("web/a"), []byte("ready 100%\n")
	t0 := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	p.Record(src, req, line, t0)
	p.Record(src, req, line, t0)
	sp := p.shards[shardOf(req)].m["web/a"]
	read := func(at time.Time) int32 {
		sp.mu.Lock()
		defer sp.mu.Unlock()
		return sp.toldCounts(t0.Add(-PollerWindow).UnixNano(), at.UnixMilli()).polled
	}
	if n := read(t0); n != 1 {
		t.Fatalf("polled %d at t0, want 1", n)
	}
	p.Record(src, req, line, t0.Add(-3*time.Second)) // its last is now t0-3s
	if n := read(t0.Add(api.PollerTTL - time.Second)); n != 0 {
		t.Fatalf("polled %d at t0-3s+TTL+2s, want 0: the counts of the newer record were kept", n)
	}
}

// TestToldCacheSummaryAgreesWithThePolls: a peer's counts
// (SummaryArg.Counts), taken from each server's kept counts, are at every
// read of randomPollSteps what its polls (the summary without Counts,
// copied from the table at that read) count: the servers, each one's
// sources in the window, polled, told, kept and whether one counts as an
// HAProxy.
func TestToldCacheSummaryAgreesWithThePolls(t *testing.T) {
	reads := 0
	randomPollSteps(t, 5, func(p *Pollers, _ []string, step int, since, at time.Time) {
		nowMs := at.UnixMilli()
		got := describeCounts(p.summary(since, nowMs, SummaryArg{Counts: true}))
		want := countSummary(p.summary(since, nowMs, SummaryArg{}), nowMs)
		if got != want {
			t.Fatalf("step %d at %s, window from %s: counts\n%s\nthe polls count\n%s", step, at, since, got, want)
		}
		reads++
	})
	if reads < 3000 {
		t.Fatalf("%d reads, want at least 3000", reads)
	}
}

// describeCounts is a summary of counts as text: per server its sources,
// polled, from HAProxy, and the answers told and kept by their text.
func describeCounts(s PollSummary) string {
	var b strings.Builder
	for _, sv := range s.Servers {
		c := sv.Counts
		var srcs []string
		for _, i := range s.SourceSets[c.Sources] {
			srcs = append(srcs, s.Sources[i])
		}
		told, kept := map[string]int32{}, map[string]int32{}
		for _, a := range c.Told {
			told[s.Answers[a.Answer]] += a.N
		}
		for _, a := range c.Kept {
			kept[s.Answers[a.Answer]] += a.N
		}
		fmt.Fprintf(&b, "%s/%s %v polled %d from HAProxy %v told %v kept %v\n", sv.Backend, sv.Server, srcs, c.Polled, c.FromHAProxy, told, kept)
	}
	return b.String()
}

// countSummary counts a summary of polls as describeCounts shows counts
// (mergedPoll's rules at nowMs).
func countSummary(s PollSummary, nowMs int64) string {
	out := PollSummary{Sources: s.Sources, Answers: s.Answers}
	for _, sv := range s.Servers {
		c := &ServerCounts{Sources: int32(len(out.SourceSets))}
		var set []int32
		for _, p := range sv.Polls {
			set = append(set, p.Source)
			m := mergedPoll{Count: p.Count, LastMs: p.LastMs}
			c.FromHAProxy = c.FromHAProxy || m.fromHAProxy(nowMs)
			if m.polling(nowMs) {
				c.Polled++
				c.Told = append(c.Told, AnswerCount{p.Answer, 1})
				if p.Answer == 0 && p.Kept != 0 {
					c.Kept = append(c.Kept, AnswerCount{p.Kept, 1})
				}
			}
		}
		out.SourceSets = append(out.SourceSets, set)
		out.Servers = append(out.Servers, ServerPolls{Backend: sv.Backend, Server: sv.Server, Counts: c})
	}
	return describeCounts(out)
}
