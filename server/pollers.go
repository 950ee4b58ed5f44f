package server

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hastate/hastate/api"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Pollers remembers, for every HAProxy address and server it asked about,
// when it last asked and what it was told. It answers /v1/pollers and lets
// `hastate wait` know when every HAProxy has seen a change. Safe for
// concurrent use.
//
// The table is indexed by server (server/DESIGN.md): a server's polls sit
// together, one small fixed-size record per source with no pointer in it
// (about 40 bytes; the collector does not scan them), and the answer lines
// are interned. Recording a poll takes a shard's read lock for one map
// look-up and then the server's own lock; recording a probe that was seen
// before allocates nothing. Readers never hold a shard's lock while they
// read polls: they walk a sorted index of the servers (rebuilt only after
// servers came or went) and hold one server's lock at a time, so that a
// reader of the whole table never stands between a check and its record,
// and a read of a few servers, or of one page, costs what it returns.
type Pollers struct {
	shards [pollerShards]serverShard
	// answers interns the answer lines (copy on write: Record reads it
	// without a lock); answersMu orders the writers.
	answers   atomic.Pointer[answerTable]
	answersMu sync.Mutex
	index     serverIndex
	pairs     atomic.Int64 // pairs held
	max       int
	dropped   prometheus.Counter
}

const pollerShards = 64

// serverShard holds the servers whose name hashes to it.
type serverShard struct {
	mu sync.RWMutex
	m  map[string]*serverPolls // by "backend/server"
}

// serverPolls are one server's polls, one per source, sorted by address.
type serverPolls struct {
	key string // "backend/server", its ServerCursor
	mu  sync.Mutex
	// gone: Sweep removed the server from its shard; Record looks it
	// up again.
	gone  bool
	polls []poll
	last  int64 // its latest poll, Unix ns
	// told caches what /v1/state counts of polls (toldCounts), so that
	// a read of every server costs the servers, not the pairs.
	told toldCache
}

// poll is one source's polls of one server: no pointer, 40 bytes.
type poll struct {
	last   int64  // Unix ns
	count  uint32 // saturates
	answer uint16 // interned line; 0: withheld
	kept   uint16 // the last answer not withheld; 0: none
	addr   pollAddr
}

// pollAddr is a source address: its bytes (an IPv4 address in the first
// four) and its length (0: none, 4 or 16). Compared as numbers: a binary
// search among a server's sources is a few integer comparisons.
type pollAddr struct {
	hi, lo uint64
	n      uint8
}

func (a pollAddr) compare(b pollAddr) int {
	if c := cmp.Compare(a.hi, b.hi); c != 0 {
		return c
	}
	if c := cmp.Compare(a.lo, b.lo); c != 0 {
		return c
	}
	return cmp.Compare(a.n, b.n)
}

// String is the address as /v1/pollers shows it ("" for none).
func (a pollAddr) String() string {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], a.hi)
	binary.BigEndian.PutUint64(b[8:], a.lo)
	ip, ok := netip.AddrFromSlice(b[:a.n])
	if !ok {
		return ""
	}
	return ip.String()
}

func addrOf(addr net.Addr) pollAddr {
	ta, ok := addr.(*net.TCPAddr)
	if !ok {
		return pollAddr{}
	}
	ip := ta.IP
	if ip4 := ip.To4(); ip4 != nil {
		ip = ip4
	}
	var b [16]byte
	n := copy(b[:], ip)
	return pollAddr{hi: binary.BigEndian.Uint64(b[:8]), lo: binary.BigEndian.Uint64(b[8:]), n: uint8(n)}
}

// answerTable is the interned answer lines: lines[id], id 0 nil
// (withheld).
type answerTable struct {
	ids   map[string]uint16
	lines [][]byte
}

// maxAnswers bounds the interned lines. The agent's answers are a few
// hundred (ready 0-256%, drain, maint); a line beyond the bound is not
// recorded (counted as dropped).
const maxAnswers = 1 << 16

// serverIndex is the servers sorted by name, rebuilt by the first reader
// after servers came or went (dirty).
type serverIndex struct {
	mu    sync.Mutex // one rebuild at a time
	dirty atomic.Bool
	list  atomic.Pointer[[]*serverPolls]
}

// DefaultMaxPollers bounds the (HAProxy, server) pairs remembered.
const DefaultMaxPollers = 200_000

// PollersOptions configure NewPollers.
type PollersOptions struct {
	// Max bounds the (HAProxy, server) pairs remembered (0:
	// DefaultMaxPollers). A new pair beyond it is dropped and counted.
	Max int
	// Registerer receives hastate_pollers_dropped_total and
	// hastate_pollers_entries. Nil: the metrics are kept but not exported.
	Registerer prometheus.Registerer
}

// NewPollers returns an empty record. It fails only when Max is negative;
// registering the metrics twice with one registry panics (one registry per
// replica).
func NewPollers(o PollersOptions) (*Pollers, error) {
	if o.Max < 0 {
		return nil, fmt.Errorf("pollers: max %d is negative: set --pollers-max to a positive number of (HAProxy, server) pairs, or 0 for %d", o.Max, DefaultMaxPollers)
	}
	o.Max = cmp.Or(o.Max, DefaultMaxPollers)
	f := promauto.With(o.Registerer) // one registry per replica: a second registration panics
	p := &Pollers{max: o.Max, dropped: f.NewCounter(prometheus.CounterOpts{
		Name: "hastate_pollers_dropped_total",
		Help: "Probes of a new (HAProxy, server) pair that this replica did not remember because its poller table was full (--pollers-max). Per replica: each replica keeps its own table. Such pairs are missing from /v1/pollers and `hastate wait` does not wait for them; raise --pollers-max.",
	})}
	for i := range p.shards {
		p.shards[i].m = map[string]*serverPolls{}
	}
	p.answers.Store(&answerTable{ids: map[string]uint16{}, lines: [][]byte{nil}})
	p.index.dirty.Store(true)
	f.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "hastate_pollers_entries",
		Help: "(HAProxy, server) pairs this replica remembers in its poller table (per replica; at most --pollers-max).",
	}, func() float64 { return float64(p.Len()) })
	return p, nil
}

// Record notes that the HAProxy at addr asked for req ("backend/server",
// without terminator) at now and was told line (nil: withheld). A new pair
// beyond the bound is dropped and counted in hastate_pollers_dropped_total.
func (p *Pollers) Record(addr net.Addr, req, line []byte, now time.Time) {
	if p == nil {
		return
	}
	a := addrOf(addr)
	answer, ok := p.answerID(line)
	if !ok {
		p.dropped.Inc()
		return
	}
	at := now.UnixNano()
	sh := &p.shards[shardOf(req)]
	for {
		sh.mu.RLock()
		sp := sh.m[string(req)]
		sh.mu.RUnlock()
		if sp == nil {
			if p.pairs.Load() >= int64(p.max) {
				p.dropped.Inc()
				return
			}
			sp = p.addServer(sh, req)
		}
		sp.mu.Lock()
		if sp.gone { // swept meanwhile: look again
			sp.mu.Unlock()
			continue
		}
		i, found := slices.BinarySearchFunc(sp.polls, a, func(e poll, a pollAddr) int { return e.addr.compare(a) })
		if !found {
			if p.pairs.Add(1) > int64(p.max) {
				p.pairs.Add(-1)
				sp.mu.Unlock()
				p.dropped.Inc()
				return
			}
			sp.polls = slices.Insert(sp.polls, i, poll{addr: a})
		}
		e := &sp.polls[i]
		kept := e.kept
		if answer != 0 {
			kept = answer
		}
		if !sp.told.keeps(e, at, answer, kept) { // a new poll, zero, is not counted
			sp.told.ok = false
		}
		e.last, e.answer, e.kept = at, answer, kept
		if e.count < math.MaxUint32 {
			e.count++
		}
		sp.last = max(sp.last, at)
		sp.mu.Unlock()
		return
	}
}

// addServer returns sh's entry for req, adding it.
func (p *Pollers) addServer(sh *serverShard, req []byte) *serverPolls {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sp := sh.m[string(req)]
	if sp == nil {
		sp = &serverPolls{key: string(req)}
		sh.m[sp.key] = sp
		p.index.dirty.Store(true)
	}
	return sp
}

// answerID interns line (nil: 0); false when the table is full.
func (p *Pollers) answerID(line []byte) (uint16, bool) {
	if line == nil {
		return 0, true
	}
	if id, ok := p.answers.Load().ids[string(line)]; ok {
		return id, true
	}
	p.answersMu.Lock()
	defer p.answersMu.Unlock()
	t := p.answers.Load()
	if id, ok := t.ids[string(line)]; ok {
		return id, true
	}
	if len(t.lines) >= maxAnswers {
		return 0, false
	}
	id := uint16(len(t.lines))
	nt := &answerTable{ids: maps.Clone(t.ids), lines: append(slices.Clip(t.lines), bytes.Clone(line))}
	nt.ids[string(line)] = id
	p.answers.Store(nt)
	return id, true
}

func shardOf(key []byte) int {
	h := uint32(2166136261)
	for _, c := range key {
		h = (h ^ uint32(c)) * 16777619
	}
	return int(h % pollerShards)
}

// Len is the number of pairs remembered.
func (p *Pollers) Len() int { return int(p.pairs.Load()) }

// sorted returns the servers sorted by name. A server added after the
// call began may be missing, one swept may be present (gone, no polls).
func (p *Pollers) sorted() []*serverPolls {
	ix := &p.index
	if l := ix.list.Load(); l != nil && !ix.dirty.Load() {
		return *l
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if l := ix.list.Load(); l != nil && !ix.dirty.Load() {
		return *l
	}
	ix.dirty.Store(false) // before the walk: a server added during it dirties it again
	var l []*serverPolls
	if old := ix.list.Load(); old != nil {
		l = make([]*serverPolls, 0, len(*old)+len(*old)/8)
	}
	for i := range p.shards {
		sh := &p.shards[i]
		sh.mu.RLock()
		for _, sp := range sh.m {
			l = append(l, sp)
		}
		sh.mu.RUnlock()
	}
	slices.SortFunc(l, func(a, b *serverPolls) int { return strings.Compare(a.key, b.key) })
	ix.list.Store(&l)
	return l
}

// walk calls fn, in name order, for each server f selects whose name is
// from or after from, until fn returns false. It looks only at the
// servers within f's literal prefixes (api.Filter.Prefixes): a walk of a
// few servers costs a binary search, not the table.
func (p *Pollers) walk(f api.Filter, from string, fn func(sp *serverPolls, backend, server string) bool) {
	l := p.sorted()
	var yield yielder
	for _, pre := range f.Prefixes() {
		lo := max(pre, from)
		i, _ := slices.BinarySearchFunc(l, lo, func(sp *serverPolls, k string) int { return strings.Compare(sp.key, k) })
		for ; i < len(l) && strings.HasPrefix(l[i].key, pre); i++ {
			yield.step() // the walk is the operator's, the CPU the agent's
			b, s, _ := strings.Cut(l[i].key, "/")
			if f.Match(b, s) && !fn(l[i], b, s) {
				return
			}
		}
	}
}

// copyPolls appends sp's polls asked about since since (Unix ns) to dst,
// holding sp's lock only while it copies.
func (sp *serverPolls) copyPolls(dst []poll, since int64) []poll {
	sp.each(since, func(e *poll) bool {
		dst = append(dst, *e)
		return true
	})
	return dst
}

// each calls fn, holding sp's lock, with each of sp's polls asked about
// since since (Unix ns), until fn returns false.
func (sp *serverPolls) each(since int64, fn func(e *poll) bool) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.last < since {
		return
	}
	for i := range sp.polls {
		if e := &sp.polls[i]; e.last >= since && !fn(e) {
			return
		}
	}
}

// held is how many pairs of sp the table holds.
func (sp *serverPolls) held() int {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	return len(sp.polls)
}

// Sweep forgets pairs not asked about since before, and servers left
// without any. It holds a shard's write lock only to remove servers.
func (p *Pollers) Sweep(before time.Time) {
	cut := before.UnixNano()
	var empty []*serverPolls
	for i := range p.shards {
		sh := &p.shards[i]
		empty = empty[:0]
		for _, sp := range p.shardServers(sh) {
			sp.mu.Lock()
			n := len(sp.polls)
			if sp.last < cut {
				sp.polls = nil
			} else {
				sp.polls = slices.DeleteFunc(sp.polls, func(e poll) bool { return e.last < cut })
				if cap(sp.polls) > 2*len(sp.polls)+8 {
					sp.polls = slices.Clone(sp.polls)
				}
			}
			if removed := n - len(sp.polls); removed > 0 {
				p.pairs.Add(-int64(removed))
				sp.told.ok = false // its counts may have held a removed poll
			}
			if len(sp.polls) == 0 {
				empty = append(empty, sp)
			}
			sp.mu.Unlock()
		}
		if len(empty) == 0 {
			continue
		}
		sh.mu.Lock()
		for _, sp := range empty {
			sp.mu.Lock()
			if len(sp.polls) == 0 { // no Record came in between
				sp.gone = true
				delete(sh.m, sp.key)
			}
			sp.mu.Unlock()
		}
		p.index.dirty.Store(true)
		sh.mu.Unlock()
	}
}

// shardServers copies sh's servers under its read lock.
func (p *Pollers) shardServers(sh *serverShard) []*serverPolls {
	sh.mu.RLock()
	defer sh.mu.RUnlock()
	return slices.Collect(maps.Values(sh.m))
}

// List returns the pairs asked about since since, sorted by server then
// HAProxy.
func (p *Pollers) List(since time.Time) []api.Poll {
	rows, _ := p.Select(since, PollsArg{}, "")
	return rows
}

// Select returns the pairs asked about since since of the servers
// q.Selectors match, sorted by server then HAProxy, those after q.After
// (api.PollCursor, with replica as the replica's name), at most q.Limit
// (0: all); total counts the pairs of those servers that the table holds
// (a pair older than since stays until the next Sweep). It reads the
// servers of the page, not the table. A bad selector selects nothing
// (the HTTP handler refuses it before).
func (p *Pollers) Select(since time.Time, q PollsArg, replica string) (rows []api.Poll, total int) {
	f, err := api.ParseFilter(q.Selectors)
	if err != nil || p == nil {
		return []api.Poll{}, 0
	}
	from, _, _ := strings.Cut(q.After, cursorSep)
	out := []api.Poll{}
	if f.All() {
		total = p.Len()
	} else {
		p.walk(f, "", func(sp *serverPolls, _, _ string) bool {
			total += sp.held()
			return true
		})
	}
	at := since.UnixNano()
	answers := p.answers.Load()
	var buf []poll
	var page []api.Poll
	p.walk(f, from, func(sp *serverPolls, b, s string) bool {
		buf = sp.copyPolls(buf[:0], at)
		page = page[:0]
		for _, e := range buf {
			pl := api.Poll{Backend: b, Server: s, LastAsked: time.Unix(0, e.last).UTC(), Count: uint64(e.count), Replica: replica,
				Answer: lineText(answers, e.answer), Withheld: e.answer == 0, HAProxy: e.addr.String()}
			if e.answer == 0 {
				pl.Kept = lineText(answers, e.kept)
			}
			if q.After != "" && api.PollCursor(pl) <= q.After {
				continue
			}
			page = append(page, pl)
		}
		slices.SortFunc(page, func(a, b api.Poll) int { return strings.Compare(a.HAProxy, b.HAProxy) })
		out = append(out, page...)
		return q.Limit <= 0 || len(out) < q.Limit
	})
	if q.Limit > 0 && len(out) > q.Limit {
		out = out[:q.Limit:q.Limit]
	}
	return out, total
}

// cursorSep separates a poll cursor's parts (api.PollCursor).
const cursorSep = "\x1f"

// lineText is answer line id without its LF ("" for 0).
func lineText(t *answerTable, id uint16) string {
	if id == 0 || int(id) >= len(t.lines) {
		return ""
	}
	return strings.TrimSuffix(string(t.lines[id]), "\n")
}

// SelectPolls is Select over a list of polls (a peer's, from a release
// that answers every poll): those q selects, sorted, after q.After, at
// most q.Limit, and how many it selects in all.
func SelectPolls(polls []api.Poll, q PollsArg) (rows []api.Poll, total int) {
	f, err := api.ParseFilter(q.Selectors)
	if err != nil {
		return []api.Poll{}, 0
	}
	out := []api.Poll{}
	for _, p := range polls {
		if !f.Match(p.Backend, p.Server) {
			continue
		}
		total++
		if q.After == "" || api.PollCursor(p) > q.After {
			out = append(out, p)
		}
	}
	SortPolls(out)
	if q.Limit > 0 && len(out) > q.Limit {
		out = out[:q.Limit:q.Limit]
	}
	return out, total
}

// SortPolls sorts polls in /v1/pollers' order: server, HAProxy, replica,
// the order of their cursors (api.PollCursor), which pages follow.
func SortPolls(polls []api.Poll) {
	type keyed struct {
		key string
		p   api.Poll
	}
	ks := make([]keyed, len(polls))
	for i, p := range polls {
		ks[i] = keyed{api.PollCursor(p), p}
	}
	slices.SortFunc(ks, func(a, b keyed) int { return strings.Compare(a.key, b.key) })
	for i := range ks {
		polls[i] = ks[i].p
	}
}

// Sightings returns every HAProxy source that asked since since and when
// it last did, over all servers. A source counts only once it asked more
// than once (an HAProxy asks every agent-inter): a manual probe, which
// asks once, is never recorded as an HAProxy node (the record would keep
// it as "polled recently" long after api.ProbeGrace, and hold the
// operator commands with a replica down).
// It walks the table, one server's lock at a time (the leader asks every
// few seconds).
func (p *Pollers) Sightings(since, now time.Time) map[string]time.Time {
	type src struct {
		addr  pollAddr
		last  int64
		count uint64
	}
	var all []src               // every source seen
	idx := map[pollAddr]int32{} // index in all
	var run srcRun
	add := func(a pollAddr) int32 {
		k, ok := idx[a]
		if !ok {
			k = int32(len(all))
			idx[a] = k
			all = append(all, src{addr: a})
		}
		return k
	}
	at := since.UnixNano()
	p.walk(api.Filter{}, "", func(sp *serverPolls, _, _ string) bool {
		i := 0
		sp.each(at, func(e *poll) bool {
			s := &all[run.index(i, e.addr, add)]
			s.count += uint64(e.count)
			s.last = max(s.last, e.last)
			i++
			return true
		})
		return true
	})
	out := make(map[string]time.Time, len(all))
	for _, s := range all {
		if s.addr.n == 0 || s.count <= 1 {
			continue
		}
		out[s.addr.String()] = time.Unix(0, s.last).UTC()
	}
	return out
}

// srcRun is the previous server's sources by position, each with its
// index in what a walk builds: servers are mostly polled by the same
// sources, in the same (address) order, so the i-th source of one server
// is likely the i-th of the next, found without a look-up.
type srcRun []srcIdx

// srcIdx is a source's address and its index.
type srcIdx struct {
	addr pollAddr
	idx  int32
}

// index is the index of a, the i-th source of the server walked, taken
// from the previous server's i-th when it is the same, else from lookup
// (which adds a when new).
func (r *srcRun) index(i int, a pollAddr, lookup func(pollAddr) int32) int32 {
	if i < len(*r) && (*r)[i].addr == a {
		return (*r)[i].idx
	}
	k := lookup(a)
	if i < len(*r) {
		(*r)[i] = srcIdx{a, k}
	} else {
		*r = append(*r, srcIdx{a, k})
	}
	return k
}

// Backends returns the backends of the servers asked about since since.
func (p *Pollers) Backends(since time.Time) map[string]bool {
	out := map[string]bool{}
	if p == nil {
		return out
	}
	at := since.UnixNano()
	p.walk(api.Filter{}, "", func(sp *serverPolls, b, _ string) bool {
		sp.mu.Lock()
		recent := sp.last >= at && len(sp.polls) > 0
		sp.mu.Unlock()
		if recent {
			out[b] = true
		}
		return true
	})
	return out
}

// PollsQuery is the peer query (over the raft port) that answers
// PollsAnswer for a PollsArg: a replica's polls of the selected servers.
// Releases before 0.15.0 answer it null; they are asked "pollers" (every
// poll) and filtered by the asker.
const PollsQuery = "polls-of"

// PollsArg is PollsQuery's argument: the selectors (none: all), the
// cursor (api.PollCursor) and the most rows (0: all).
type PollsArg struct {
	Selectors []string `json:"selectors,omitempty"`
	After     string   `json:"after,omitempty"`
	Limit     int      `json:"limit,omitempty"`
}

// PollsAnswer is PollsQuery's answer.
type PollsAnswer struct {
	Polls []api.Poll `json:"polls"`
	Total int        `json:"total"`
}

// AnswerPolls answers PollsQuery for the replica named replica: its polls
// within PollerWindow that the argument selects.
func (p *Pollers) AnswerPolls(raw json.RawMessage, replica string) any {
	var q PollsArg
	if err := json.Unmarshal(raw, &q); err != nil {
		return PollsAnswer{Polls: []api.Poll{}}
	}
	rows, total := p.Select(time.Now().Add(-PollerWindow), q, replica)
	return PollsAnswer{Polls: rows, Total: total}
}
