package server

import (
	"encoding/binary"
	"math"
	"unique"

	"github.com/hastate/hastate/api"
)

// A /v1/state row says how many HAProxy nodes poll its server and how
// many were told each answer (toldAnswers); a peer's poll-summary of
// counts (SummaryArg.Counts) says the same and, besides, which sources
// polled the server within the window and whether one counts as an
// HAProxy. Counted over the polls on every read, a read of every server
// of a 1M-pair table walked the million; the agent's checks shared the
// CPU with that walk. A server's counts change only when a record changes
// what a counted poll says (a new source, another answer or kept answer,
// a second poll that makes a source an HAProxy), when Sweep removes
// polls, when time passes a poll's PollerTTL (or a single poll's
// ProbeGrace), or when the window's start passes a poll. So each server
// keeps its counts (toldCache) with the times until which they hold, and
// a record that only refreshes a counted poll with the same answer, as an
// HAProxy's every check does, keeps them.
// TestToldCacheAgreesWithTheWalk checks the cache against a count over
// the polls, and TestSummaryCountsAgreeWithThePolls a peer's counts
// against its polls, through random records, sweeps, clocks and windows.

// toldCache is a server's counts of its polls asked since sinceNs (Unix
// ns, the window's start), as polling at atMs: how many poll it, by the
// answer they were last told (0: withheld), the withheld ones by the
// answer they keep, whether one counts as an HAProxy (fromHAProxy), and
// their sources (sources: sourceKey, interned: the servers polled by the
// same HAProxy nodes share one). Valid while ok, a read's time is from
// atMs to untilMs and its window starts from sinceNs to sinceUntil (the
// oldest poll in the window: a later start leaves it out). Guarded by the
// serverPolls' mutex.
type toldCache struct {
	ok          bool
	fromHAProxy bool
	sinceNs     int64
	sinceUntil  int64
	atMs        int64
	untilMs     int64
	polled      int32
	sources     unique.Handle[string]
	answers     []AnswerCount
	kept        []AnswerCount
}

// keeps reports whether a record at (Unix ns) that leaves e with answer
// and kept leaves the counts as they are: e counted as polling with that
// answer and kept, in the window, and made no older. (It stays polling
// and in the window, a second poll only making it an HAProxy for longer;
// untilMs and sinceUntil, from its older time, stay bounds; and
// fromHAProxy, true since e polls, stays true.)
func (c *toldCache) keeps(e *poll, at int64, answer, kept uint16) bool {
	return c.ok && at >= e.last && e.answer == answer && e.kept == kept && e.merged().polling(c.atMs) &&
		e.last >= c.sinceNs
}

// holds reports whether the counts hold for a read at nowMs (Unix ms) of
// the polls asked since sinceNs (Unix ns).
func (c *toldCache) holds(sinceNs, nowMs int64) bool {
	return c.ok && nowMs >= c.atMs && nowMs <= c.untilMs && sinceNs >= c.sinceNs && sinceNs <= c.sinceUntil
}

// toldCounts returns sp's counts at nowMs (Unix ms) of its polls asked
// since sinceNs (Unix ns), counted again when the cache no longer holds.
// The slices are sp's: read them under sp.mu.
func (sp *serverPolls) toldCounts(sinceNs, nowMs int64) *toldCache {
	c := &sp.told
	if c.holds(sinceNs, nowMs) {
		return c
	}
	c.ok, c.fromHAProxy, c.sinceNs, c.sinceUntil, c.atMs, c.untilMs, c.polled = true, false, sinceNs, math.MaxInt64, nowMs, math.MaxInt64, 0
	c.answers, c.kept = c.answers[:0], c.kept[:0]
	ttl, grace := api.PollerTTL.Milliseconds(), api.ProbeGrace.Milliseconds()
	var keyBuf [16 * sourceKeyLen]byte // 16 sources on the stack
	key := keyBuf[:0]
	for i := range sp.polls {
		e := &sp.polls[i]
		if e.last < sinceNs {
			continue // it enters the window only by a record, which drops the cache
		}
		c.sinceUntil = min(c.sinceUntil, e.last)
		key = e.addr.appendKey(key)
		m := e.merged()
		// fromHAProxy holds while its poll is in the window: a second
		// poll (sinceUntil), or a single poll within ProbeGrace, which
		// polls (its bound is untilMs's, below).
		c.fromHAProxy = c.fromHAProxy || m.fromHAProxy(nowMs)
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
		c.polled++
		c.answers = addAnswer(c.answers, int32(e.answer))
		if e.answer == 0 && e.kept != 0 {
			c.kept = addAnswer(c.kept, int32(e.kept))
		}
	}
	c.sources = unique.Make(string(key))
	return c
}

// sourceKeyLen is the bytes of one address in a source set's key.
const sourceKeyLen = 17

// appendKey appends a's key (sourceKeyLen bytes) to b.
func (a pollAddr) appendKey(b []byte) []byte {
	b = binary.BigEndian.AppendUint64(b, a.hi)
	b = binary.BigEndian.AppendUint64(b, a.lo)
	return append(b, a.n)
}

// sourceAddrs yields the addresses of a source set's key, in order.
func sourceAddrs(key string, fn func(pollAddr)) {
	for ; len(key) >= sourceKeyLen; key = key[sourceKeyLen:] {
		fn(pollAddr{hi: binary.BigEndian.Uint64([]byte(key[:8])), lo: binary.BigEndian.Uint64([]byte(key[8:16])), n: key[16]})
	}
}
