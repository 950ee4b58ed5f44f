package raftport

import (
	"cmp"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/hastate/hastate/internal/ratelog"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// Defaults of the raft port's Limits, used where a field is zero.
const (
	// DefaultMaxConnsPerIP: a peer keeps at most a dozen inbound
	// connections open at once (raft's pool of 3, the replication pipeline,
	// a snapshot, a vote, and short status and query connections). 64
	// leaves room for two peers behind one address (a sidecar or a proxy)
	// and bursts of status queries, and still stops one address from
	// holding the port.
	DefaultMaxConnsPerIP = 64
	// DefaultMaxConns bounds the goroutines, buffers and file descriptors
	// the port can cost, whatever the number of addresses.
	DefaultMaxConns = 1024
	// DefaultIdentifyTimeout: a peer sends its first byte (after the TLS
	// handshake, with TLS) right after it connects. 3s covers a slow
	// handshake with a lost packet or two.
	DefaultIdentifyTimeout = 3 * time.Second
)

// Reasons an inbound raft-port connection is closed unserved: the values of
// hastate_raft_conns_rejected_total{reason}.
const (
	rejectPerIP    = "per_ip_cap"
	rejectTotal    = "total_cap"
	rejectTLS      = "tls"
	rejectIdentify = "identify"
	rejectKind     = "unknown_kind"
)

var rejectReasons = []string{rejectPerIP, rejectTotal, rejectTLS, rejectIdentify, rejectKind}

// rejectHint says, in each rate-limited log line, what a rejection means.
func rejectHint(reason string) string {
	switch reason {
	case rejectPerIP:
		return "raft port: connection over the per-address cap closed (a peer holds a handful; see what else connects from this address)"
	case rejectTotal:
		return "raft port: connection over the total cap closed (hastate_raft_conns_open counts what is held; look for many addresses connecting)"
	case rejectTLS:
		return "raft port: TLS handshake failed, connection closed (plain TCP, no client certificate, or one not signed by --raft-tls-ca)"
	case rejectIdentify:
		return "raft port: connection did not identify itself in time, closed (not a hastate peer, or a very slow link)"
	}
	return "raft port: unknown connection kind, closed (not a hastate peer)"
}

// Limits are the raft port's caps on inbound connections: per remote
// address and in total (a connection over a cap is closed at once and
// counted), and how long a new connection has to complete the TLS
// handshake and send its kind byte. Zero: the Default values.
type Limits struct {
	MaxConnsPerIP   int
	MaxConns        int
	IdentifyTimeout time.Duration
}

// WithDefaults returns l with its zero fields set to the defaults, or why
// l is refused (a negative field).
func (l Limits) WithDefaults() (Limits, error) {
	switch {
	case l.MaxConnsPerIP < 0:
		return l, fmt.Errorf("MaxConnsPerIP %d is negative: use 0 for the default (%d)", l.MaxConnsPerIP, DefaultMaxConnsPerIP)
	case l.MaxConns < 0:
		return l, fmt.Errorf("MaxConns %d is negative: use 0 for the default (%d)", l.MaxConns, DefaultMaxConns)
	case l.IdentifyTimeout < 0:
		return l, fmt.Errorf("IdentifyTimeout %v is negative: use 0 for the default (%v)", l.IdentifyTimeout, DefaultIdentifyTimeout)
	}
	l.MaxConnsPerIP = cmp.Or(l.MaxConnsPerIP, DefaultMaxConnsPerIP)
	l.MaxConns = cmp.Or(l.MaxConns, DefaultMaxConns)
	l.IdentifyTimeout = cmp.Or(l.IdentifyTimeout, DefaultIdentifyTimeout)
	return l, nil
}

// CheckTLS refuses a TLS configuration for the port that does not require
// and verify client certificates (nil: plain TCP, accepted).
func CheckTLS(c *tls.Config) error {
	if c != nil && c.ClientAuth != tls.RequireAndVerifyClientCert {
		return errors.New("raft TLS must require and verify client certificates, or any TLS client could read status and send raft RPCs: build it with MutualTLS")
	}
	return nil
}

// Metrics are the raft port's own metrics (NewMetrics), registered with
// the node's.
type Metrics struct {
	Rejected   *prometheus.CounterVec // by reason
	Open       prometheus.Gauge
	TLSEnabled prometheus.Gauge
}

func NewMetrics() *Metrics {
	m := &Metrics{
		Rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hastate_raft_conns_rejected_total",
			Help: "Per replica: inbound raft-port connections closed unserved, by reason: per_ip_cap, total_cap, tls (handshake failed), identify (no first byte in time), unknown_kind."},
			[]string{"reason"}),
		Open: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "hastate_raft_conns_open", Help: "Per replica: inbound raft-port connections open (raft, status and queries, and those not identified yet)."}),
		TLSEnabled: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "hastate_raft_tls_enabled", Help: "Per replica: 1 when the raft port requires mutual TLS; 0 means anyone who reaches it can send raft RPCs and read status."}),
	}
	for _, r := range rejectReasons {
		m.Rejected.WithLabelValues(r)
	}
	return m
}

// Collectors are the port's metrics, registered with the node's.
func (m *Metrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.Rejected, m.Open, m.TLSEnabled}
}

// connGuard caps the inbound connections of the raft port, per remote
// address and in total, from accept until close, and can close them all.
type connGuard struct {
	perIP, total int
	openGauge    prometheus.Gauge

	mu     sync.Mutex
	closed bool
	byIP   map[string]int
	conns  map[*guardedConn]struct{}
}

func newConnGuard(perIP, total int, open prometheus.Gauge) *connGuard {
	return &connGuard{perIP: perIP, total: total, openGauge: open, byIP: map[string]int{}, conns: map[*guardedConn]struct{}{}}
}

// admit returns c wrapped so that closing it frees its place, or the reason
// it is over a cap. After closeAll every connection is refused.
func (g *connGuard) admit(c net.Conn) (net.Conn, string) {
	ip := remoteIP(c)
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case g.closed || len(g.conns) >= g.total:
		return nil, rejectTotal
	case g.byIP[ip] >= g.perIP:
		return nil, rejectPerIP
	}
	gc := &guardedConn{Conn: c, g: g, ip: ip}
	g.conns[gc] = struct{}{}
	g.byIP[ip]++
	g.openGauge.Inc()
	return gc, ""
}

// openFrom is the number of connections the guard holds open from ip.
func (g *connGuard) openFrom(ip string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.byIP[ip]
}

func (g *connGuard) release(gc *guardedConn) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, ok := g.conns[gc]; !ok {
		return
	}
	delete(g.conns, gc)
	if g.byIP[gc.ip]--; g.byIP[gc.ip] == 0 {
		delete(g.byIP, gc.ip)
	}
	g.openGauge.Dec()
}

// closeAll closes every admitted connection and refuses new ones.
func (g *connGuard) closeAll() {
	g.mu.Lock()
	g.closed = true
	conns := make([]*guardedConn, 0, len(g.conns))
	for c := range g.conns {
		conns = append(conns, c)
	}
	g.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
}

func remoteIP(c net.Conn) string {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return a.IP.String()
	}
	host, _, err := net.SplitHostPort(c.RemoteAddr().String())
	if err != nil {
		return c.RemoteAddr().String()
	}
	return host
}

// guardedConn gives its place in the guard back when it is closed.
type guardedConn struct {
	net.Conn
	g    *connGuard
	ip   string
	once sync.Once
}

func (c *guardedConn) Close() error {
	c.once.Do(func() { c.g.release(c) })
	return c.Conn.Close()
}

// rejectLog lets one warning per reason through per interval and counts
// the ones it held back, so a flood of connections costs one line a second.
type rejectLog struct {
	log    *zap.Logger
	limits map[string]*ratelog.Limiter // by reason, built once: read-only after
}

func newRejectLog(log *zap.Logger, every time.Duration) *rejectLog {
	l := &rejectLog{log: log, limits: map[string]*ratelog.Limiter{}}
	for _, r := range rejectReasons {
		l.limits[r] = ratelog.New(every, nil)
	}
	return l
}

func (l *rejectLog) warn(reason string, remote net.Addr, err error) {
	var hidden int64
	if lim := l.limits[reason]; lim != nil { // every reason is listed
		var ok bool
		if ok, hidden = lim.Allow(); !ok {
			return
		}
	}
	fields := []zap.Field{zap.String("reason", reason), zap.Stringer("remote", remote), zap.Int64("suppressed", hidden)}
	if err != nil {
		fields = append(fields, zap.Error(err))
	}
	l.log.Warn(rejectHint(reason), fields...)
}
