package server

import (
	"cmp"
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
	out := []api.Poll{}
	for i := range p.shards {
		sh := &p.shards[i]
		sh.mu.RLock()
		for k, e := range sh.m {
			e.mu.Lock()
			last, line, kept, count := e.last, e.answer, e.kept, e.count
			e.mu.Unlock()
			if last.Before(since) {
				continue
			}
			ipb, req := k[1:1+int(k[0])], k[1+int(k[0]):]
			b, s, _ := strings.Cut(req, "/")
			pl := api.Poll{Backend: b, Server: s, LastAsked: last, Count: count,
				Answer: strings.TrimSuffix(string(line), "\n"), Withheld: line == nil}
			if line == nil {
				pl.Kept = strings.TrimSuffix(string(kept), "\n")
			}
			if ip, ok := netip.AddrFromSlice([]byte(ipb)); ok {
				pl.HAProxy = ip.String()
			}
			out = append(out, pl)
		}
		sh.mu.RUnlock()
	}
	slices.SortFunc(out, func(a, b api.Poll) int {
		if c := strings.Compare(a.Backend+"/"+a.Server, b.Backend+"/"+b.Server); c != 0 {
			return c
		}
		return strings.Compare(a.HAProxy, b.HAProxy)
	})
	return out
}
