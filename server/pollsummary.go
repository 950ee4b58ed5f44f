package server

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
	"unique"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/internal/jsonstr"
	"github.com/hastate/hastate/state"
)

// The summary of a replica's polls is what /v1/state (scope=cluster, the
// status page) needs of each poll to count, per server, the HAProxy nodes
// that poll it and were told its answer: which source, when it last
// asked, what it was told (or kept) and whether it asked more than once.
// Sources and answers are interned once per answer, and each server's
// polls are packed (a few bytes each) instead of a JSON object per poll:
// at 200,000 pairs a peer's answer is about 1.5 MB instead of 30 MB, and
// neither side sorts or allocates per poll (cluster/DESIGN.md, "The
// operator path at fleet size"). The asker merges the replicas' summaries
// per (server, source): a source that polled one server through two
// replicas counts once, with its latest poll (MergeSummaries).

// PollSummaryQuery is the peer query (over the raft port) that answers a
// PollSummary for a SummaryArg. Releases before it answer null: they are
// asked PollsQuery, or "pollers", and their polls are summarized by the
// asker (SummarizePolls).
const PollSummaryQuery = "poll-summary"

// SummaryArg is PollSummaryQuery's argument: the selectors (none: all),
// After a server cursor (api.ServerCursor), and Limit the most polls an
// answer carries in whole servers (an answer holds every poll of each
// server it names; 0: all). With Counts, each server is answered as its
// counts (ServerCounts) instead of its polls, and Limit counts servers.
// A release before Counts ignores it and answers polls.
type SummaryArg struct {
	Selectors []string `json:"selectors,omitempty"`
	After     string   `json:"after,omitempty"`
	Limit     int      `json:"limit,omitempty"`
	Counts    bool     `json:"counts,omitempty"`
}

// PollSummary is one replica's polls of the selected servers, by server
// in cursor order.
type PollSummary struct {
	// Sources are the HAProxy addresses, Answers the answer lines
	// (without LF) that SourcePoll indexes; Answers[0] is "" (withheld,
	// or none kept).
	Sources []string
	Answers []string
	Servers []ServerPolls
	// SourceSets are the sets of sources that ServerCounts index, each
	// a list of indexes into Sources (an answer to SummaryArg.Counts).
	SourceSets [][]int32
	// Next, when not "", is the cursor of the last server of a cut
	// answer: ask again after it.
	Next string
}

// ServerPolls are the polls of one server, at most one per source, or,
// in an answer to SummaryArg.Counts, their counts.
type ServerPolls struct {
	Backend, Server string
	Polls           []SourcePoll
	Counts          *ServerCounts // not nil: stands for Polls
}

// ServerCounts are what /v1/state counts of one server's polls on one
// replica, counted there when it answered: which sources polled it (for
// the asker to tell whether a source polled it through another replica
// too, when the polls must be merged instead), how many of them poll it
// (mergedPoll.polling), whether one counts as an HAProxy
// (mergedPoll.fromHAProxy), and the answers those polling were told and,
// when withheld, keep.
type ServerCounts struct {
	Sources     int32 // index into PollSummary.SourceSets
	Polled      int32
	FromHAProxy bool
	Told, Kept  []AnswerCount
}

// AnswerCount is how many sources were told (or keep) one answer.
type AnswerCount struct {
	Answer int32 // index into PollSummary.Answers; 0: withheld (Told), none (Kept)
	N      int32
}

// SourcePoll is one source's polls of one server on one replica.
type SourcePoll struct {
	Source int32 // index into PollSummary.Sources
	Answer int32 // index into PollSummary.Answers; 0: withheld
	Kept   int32 // when withheld: the answer kept (index; 0: none)
	// Count is how often it asked, capped at 2: what the asker needs is
	// whether it asked more than once (api.Poll.FromHAProxy).
	Count uint32
	// LastMs is when it last asked, in Unix milliseconds (no pointer:
	// a summary of 200,000 polls is nothing for the collector to scan).
	LastMs int64
}

// Summary returns the pairs asked about since since of the servers
// q.Selectors match, after q.After, in at most q.Limit polls (whole
// servers; at least one server). It reads the servers it answers, in
// order, one server's lock at a time (the agent's Record takes the same
// lock), and allocates per server, not per poll. A bad selector selects
// nothing. Counts (SummaryArg.Counts) are taken now.
func (p *Pollers) Summary(since time.Time, q SummaryArg) PollSummary {
	return p.summary(since, time.Now().UnixMilli(), q)
}

// summary is Summary with counts taken at nowMs (Unix milliseconds).
func (p *Pollers) summary(since time.Time, nowMs int64, q SummaryArg) PollSummary {
	out := PollSummary{Sources: []string{}, Answers: []string{""}, Servers: []ServerPolls{}}
	f, err := api.ParseFilter(q.Selectors)
	if err != nil || p == nil {
		return out
	}
	w := summaryWriter{out: &out, p: p, answers: p.answers.Load(), srcs: map[pollAddr]int32{}, sets: map[unique.Handle[string]]int32{}}
	w.ansIdx = make([]int32, len(w.answers.lines)) // by interned id; 0: not yet in out
	at := since.UnixNano()
	var run srcRun
	source := w.source
	var buf []poll
	n := 0
	p.walk(f, q.After, func(sp *serverPolls, b, s string) bool {
		if sp.key == q.After {
			return true
		}
		var c *ServerCounts
		units := 1 // a server's counts
		if q.Counts {
			if c = w.countsOf(sp, at, nowMs); c == nil {
				return true
			}
		} else {
			if buf = sp.copyPolls(buf[:0], at); len(buf) == 0 {
				return true
			}
			units = len(buf)
		}
		if q.Limit > 0 && n > 0 && n+units > q.Limit {
			out.Next = out.Servers[len(out.Servers)-1].cursor()
			return false
		}
		n += units
		if c != nil {
			out.Servers = append(out.Servers, ServerPolls{Backend: b, Server: s, Counts: c})
			return true
		}
		polls := make([]SourcePoll, len(buf))
		for i, e := range buf {
			polls[i] = SourcePoll{Source: run.index(i, e.addr, source), Count: uint32(min(e.count, 2)), LastMs: e.last / int64(time.Millisecond), Answer: w.answer(e.answer)}
			if e.answer == 0 {
				polls[i].Kept = w.answer(e.kept)
			}
		}
		out.Servers = append(out.Servers, ServerPolls{Backend: b, Server: s, Polls: polls})
		return true
	})
	return out
}

// summaryWriter builds a PollSummary of a Pollers: its sources, answers
// and source sets interned as the servers come.
type summaryWriter struct {
	out     *PollSummary
	p       *Pollers
	answers *answerTable
	ansIdx  []int32 // by interned id: index in out.Answers; 0: not yet there
	srcs    map[pollAddr]int32
	sets    map[unique.Handle[string]]int32 // index in out.SourceSets
	// slab and counts are where countsOf cuts the counts from.
	slab   []ServerCounts
	counts []AnswerCount
}

// countsOf is sp's counts of its polls asked since sinceNs (Unix ns) at
// nowMs (Unix ms), nil when it has none in the window. They are the
// server's kept counts (toldCounts), counted again only when a record,
// a sweep or the clock changed them: a summary of every server costs
// the servers, not the pairs. Its source set is looked up by its
// interned key (servers polled by the same HAProxy nodes share one), its
// sources added once per set.
func (w *summaryWriter) countsOf(sp *serverPolls, sinceNs, nowMs int64) *ServerCounts {
	var toldBuf, keptBuf [4]AnswerCount // a server's HAProxy nodes were told one or two answers
	sp.mu.Lock()
	c := sp.toldCounts(sinceNs, nowMs)
	set, polled, fromHAProxy := c.sources, c.polled, c.fromHAProxy
	told, kept := append(toldBuf[:0], c.answers...), append(keptBuf[:0], c.kept...)
	sp.mu.Unlock()
	key := set.Value()
	if key == "" {
		return nil
	}
	// The counts are cut from slabs, not allocated one by one: a
	// summary of every server is 10,000 of them at 1,000,000 pairs.
	if len(w.slab) == cap(w.slab) {
		w.slab = make([]ServerCounts, 0, countsSlab)
	}
	w.slab = append(w.slab, ServerCounts{Polled: polled, FromHAProxy: fromHAProxy})
	sc := &w.slab[len(w.slab)-1]
	sc.Told, sc.Kept = w.answerCounts(told), w.answerCounts(kept)
	i, ok := w.sets[set]
	if !ok {
		i = int32(len(w.out.SourceSets))
		w.sets[set] = i
		l := make([]int32, 0, len(key)/sourceKeyLen)
		sourceAddrs(key, func(a pollAddr) { l = append(l, w.source(a)) })
		w.out.SourceSets = append(w.out.SourceSets, l)
	}
	sc.Sources = i
	return sc
}

// countsSlab is how many ServerCounts (and four times as many
// AnswerCounts) a summaryWriter allocates at once.
const countsSlab = 1024

// answerCounts is l with its answers as indexes in out.Answers, cut from
// w's slab of them (nil when l is empty).
func (w *summaryWriter) answerCounts(l []AnswerCount) []AnswerCount {
	if len(l) == 0 {
		return nil
	}
	if cap(w.counts)-len(w.counts) < len(l) {
		w.counts = make([]AnswerCount, 0, max(4*countsSlab, len(l)))
	}
	start := len(w.counts)
	for _, a := range l {
		w.counts = append(w.counts, AnswerCount{Answer: w.answer(uint16(a.Answer)), N: a.N})
	}
	return w.counts[start:len(w.counts):len(w.counts)]
}

// source is a's index in out.Sources, adding it.
func (w *summaryWriter) source(a pollAddr) int32 {
	si, ok := w.srcs[a]
	if !ok {
		si = int32(len(w.out.Sources))
		w.srcs[a] = si
		w.out.Sources = append(w.out.Sources, a.String())
	}
	return si
}

// answer is the index in out.Answers of the interned line id (0: 0),
// adding it; a line interned after the summary began is looked up in the
// table as it is now.
func (w *summaryWriter) answer(id uint16) int32 {
	if id == 0 {
		return 0
	}
	if int(id) >= len(w.ansIdx) {
		w.answers = w.p.answers.Load()
		w.ansIdx = append(w.ansIdx, make([]int32, len(w.answers.lines)-len(w.ansIdx))...)
	}
	return internID(w.answers, w.ansIdx, &w.out.Answers, id)
}

func addAnswer(c []AnswerCount, answer int32) []AnswerCount {
	for i := range c {
		if c[i].Answer == answer {
			c[i].N++
			return c
		}
	}
	return append(c, AnswerCount{answer, 1})
}

func (sp ServerPolls) cursor() string { return api.ServerCursor(sp.Backend, sp.Server) }

// internID returns the index in list of the table's line id (0: 0),
// adding it; idx maps ids to indexes (0: not yet added).
func internID(t *answerTable, idx []int32, list *[]string, id uint16) int32 {
	if id == 0 || int(id) >= len(idx) {
		return 0
	}
	if idx[id] == 0 {
		idx[id] = int32(len(*list))
		*list = append(*list, lineText(t, id))
	}
	return idx[id]
}

// intern returns the index of line (nil: 0) in list, adding it.
func intern(idx map[string]int32, list *[]string, line []byte) int32 {
	if line == nil {
		return 0
	}
	if i, ok := idx[string(line)]; ok {
		return i
	}
	i := int32(len(*list))
	idx[string(line)] = i
	*list = append(*list, strings.TrimSuffix(string(line), "\n"))
	return i
}

// AnswerSummary answers PollSummaryQuery: the polls within PollerWindow
// that the argument selects.
func (p *Pollers) AnswerSummary(raw json.RawMessage) any {
	var q SummaryArg
	if err := json.Unmarshal(raw, &q); err != nil {
		return PollSummary{Sources: []string{}, Answers: []string{""}, Servers: []ServerPolls{}}
	}
	return p.Summary(time.Now().Add(-PollerWindow), q)
}

// SummarizePolls is Summary over a list of polls (a peer's, from a
// release that answers polls, not summaries): those q selects, every one
// (an older peer's answer is not cut).
func SummarizePolls(polls []api.Poll, q SummaryArg) PollSummary {
	out := PollSummary{Sources: []string{}, Answers: []string{""}, Servers: []ServerPolls{}}
	f, err := api.ParseFilter(q.Selectors)
	if err != nil {
		return out
	}
	srcs, answers := map[string]int32{}, map[string]int32{"": 0}
	byServer := map[state.Target][]SourcePoll{}
	line := func(s string) []byte { return []byte(s + "\n") }
	for _, p := range polls {
		if !f.Match(p.Backend, p.Server) || (q.After != "" && api.ServerCursor(p.Backend, p.Server) <= q.After) {
			continue
		}
		si, ok := srcs[p.HAProxy]
		if !ok {
			si = int32(len(out.Sources))
			srcs[p.HAProxy] = si
			out.Sources = append(out.Sources, p.HAProxy)
		}
		sp := SourcePoll{Source: si, Count: uint32(min(p.Count, 2)), LastMs: p.LastAsked.UnixMilli()}
		if !p.Withheld {
			sp.Answer = intern(answers, &out.Answers, line(p.Answer))
		} else if p.Kept != "" {
			sp.Kept = intern(answers, &out.Answers, line(p.Kept))
		}
		t := state.Target{Backend: p.Backend, Server: p.Server}
		byServer[t] = append(byServer[t], sp)
	}
	for _, t := range slices.SortedFunc(maps.Keys(byServer), func(a, b state.Target) int {
		return strings.Compare(api.ServerCursor(a.Backend, a.Server), api.ServerCursor(b.Backend, b.Server))
	}) {
		out.Servers = append(out.Servers, ServerPolls{Backend: t.Backend, Server: t.Server, Polls: byServer[t]})
	}
	return out
}

// The wire form: the server's polls packed as uvarints (source, answer,
// kept, count, age in milliseconds before at), base64 in JSON.
// A server's counts (ServerCounts) are packed the same way in counts:
// source set, polled, from HAProxy (0 or 1), then the told answers and
// the kept ones, each as their number and (answer, count) pairs.
type wireSummary struct {
	At         int64        `json:"at_unix_ms"`
	Sources    []string     `json:"sources"`
	Answers    []string     `json:"answers"`
	Servers    []wireServer `json:"servers"`
	SourceSets [][]int32    `json:"source_sets,omitempty"`
	Next       string       `json:"next,omitempty"`
}

type wireServer struct {
	Backend string `json:"backend"`
	Server  string `json:"server"`
	Polls   []byte `json:"polls"`
	Counts  []byte `json:"counts,omitempty"`
}

// AppendJSONLine appends the wire form and a LF, as json.Encoder writes
// it (the raft port writes a peer's answer so, without scanning it again:
// raftport.LineAnswer). It writes by hand the bytes MarshalJSON writes
// (TestSummaryLineIsMarshalJSONs): the answer of counts of every server
// is what a replica holding a big table writes for each read of
// /v1/state or the status page on a peer, on the agent's CPU.
func (s PollSummary) AppendJSONLine(b []byte) []byte {
	return s.appendJSONLineAt(b, time.Now().UnixMilli())
}

// MarshalJSON writes the wire form.
func (s PollSummary) MarshalJSON() ([]byte, error) { return s.marshalAt(time.Now().UnixMilli()) }

// marshalAt is MarshalJSON at Unix millisecond at, by encoding/json.
func (s PollSummary) marshalAt(at int64) ([]byte, error) {
	w := wireSummary{At: at, Sources: s.Sources, Answers: s.Answers, Servers: make([]wireServer, len(s.Servers)), SourceSets: s.SourceSets, Next: s.Next}
	var buf []byte
	for i, sv := range s.Servers {
		buf = sv.pack(buf[:0], at)
		if sv.Counts != nil {
			w.Servers[i] = wireServer{Backend: sv.Backend, Server: sv.Server, Counts: slices.Clone(buf)}
			continue
		}
		w.Servers[i] = wireServer{Backend: sv.Backend, Server: sv.Server, Polls: slices.Clone(buf)}
	}
	return json.Marshal(w)
}

// pack appends sv's wire form to buf: its counts, or its polls with
// their ages before at.
func (sv ServerPolls) pack(buf []byte, at int64) []byte {
	if c := sv.Counts; c != nil {
		buf = binary.AppendUvarint(buf, uint64(c.Sources))
		buf = binary.AppendUvarint(buf, uint64(c.Polled))
		buf = binary.AppendUvarint(buf, uint64(b2i(c.FromHAProxy)))
		for _, l := range [][]AnswerCount{c.Told, c.Kept} {
			buf = binary.AppendUvarint(buf, uint64(len(l)))
			for _, a := range l {
				buf = binary.AppendUvarint(buf, uint64(a.Answer))
				buf = binary.AppendUvarint(buf, uint64(a.N))
			}
		}
		return buf
	}
	for _, p := range sv.Polls {
		buf = binary.AppendUvarint(buf, uint64(p.Source))
		buf = binary.AppendUvarint(buf, uint64(p.Answer))
		buf = binary.AppendUvarint(buf, uint64(p.Kept))
		buf = binary.AppendUvarint(buf, uint64(p.Count))
		buf = binary.AppendUvarint(buf, uint64(max(at-p.LastMs, 0)))
	}
	return buf
}

// appendJSONLineAt is AppendJSONLine at Unix millisecond at: marshalAt's
// bytes and a LF, written by hand. A server with neither counts nor
// polls (no replica answers one) leaves the whole line to encoding/json,
// whose null or "" for it depends on what was packed before.
func (s PollSummary) appendJSONLineAt(b []byte, at int64) []byte {
	for _, sv := range s.Servers {
		if sv.Counts == nil && len(sv.Polls) == 0 {
			j, err := s.marshalAt(at)
			if err != nil {
				return b
			}
			return append(append(b, j...), '\n')
		}
	}
	// One allocation for the line: a poll packs to about 10 bytes, 14 in
	// base64; a server's counts to a few.
	size := 64
	for _, sv := range s.Servers {
		size += 64 + len(sv.Backend) + len(sv.Server) + 16*len(sv.Polls)
	}
	b = slices.Grow(b, size)
	b = strconv.AppendInt(append(b, `{"at_unix_ms":`...), at, 10)
	b = appendJSONStrings(append(b, `,"sources":`...), s.Sources)
	b = appendJSONStrings(append(b, `,"answers":`...), s.Answers)
	b = append(b, `,"servers":[`...)
	var buf []byte
	for i, sv := range s.Servers {
		if i > 0 {
			b = append(b, ',')
		}
		b = jsonstr.Append(append(b, `{"backend":`...), sv.Backend)
		b = jsonstr.Append(append(b, `,"server":`...), sv.Server)
		if sv.Counts != nil {
			b = append(b, `,"polls":null,"counts":"`...)
		} else {
			b = append(b, `,"polls":"`...)
		}
		buf = sv.pack(buf[:0], at)
		b = append(base64.StdEncoding.AppendEncode(b, buf), `"}`...)
	}
	b = append(b, ']')
	if len(s.SourceSets) > 0 {
		b = append(b, `,"source_sets":[`...)
		for i, set := range s.SourceSets {
			if i > 0 {
				b = append(b, ',')
			}
			if set == nil {
				b = append(b, "null"...)
				continue
			}
			b = append(b, '[')
			for j, x := range set {
				if j > 0 {
					b = append(b, ',')
				}
				b = strconv.AppendInt(b, int64(x), 10)
			}
			b = append(b, ']')
		}
		b = append(b, ']')
	}
	if s.Next != "" {
		b = jsonstr.Append(append(b, `,"next":`...), s.Next)
	}
	return append(b, "}\n"...)
}

// appendJSONStrings appends l as encoding/json writes a []string.
func appendJSONStrings(b []byte, l []string) []byte {
	if l == nil {
		return append(b, "null"...)
	}
	b = append(b, '[')
	for i, x := range l {
		if i > 0 {
			b = append(b, ',')
		}
		b = jsonstr.Append(b, x)
	}
	return append(b, ']')
}

var errBadSummary = errors.New("poll summary: malformed polls")

// UnmarshalJSON reads the wire form; an index out of its table is an
// error. The form MarshalJSON writes is read in one pass without
// reflection (DecodeJSONLine); any other, with encoding/json.
func (s *PollSummary) UnmarshalJSON(b []byte) error {
	if s.DecodeJSONLine(b) {
		return nil
	}
	return s.unmarshalJSON(b)
}

// unmarshalJSON is UnmarshalJSON by encoding/json, of any form.
func (s *PollSummary) unmarshalJSON(b []byte) error {
	var w wireSummary
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	if len(w.Answers) == 0 {
		w.Answers = []string{""}
	}
	*s = PollSummary{Sources: w.Sources, Answers: w.Answers, Servers: make([]ServerPolls, len(w.Servers)), SourceSets: w.SourceSets, Next: w.Next}
	for _, set := range w.SourceSets {
		if err := checkSourceSet(set, len(w.Sources)); err != nil {
			return err
		}
	}
	for i, ws := range w.Servers {
		sv := ServerPolls{Backend: ws.Backend, Server: ws.Server}
		if len(ws.Counts) > 0 {
			c := &ServerCounts{}
			if _, err := unpackCounts(c, nil, ws.Counts, len(w.SourceSets), len(w.Answers)); err != nil {
				return fmt.Errorf("%w: server %s/%s: %v", errBadSummary, ws.Backend, ws.Server, err)
			}
			sv.Counts = c
			s.Servers[i] = sv
			continue
		}
		var err error
		if sv.Polls, err = unpackPolls(nil, ws.Polls, w.At, len(w.Sources), len(w.Answers)); err != nil {
			return fmt.Errorf("%w: server %s/%s%v", errBadSummary, ws.Backend, ws.Server, err)
		}
		s.Servers[i] = sv
	}
	return nil
}

// checkSourceSet reports a source set's index beyond sources.
func checkSourceSet(set []int32, sources int) error {
	for _, i := range set {
		if i < 0 || int(i) >= sources {
			return fmt.Errorf("%w: a source set names source %d of %d", errBadSummary, i, sources)
		}
	}
	return nil
}

// errPollCut and errPollBeyond are unpackPolls' errors, as they follow
// the server's name.
var (
	errPollCut    = errors.New("")
	errPollBeyond = errors.New(": an index beyond the tables")
)

// unpackPolls appends a server's packed polls (wireSummary) to dst, their
// indexes checked against the numbers of sources and answers, their
// times taken from at (Unix ms).
func unpackPolls(dst []SourcePoll, buf []byte, at int64, sources, answers int) ([]SourcePoll, error) {
	for len(buf) > 0 {
		var v [5]uint64
		for j := range v {
			x, n := binary.Uvarint(buf)
			if n <= 0 {
				return dst, errPollCut
			}
			v[j], buf = x, buf[n:]
		}
		if v[0] >= uint64(sources) || v[1] >= uint64(answers) || v[2] >= uint64(answers) {
			return dst, errPollBeyond
		}
		dst = append(dst, SourcePoll{Source: int32(v[0]), Answer: int32(v[1]), Kept: int32(v[2]),
			Count: uint32(min(v[3], 2)), LastMs: at - int64(v[4])})
	}
	return dst, nil
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// unpackCounts reads a server's packed counts (wireSummary) into c, their
// indexes checked against the numbers of source sets and answers; the
// told and kept answers are appended to pairs, and c's are slices of it.
func unpackCounts(c *ServerCounts, pairs []AnswerCount, buf []byte, sets, answers int) ([]AnswerCount, error) {
	next := func(bound int) (int32, error) {
		x, n := binary.Uvarint(buf)
		if n <= 0 || x >= uint64(bound) {
			return 0, errors.New("a count cut short or beyond the tables")
		}
		buf = buf[n:]
		return int32(x), nil
	}
	var err error
	var fromHAProxy int32
	if c.Sources, err = next(sets); err != nil {
		return pairs, err
	}
	if c.Polled, err = next(math.MaxInt32); err != nil {
		return pairs, err
	}
	if fromHAProxy, err = next(2); err != nil {
		return pairs, err
	}
	c.FromHAProxy = fromHAProxy == 1
	for _, l := range []*[]AnswerCount{&c.Told, &c.Kept} {
		k, err := next(answers + 1) // at most one pair per answer
		if err != nil {
			return pairs, err
		}
		start := len(pairs)
		for range k {
			var a AnswerCount
			if a.Answer, err = next(answers); err != nil {
				return pairs, err
			}
			if a.N, err = next(math.MaxInt32); err != nil {
				return pairs, err
			}
			pairs = append(pairs, a)
		}
		if k > 0 {
			*l = pairs[start:len(pairs):len(pairs)]
		}
	}
	if len(buf) > 0 {
		return pairs, errors.New("bytes after the counts")
	}
	return pairs, nil
}

// mergedPoll is one source's polls of one server over every replica: the
// latest answer (Withheld: none), what it keeps, whether it asked more
// than once.
type mergedPoll struct {
	Source, Answer, Kept string
	Withheld             bool
	Count                uint32
	LastMs               int64
}

// fromHAProxy and polling are api.Poll's rules (FromHAProxy, Polling) at
// now (Unix milliseconds).
func (m mergedPoll) fromHAProxy(nowMs int64) bool {
	return m.Count > 1 || nowMs-m.LastMs < api.ProbeGrace.Milliseconds()
}

func (m mergedPoll) polling(nowMs int64) bool {
	return m.fromHAProxy(nowMs) && nowMs-m.LastMs <= api.PollerTTL.Milliseconds()
}

// MergeSummaries merges replicas' summaries into, per server, one poll per
// source address, as api.MergePolls merges polls: the latest answer and
// time, what another replica told it when the latest is withheld without
// one, counts summed. It is the union of the sources, not a sum: a source
// that polled a server through two replicas (after a load balancer's
// failover) is one. (A view of a page merges only its servers:
// summaryIndex.)
func MergeSummaries(sums []PollSummary) map[state.Target][]mergedPoll {
	x := indexSummaries(sums, nil)
	out := make(map[state.Target][]mergedPoll, len(x.list))
	for i := range x.list {
		out[x.list[i].t] = x.polls(&x.list[i])
	}
	return out
}

// summaryIndex finds each server's polls in several replicas' summaries
// and merges a server's only when asked: a view of one page merges the
// servers of the page, not the table.
//
// It is a list in cursor order of every server some replica saw, each
// with its places in the summaries and its records in this replica's
// table, made once a read by merging the summaries (each in cursor order:
// a peer walks its index) with this replica's list (without summaries,
// it is that list): a view reads it in step with its rows, and finds a
// server's places once, not by a map look-up in each of the steps that
// need them (no map, no slice per server).
type summaryIndex struct {
	sums []PollSummary
	list []seenServer
	refs []sumRef // the places of list's servers (seenServer.at, n)
	// own, when not nil, is this replica's table read in place
	// (Pollers.own), beside the peers' summaries.
	own *ownPolls
}

// sumRef is one server's place in the summaries: sums[sum].Servers[server].
type sumRef struct{ sum, server int32 }

// seenServer is one server of summaryIndex.list: its places in the
// summaries, refs[at:at+n] (in the summaries' order, as they come), and
// its records in this replica's table (ownPolls.list).
type seenServer struct {
	t  state.Target
	sp *serverPolls // nil: not in this replica's list, or not read in place
	// fromHAProxy: one of sp's polls in the window counts as an
	// HAProxy at the read's time (ownPolls.fromHAProxy, from its kept
	// counts).
	fromHAProxy bool
	at, n       int32
}

// maxSummaryRuns is the most runs in cursor order (summaryRuns) the index
// merges in step; beyond it (summaries out of order) their places are
// sorted instead.
const maxSummaryRuns = 16

// indexSummaries indexes sums beside own (nil: none).
func indexSummaries(sums []PollSummary, own *ownPolls) summaryIndex {
	x := summaryIndex{sums: sums, own: own}
	var mine []seenServer
	if own != nil {
		mine = own.list
	}
	if len(sums) == 0 {
		x.list = mine
		return x
	}
	runs, n := x.summaryRuns()
	if len(runs) == 1 && len(mine) == 0 {
		// One run and none of this replica's servers (a replica whose
		// peers hold every poll): the places are the run, in its
		// order, and a server's are next to one another.
		x.refs = runs[0]
		x.list = make([]seenServer, 0, n)
		for i, r := range x.refs {
			t := x.target(r)
			if k := len(x.list) - 1; k >= 0 && x.list[k].t == t {
				x.list[k].n++
				continue
			}
			x.list = append(x.list, seenServer{t: t, at: int32(i), n: 1})
		}
		return x
	}
	x.refs = make([]sumRef, 0, n)
	x.list = make([]seenServer, 0, max(n, len(mine)))
	pos := make([]int, len(runs))
	for {
		// The least server at the heads of this replica's list and of
		// the runs; then every place of it, the runs in their order.
		var t state.Target
		found := len(mine) > 0
		if found {
			t = mine[0].t
		}
		for r, run := range runs {
			if pos[r] < len(run) {
				if h := x.target(run[pos[r]]); !found || (h != t && compareCursors(h, t) < 0) {
					t, found = h, true
				}
			}
		}
		if !found {
			return x
		}
		e := seenServer{t: t}
		if len(mine) > 0 && mine[0].t == t {
			e, mine = mine[0], mine[1:]
		}
		e.at = int32(len(x.refs))
		for r, run := range runs {
			for pos[r] < len(run) && x.target(run[pos[r]]) == t {
				x.refs = append(x.refs, run[pos[r]])
				pos[r]++
			}
		}
		e.n = int32(len(x.refs)) - e.at
		x.list = append(x.list, e)
	}
}

// summaryRuns returns the summaries' places, in their order, cut where
// the next server's cursor is less than the last's: a peer's summary,
// and its chunks one after another, are one run. Beyond maxSummaryRuns
// (a summary out of order) they are one run, sorted (stably: the places
// of one server keep their order). n is how many places.
func (x *summaryIndex) summaryRuns() (runs [][]sumRef, n int) {
	for _, s := range x.sums {
		n += len(s.Servers)
	}
	all := make([]sumRef, 0, n)
	start := 0
	for i, s := range x.sums {
		for j := range s.Servers {
			r := sumRef{int32(i), int32(j)}
			if len(all) > start && compareCursors(x.target(all[len(all)-1]), x.target(r)) > 0 {
				runs = append(runs, all[start:])
				start = len(all)
			}
			all = append(all, r)
		}
	}
	if len(all) > start {
		runs = append(runs, all[start:])
	}
	if len(runs) > maxSummaryRuns {
		slices.SortStableFunc(all, func(a, b sumRef) int { return compareCursors(x.target(a), x.target(b)) })
		runs = [][]sumRef{all}
	}
	return runs, n
}

// target is the server at r.
func (x *summaryIndex) target(r sumRef) state.Target {
	sv := &x.sums[r.sum].Servers[r.server]
	return state.Target{Backend: sv.Backend, Server: sv.Server}
}

// places is e's places in the summaries.
func (x *summaryIndex) places(e *seenServer) []sumRef { return x.refs[e.at : e.at+e.n] }

// find is t's entry in the list (nil: no replica saw it).
func (x *summaryIndex) find(t state.Target) *seenServer {
	i, ok := slices.BinarySearchFunc(x.list, t, func(e seenServer, t state.Target) int { return compareCursors(e.t, t) })
	if !ok {
		return nil
	}
	return &x.list[i]
}

// polls is MergeSummaries' answer for one server.
func (x *summaryIndex) polls(e *seenServer) []mergedPoll {
	refs := x.places(e)
	n := 0
	for _, r := range refs {
		n += len(x.sums[r.sum].Servers[r.server].Polls)
	}
	m := make([]mergedPoll, 0, n)
	seen := len(refs)
	if e.sp != nil {
		// This replica's first: of two polls as recent, the first
		// counts (foldSources), as when this replica was a summary
		// before its peers'.
		m = x.own.merged(m, e.sp)
		seen++
	}
	for _, r := range refs {
		s := &x.sums[r.sum]
		for _, p := range s.Servers[r.server].Polls {
			m = append(m, s.merged(p))
		}
	}
	if seen > 1 {
		m = foldSources(m)
	}
	return m
}

// seq yields e's merged polls; a server that one replica saw is read
// from its summary as it stands, without a copy.
func (x *summaryIndex) seq(e *seenServer) iter.Seq[mergedPoll] {
	refs := x.places(e)
	if len(refs) != 1 || e.sp != nil {
		return slices.Values(x.polls(e))
	}
	s := &x.sums[refs[0].sum]
	return func(yield func(mergedPoll) bool) {
		for _, p := range s.Servers[refs[0].server].Polls {
			if !yield(s.merged(p)) {
				return
			}
		}
	}
}

// told is toldOf over e's merged polls, without the answers by HAProxy.
// When the replicas that saw it saw it from different sources (apart), a
// source's polls are on one replica only and merging them changes
// nothing: each replica's are counted alone, by the summary's answer
// indexes or the counts it sent (no map operation per poll), and added.
func (x *summaryIndex) told(e *seenServer, nowMs int64) (toldAnswers, map[string]int) {
	if !x.apart(e) {
		return toldOf(x.seq(e), nowMs, false)
	}
	told, kept := toldAnswers{answers: map[string]int{}}, map[string]int{}
	for _, r := range x.places(e) {
		x.sums[r.sum].addTold(r.server, nowMs, &told, kept)
	}
	if e.sp != nil {
		x.own.addTold(e.sp, nowMs, &told, kept)
	}
	return told, kept
}

// apart reports whether e's polls need no merging: one replica saw it,
// or its peers answered counts and overlaps found no source in two
// replicas (the view asks for the polls of the servers it found).
func (x *summaryIndex) apart(e *seenServer) bool {
	refs := x.places(e)
	if len(refs)+b2i(e.sp != nil) <= 1 {
		return true
	}
	for _, r := range refs {
		if x.sums[r.sum].Servers[r.server].Counts != nil {
			return true
		}
	}
	return false
}

// addTold adds to told and kept the counts of s.Servers[i] at nowMs
// (the counts it carries, when it answered counts).
func (s *PollSummary) addTold(i int32, nowMs int64, told *toldAnswers, kept map[string]int) {
	sv := &s.Servers[i]
	if c := sv.Counts; c != nil {
		told.polled += int(c.Polled)
		for _, a := range c.Told {
			told.answers[s.Answers[a.Answer]] += int(a.N)
		}
		for _, a := range c.Kept {
			kept[s.Answers[a.Answer]] += int(a.N)
		}
		return
	}
	var toldBuf, keptBuf [4]AnswerCount // a server's HAProxy nodes were told one or two answers
	byAnswer, keptBy := toldBuf[:0], keptBuf[:0]
	for _, p := range sv.Polls {
		if !(mergedPoll{Count: p.Count, LastMs: p.LastMs}).polling(nowMs) {
			continue
		}
		told.polled++
		byAnswer = addAnswer(byAnswer, p.Answer) // 0, "": withheld
		if p.Answer == 0 && p.Kept != 0 {
			keptBy = addAnswer(keptBy, p.Kept)
		}
	}
	for _, a := range byAnswer {
		told.answers[s.Answers[a.Answer]] += int(a.N)
	}
	for _, a := range keptBy {
		kept[s.Answers[a.Answer]] += int(a.N)
	}
}

// fromHAProxy is summaryIndex.fromHAProxy for s.Servers[i] alone.
func (s *PollSummary) fromHAProxy(i int32, nowMs int64) bool {
	sv := &s.Servers[i]
	if sv.Counts != nil {
		return sv.Counts.FromHAProxy
	}
	for _, p := range sv.Polls {
		if (mergedPoll{Count: p.Count, LastMs: p.LastMs}).fromHAProxy(nowMs) {
			return true
		}
	}
	return false
}

// sources yields the sources of s.Servers[i].
func (s *PollSummary) sources(i int32) iter.Seq[string] {
	return func(yield func(string) bool) {
		sv := &s.Servers[i]
		if sv.Counts != nil {
			for _, src := range s.SourceSets[sv.Counts.Sources] {
				if !yield(s.Sources[src]) {
					return
				}
			}
			return
		}
		for _, p := range sv.Polls {
			if !yield(s.Sources[p.Source]) {
				return
			}
		}
	}
}

// overlaps returns the servers that a peer answered as counts and that
// a source polled through two replicas: their polls must be merged, and
// the view asks the peers for them (detail).
func (x *summaryIndex) overlaps() []state.Target {
	var out []state.Target
	seen := map[string]int{} // source: the replica it was seen through
	for i := range x.list {
		e := &x.list[i]
		refs := x.places(e)
		if len(refs)+b2i(e.sp != nil) <= 1 || !x.apart(e) {
			continue
		}
		clear(seen)
		over := false
		add := func(place int, src string) bool {
			if p, ok := seen[src]; ok && p != place {
				over = true
			}
			seen[src] = place
			return !over
		}
		for i, r := range refs {
			for src := range x.sums[r.sum].sources(r.server) {
				if !add(i, src) {
					break
				}
			}
		}
		if e.sp != nil && !over {
			for _, src := range x.own.sources(e.sp) {
				if !add(len(refs), src) {
					break
				}
			}
		}
		if over {
			out = append(out, e.t)
		}
	}
	return out
}

// detail replaces what the peers answered of the servers over by their
// polls in detail (the peers' answers to a SummaryArg without Counts); a
// peer that did not answer it counts for nothing there.
func (x *summaryIndex) detail(over []state.Target, detail []PollSummary) {
	want := make(map[state.Target][]sumRef, len(over))
	for _, t := range over {
		want[t] = nil
	}
	base := int32(len(x.sums))
	x.sums = append(x.sums, detail...)
	for i, s := range detail {
		for j, sv := range s.Servers {
			t := state.Target{Backend: sv.Backend, Server: sv.Server}
			if refs, ok := want[t]; ok && sv.Counts == nil {
				want[t] = append(refs, sumRef{base + int32(i), int32(j)})
			}
		}
	}
	for _, t := range over {
		if e := x.find(t); e != nil {
			e.at, e.n = int32(len(x.refs)), int32(len(want[t]))
			x.refs = append(x.refs, want[t]...)
		}
	}
}

// merged is p, of s, as a mergedPoll.
func (s *PollSummary) merged(p SourcePoll) mergedPoll {
	return mergedPoll{Source: s.Sources[p.Source], Answer: s.Answers[p.Answer], Withheld: p.Answer == 0,
		Kept: s.Answers[p.Kept], Count: p.Count, LastMs: p.LastMs}
}

// fromHAProxy reports whether any source of e counts as an HAProxy at
// nowMs (mergedPoll.fromHAProxy), merging only a server whose replicas
// saw a source in common (apart).
func (x *summaryIndex) fromHAProxy(e *seenServer, nowMs int64) bool {
	if x.apart(e) {
		for _, r := range x.places(e) {
			if x.sums[r.sum].fromHAProxy(r.server, nowMs) {
				return true
			}
		}
		return e.sp != nil && x.own.fromHAProxy(e.sp, nowMs)
	}
	for _, p := range x.polls(e) {
		if p.fromHAProxy(nowMs) {
			return true
		}
	}
	return false
}

// foldSources merges the polls of one source into one, in their order
// (api.MergePolls' rules: a later one wins only when strictly newer).
func foldSources(m []mergedPoll) []mergedPoll {
	slices.SortStableFunc(m, func(a, b mergedPoll) int { return strings.Compare(a.Source, b.Source) })
	out := m[:0]
	for _, p := range m {
		if len(out) == 0 || out[len(out)-1].Source != p.Source {
			out = append(out, p)
			continue
		}
		old := out[len(out)-1]
		newer, older := old, p
		if p.LastMs > old.LastMs {
			newer, older = p, old
		}
		if newer.Withheld && newer.Kept == "" {
			newer.Kept = older.Kept
			if !older.Withheld {
				newer.Kept = older.Answer
			}
		}
		newer.Count = min(old.Count+p.Count, 2)
		out[len(out)-1] = newer
	}
	return out
}

// ownPolls is this replica's own table as /v1/state reads it: in place,
// one server's lock at a time, instead of a summary of every poll (a
// summary of a million polls is tens of MB of garbage a read, which the
// agent's checks pay for in the collector's assists). A server that no
// peer saw is counted over its records without a copy; one that a peer
// saw too is merged as its polls (ownPolls.merged).
type ownPolls struct {
	p *Pollers
	// list is the servers f selects with a poll in the window, in cursor
	// order (the walk's): a view merges it with the keyed servers and
	// reads it in step with its rows, without a map of every server.
	list  []seenServer // not in summaries: no places
	since int64        // Unix ns: polls older than it are not read
	texts []string     // the answer lines by interned id, without LF ("": 0)
	srcs  map[pollAddr]string
}

// own returns the servers f selects that were asked about since since,
// read in place at nowMs (Unix ms; nil Pollers: none). Each server is
// locked once, and what the view needs of it for its total and order
// (whether a poll is in the window, whether one counts as an HAProxy)
// is read from its kept counts (toldCounts), not from its polls.
func (p *Pollers) own(since time.Time, nowMs int64, f api.Filter) *ownPolls {
	o := &ownPolls{p: p, since: since.UnixNano(), srcs: map[pollAddr]string{}}
	if p == nil {
		return o
	}
	t := p.answers.Load()
	o.texts = make([]string, len(t.lines))
	for id := range t.lines {
		o.texts[id] = lineText(t, uint16(id))
	}
	if f.All() {
		o.list = make([]seenServer, 0, len(p.sorted()))
	}
	// The walk visits each server once, in key order, which is the
	// cursors' (its backend is the key up to its first "/"): the list is
	// in cursor order without a sort.
	p.walk(f, "", func(sp *serverPolls, b, s string) bool {
		sp.mu.Lock()
		c := sp.toldCounts(o.since, nowMs)
		recent, fromHAProxy := c.sources.Value() != "", c.fromHAProxy // a source in the window: a poll in it
		sp.mu.Unlock()
		if recent {
			o.list = append(o.list, seenServer{t: state.Target{Backend: b, Server: s}, sp: sp, fromHAProxy: fromHAProxy})
		}
		return true
	})
	return o
}

// text is the answer line id without its LF ("" for 0).
func (o *ownPolls) text(id uint16) string {
	if int(id) >= len(o.texts) { // interned after own began
		return lineText(o.p.answers.Load(), id)
	}
	return o.texts[id]
}

// merged appends sp's polls as mergedPolls to m (a Summary's, without
// the summary): the count capped at 2, the time in milliseconds.
func (o *ownPolls) merged(m []mergedPoll, sp *serverPolls) []mergedPoll {
	sp.each(o.since, func(e *poll) bool {
		mp := e.merged()
		mp.Source, mp.Answer, mp.Withheld = o.source(e.addr), o.text(e.answer), e.answer == 0
		if e.answer == 0 {
			mp.Kept = o.text(e.kept)
		}
		m = append(m, mp)
		return true
	})
	return m
}

// fromHAProxy is summaryIndex.fromHAProxy over sp's records alone.
func (o *ownPolls) fromHAProxy(sp *serverPolls, nowMs int64) bool {
	found := false
	sp.each(o.since, func(e *poll) bool {
		found = e.merged().fromHAProxy(nowMs)
		return !found
	})
	return found
}

// merged is e's count and time as a summary carries them (the count
// capped at 2, the time in milliseconds).
func (e *poll) merged() mergedPoll {
	return mergedPoll{Count: min(e.count, 2), LastMs: e.last / int64(time.Millisecond)}
}

// addTold is PollSummary.addTold over sp's records: counted by
// interned answer under sp's lock (toldCounts: kept while they hold),
// without a copy or an allocation per poll.
func (o *ownPolls) addTold(sp *serverPolls, nowMs int64, told *toldAnswers, kept map[string]int) {
	var toldBuf, keptBuf [4]AnswerCount // a server's HAProxy nodes were told one or two answers
	sp.mu.Lock()
	c := sp.toldCounts(o.since, nowMs)
	told.polled += int(c.polled)
	byAnswer, keptBy := append(toldBuf[:0], c.answers...), append(keptBuf[:0], c.kept...)
	sp.mu.Unlock()
	for _, a := range byAnswer {
		told.answers[o.text(uint16(a.Answer))] += int(a.N)
	}
	for _, a := range keptBy {
		kept[o.text(uint16(a.Answer))] += int(a.N)
	}
}

// sources returns the sources of sp's polls.
func (o *ownPolls) sources(sp *serverPolls) []string {
	var out []string
	sp.each(o.since, func(e *poll) bool {
		out = append(out, o.source(e.addr))
		return true
	})
	return out
}

// source is a's text, made once.
func (o *ownPolls) source(a pollAddr) string {
	src, ok := o.srcs[a]
	if !ok {
		src = a.String()
		o.srcs[a] = src
	}
	return src
}
