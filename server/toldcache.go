package server

import (
	"math"

	"github.com/hastate/hastate/api"
)

// A /v1/state row says how many HAProxy nodes poll its server and how
// many were told each answer (toldAnswers). Counted over the polls on
// every read, a read of every server of a 1M-pair table walked the
// million; the agent's checks shared the CPU with that walk. A server's
// counts change only when a record changes what a counted poll says (a
// new source, another answer or kept answer, a second poll that makes a
// source an HAProxy), when Sweep removes polls, or when time passes a
// poll's PollerTTL (or a single poll's ProbeGrace). So each server keeps
// its counts (toldCache) with the time until which they hold, and a
// record that only refreshes a counted poll with the same answer, as an
// HAProxy's every check does, keeps them.
// TestToldCacheAgreesWithTheWalk checks the cache against a count over
// the polls, through random records, sweeps and clocks.

// toldCache is a server's counts of its polls as polling at atMs: how
// many poll it, by the answer they were last told (0: withheld), and the
// withheld ones by the answer they keep. Valid while ok and a read's time
// is at most untilMs. Guarded by the serverPolls' mutex.
type toldCache struct {
	ok      bool
	atMs    int64
	untilMs int64
	polled  int32
	answers []AnswerCount
	kept    []AnswerCount
}

// keeps reports whether a record at (Unix ns) that leaves e with answer
// and kept leaves the counts as they are: e counted as polling with that
// answer and kept, and made no older. (It stays polling, a second poll
// only making it an HAProxy for longer, and untilMs, from its older
// time, stays a bound.)
func (c *toldCache) keeps(e *poll, at int64, answer, kept uint16) bool {
	return c.ok && at >= e.last && e.answer == answer && e.kept == kept && e.merged().polling(c.atMs)
}

// toldCounts returns sp's counts at nowMs (Unix ms), counted again when
// the cache no longer holds. The slices are sp's: read them under sp.mu.
func (sp *serverPolls) toldCounts(nowMs int64) *toldCache {
	c := &sp.told
	if c.ok && nowMs >= c.atMs && nowMs <= c.untilMs {
		return c
	}
	c.ok, c.atMs, c.untilMs, c.polled = true, nowMs, math.MaxInt64, 0
	c.answers, c.kept = c.answers[:0], c.kept[:0]
	ttl, grace := api.PollerTTL.Milliseconds(), api.ProbeGrace.Milliseconds()
	for i := range sp.polls {
		m := sp.polls[i].merged()
		if !m.polling(nowMs) {
			continue // it polls again only by a record, which drops the cache
		}
		// polling holds while nowMs-LastMs <= ttl and, for a single poll,
		// nowMs-LastMs < grace.
		until := m.LastMs + ttl
		if m.Count < 2 {
			until = min(until, m.LastMs+grace-1)
		}
		c.untilMs = min(c.untilMs, until)
		e := &sp.polls[i]
		c.polled++
		c.answers = addAnswer(c.answers, int32(e.answer))
		if e.answer == 0 && e.kept != 0 {
			c.kept = addAnswer(c.kept, int32(e.kept))
		}
	}
	return c
}
