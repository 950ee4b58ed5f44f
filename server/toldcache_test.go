package server

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"testing"
	"time"

	"github.com/hastate/hastate/api"
)

// TestToldCacheAgreesWithTheWalk: the counts a server keeps (toldCounts)
// are, at every read, the counts of its polls walked at that time
// (countPolls, the walk /v1/state made before the cache), through 20,000
// random steps over 3 servers and 6 sources: records of the same answer
// (which keep the cache), of other answers and withheld ones, records out
// of order, single polls (manual probes within ProbeGrace), sweeps, and
// reads at times around PollerTTL and ProbeGrace from the polls, and
// sometimes earlier than the last read.
func TestToldCacheAgreesWithTheWalk(t *testing.T) {
	r := rand.New(rand.NewPCG(46, 4))
	p := newPollers(t, PollersOptions{})
	servers := []string{"web/a", "web/b", "api/x"}
	lines := [][]byte{nil, []byte("ready 100%\n"), []byte("drain\n"), []byte("ready 50%\n")}
	base := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	now := base
	kept, recounted := 0, 0
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
			nowMs := at.UnixMilli()
			for _, s := range servers {
				sh := &p.shards[shardOf([]byte(s))]
				sh.mu.RLock()
				sp := sh.m[s]
				sh.mu.RUnlock()
				if sp == nil {
					continue
				}
				sp.mu.Lock()
				hit := sp.told.ok && nowMs >= sp.told.atMs && nowMs <= sp.told.untilMs
				c := sp.toldCounts(nowMs)
				got := fmt.Sprint(c.polled, counted(c.answers), counted(c.kept))
				polled, answers, keptBy := countPolls(sp.polls, nowMs)
				want := fmt.Sprint(polled, answers, keptBy)
				sp.mu.Unlock()
				if got != want {
					t.Fatalf("step %d, %s at %s (cached: %v): counts %s, the walk %s", step, s, at.Sub(base), hit, got, want)
				}
				if hit {
					kept++
				} else {
					recounted++
				}
			}
		}
	}
	if kept < 1000 || recounted < 1000 {
		t.Fatalf("reads from the cache %d, recounted %d: want both tried at least 1000 times", kept, recounted)
	}
	t.Logf("%d reads from the cache, %d recounted", kept, recounted)
}

// countPolls counts polls as /v1/state did before toldCache: every
// polling one, by answer and, withheld, by kept answer.
func countPolls(polls []poll, nowMs int64) (int32, map[int32]int32, map[int32]int32) {
	var n int32
	answers, kept := map[int32]int32{}, map[int32]int32{}
	for _, e := range polls {
		if !e.merged().polling(nowMs) {
			continue
		}
		n++
		answers[int32(e.answer)]++
		if e.answer == 0 && e.kept != 0 {
			kept[int32(e.kept)]++
		}
	}
	return n, answers, kept
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
		return sp.toldCounts(at.UnixMilli()).polled
	}
	if n := read(t0); n != 1 {
		t.Fatalf("polled %d at t0, want 1", n)
	}
	p.Record(src, req, line, t0.Add(-3*time.Second)) // its last is now t0-3s
	if n := read(t0.Add(api.PollerTTL - time.Second)); n != 0 {
		t.Fatalf("polled %d at t0-3s+TTL+2s, want 0: the counts of the newer record were kept", n)
	}
}
