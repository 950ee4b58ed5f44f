package server

import (
	"cmp"
	"encoding/json"
	"fmt"
	"github.com/hastate/hastate/api"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hastate/hastate/state"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Pollers remembers, for every HAProxy address and server it asked about,
// when it last asked and what it was told. It answers /v1/pollers and lets
// `hastate wait` know when every HAProxy has seen a change. Recording a
// probe that was seen before allocates nothing. Safe for concurrent use.
type Pollers struct {
	shards  [pollerShards]pollerShard
	max     int
	dropped prometheus.Counter
}

const pollerShards = 16

type pollerShard struct {
	mu sync.RWMutex
	m  map[string]*pollEntry
}

type pollEntry struct {
	mu     sync.Mutex
	last   time.Time
	answer []byte // shared wire line; nil: withheld
	kept   []byte // the last non-nil answer: what a withheld HAProxy keeps
	count  uint64
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
		p.shards[i].m = map[string]*pollEntry{}
	}
	f.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "hastate_pollers_entries",
		Help: "(HAProxy, server) pairs this replica remembers in its poller table (per replica; at most --pollers-max).",
	}, func() float64 { return float64(p.Len()) })
	return p, nil
}

// keyBufSize holds the key: the address length, the address (4 or 16
// bytes) and the longest request.
const keyBufSize = 1 + 16 + state.MaxRequest

// Record notes that the HAProxy at addr asked for req ("backend/server",
// without terminator) at now and was told line (nil: withheld). A new pair
// beyond the bound is dropped and counted in hastate_pollers_dropped_total.
func (p *Pollers) Record(addr net.Addr, req, line []byte, now time.Time) {
	if p == nil {
		return
	}
	var buf [keyBufSize]byte
	n := 1
	if ta, ok := addr.(*net.TCPAddr); ok {
		ip := ta.IP
		if ip4 := ip.To4(); ip4 != nil {
			ip = ip4
		}
		n += copy(buf[1:17], ip)
	}
	buf[0] = byte(n - 1)
	n += copy(buf[n:], req)
	key := buf[:n]
	sh := &p.shards[shardOf(key)]

	sh.mu.RLock()
	e := sh.m[string(key)]
	sh.mu.RUnlock()
	if e == nil {
		if p.Len() >= p.max {
			p.dropped.Inc()
			return
		}
		sh.mu.Lock()
		if e = sh.m[string(key)]; e == nil {
			e = &pollEntry{}
			sh.m[string(key)] = e
		}
		sh.mu.Unlock()
	}
	e.mu.Lock()
	e.last, e.answer = now, line
	if line != nil {
		e.kept = line
	}
	e.count++
	e.mu.Unlock()
}

func shardOf(key []byte) int {
	h := uint32(2166136261)
	for _, c := range key {
		h = (h ^ uint32(c)) * 16777619
	}
	return int(h % pollerShards)
}

// Len is the number of pairs remembered.
func (p *Pollers) Len() int {
	n := 0
	for i := range p.shards {
		sh := &p.shards[i]
		sh.mu.RLock()
		n += len(sh.m)
		sh.mu.RUnlock()
	}
	return n
}

// Sweep forgets pairs not asked about since before.
func (p *Pollers) Sweep(before time.Time) {
	for i := range p.shards {
		sh := &p.shards[i]
		sh.mu.Lock()
		for k, e := range sh.m {
			e.mu.Lock()
			old := e.last.Before(before)
			e.mu.Unlock()
			if old {
				delete(sh.m, k)
			}
		}
		sh.mu.Unlock()
	}
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
// (0: all); total counts every pair the selectors match. A bad selector
// selects nothing (the HTTP handler refuses it before).
func (p *Pollers) Select(since time.Time, q PollsArg, replica string) (rows []api.Poll, total int) {
	f, err := api.ParseFilter(q.Selectors)
	if err != nil {
		return []api.Poll{}, 0
	}
	out := []api.Poll{}
	for i := range p.shards {
		sh := &p.shards[i]
		sh.mu.RLock()
		for k, e := range sh.m {
			ipb, req := k[1:1+int(k[0])], k[1+int(k[0]):]
			b, s, _ := strings.Cut(req, "/")
			if !f.Match(b, s) {
				continue
			}
			e.mu.Lock()
			last, line, kept, count := e.last, e.answer, e.kept, e.count
			e.mu.Unlock()
			if last.Before(since) {
				continue
			}
			total++
			pl := api.Poll{Backend: b, Server: s, LastAsked: last, Count: count, Replica: replica,
				Answer: strings.TrimSuffix(string(line), "\n"), Withheld: line == nil}
			if line == nil {
				pl.Kept = strings.TrimSuffix(string(kept), "\n")
			}
			if ip, ok := netip.AddrFromSlice([]byte(ipb)); ok {
				pl.HAProxy = ip.String()
			}
			if q.After != "" && api.PollCursor(pl) <= q.After {
				continue
			}
			out = append(out, pl)
		}
		sh.mu.RUnlock()
	}
	SortPolls(out)
	if q.Limit > 0 && len(out) > q.Limit {
		out = out[:q.Limit:q.Limit]
	}
	return out, total
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
// It walks the table (about 10 ms at 200,000 pairs); the leader asks every
// few seconds.
func (p *Pollers) Sightings(since, now time.Time) map[string]time.Time {
	type src struct {
		last  time.Time
		count uint64
	}
	bySrc := map[string]src{}
	for i := range p.shards {
		sh := &p.shards[i]
		sh.mu.RLock()
		for k, e := range sh.m {
			ipb := k[1 : 1+int(k[0])]
			e.mu.Lock()
			last, count := e.last, e.count
			e.mu.Unlock()
			if last.Before(since) {
				continue
			}
			s := bySrc[ipb]
			s.count += count
			if last.After(s.last) {
				s.last = last
			}
			bySrc[ipb] = s
		}
		sh.mu.RUnlock()
	}
	out := make(map[string]time.Time, len(bySrc))
	for ipb, s := range bySrc {
		ip, ok := netip.AddrFromSlice([]byte(ipb))
		if !ok {
			continue
		}
		if s.count > 1 {
			out[ip.String()] = s.last
		}
	}
	return out
}

// Backends returns the backends of the servers asked about since since.
func (p *Pollers) Backends(since time.Time) map[string]bool {
	out := map[string]bool{}
	if p == nil {
		return out
	}
	for i := range p.shards {
		sh := &p.shards[i]
		sh.mu.RLock()
		for k, e := range sh.m {
			e.mu.Lock()
			last := e.last
			e.mu.Unlock()
			if last.Before(since) {
				continue
			}
			b, _, _ := strings.Cut(k[1+int(k[0]):], "/")
			out[b] = true
		}
		sh.mu.RUnlock()
	}
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
