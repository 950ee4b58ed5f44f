// Package server holds hastate's network front ends: the agent-check TCP
// server that answers HAProxy's agent probes (port 9777) and the HTTP server
// for health, metrics, the API and the status page (port 9778).
//
// The package reads state through the small interfaces it declares
// (SnapshotSource); it does not import cluster or kvsync.
package server

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hastate/hastate/internal/accept"
	"github.com/hastate/hastate/internal/ratelog"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"go.uber.org/zap"

	"github.com/hastate/hastate/state"
)

// Sentinel errors of the package. Match them with errors.Is.
var (
	// ErrServerClosed is returned by Serve after Shutdown or Close, and by
	// Serve called on a server that was already shut down.
	ErrServerClosed = errors.New("server closed")
	// ErrInvalidOptions wraps every validation error of a constructor; the
	// message names the option and the value to use instead.
	ErrInvalidOptions = errors.New("invalid options")
)

// SnapshotSource returns the snapshot a probe is answered from (nil:
// answer nothing). The agent server calls it once per probe, once the
// request has arrived. It must not allocate; it may block for a bounded
// time (the cluster's confirmation of the answer: a round trip to the
// raft leader per batch of probes, at most --confirm-timeout).
type SnapshotSource interface {
	Snapshot() *state.Snapshot
}

// ArrivalSource is a SnapshotSource told of each probe when its
// connection is accepted, before its request is read, so that the
// confirmation of its answer (a round trip to the raft leader) runs while
// the request arrives: a probe is invoked before its connection is
// accepted, so a confirmation that began after the accept began after the
// probe. The agent server calls Arrived once per accepted connection and
// hands what it returned to SnapshotSince, in place of Snapshot, once the
// request has arrived. Neither may allocate (Arrived returns a
// pointer-shaped value, which an interface holds without allocating);
// Arrived must not block.
type ArrivalSource interface {
	SnapshotSource
	Arrived() any
	SnapshotSince(arrival any) *state.Snapshot
}

// SnapshotFunc adapts a function to SnapshotSource.
type SnapshotFunc func() *state.Snapshot

// Snapshot calls f.
func (f SnapshotFunc) Snapshot() *state.Snapshot { return f() }

// Defaults of AgentOptions, used where a field is zero.
const (
	DefaultAgentReadTimeout  = 2 * time.Second
	DefaultAgentQuietPeriod  = 50 * time.Millisecond
	DefaultAgentWriteTimeout = 2 * time.Second
	DefaultAgentMaxConns     = 4096
)

// AgentOptions configures an AgentServer. The zero value of every field but
// Source means its documented default.
type AgentOptions struct {
	// Source gives the snapshot each probe is answered from. Required.
	Source SnapshotSource
	// Logger receives the server's logs. Nil: no logs. Errors caused by
	// probes (malformed requests, timeouts, failed writes, rejections) are
	// rate-limited to one line per kind per second, with the count of the
	// events suppressed in between.
	Logger *zap.Logger
	// Registerer receives the server's metrics. Nil: the metrics are kept
	// but not registered anywhere.
	Registerer prometheus.Registerer
	// ReadTimeout bounds the time from accept until the whole request has
	// arrived. Zero: DefaultAgentReadTimeout (2s).
	ReadTimeout time.Duration
	// QuietPeriod: a request without LF is complete once the peer has sent
	// nothing for this long after its last byte. It must be shorter than
	// ReadTimeout. Zero: DefaultAgentQuietPeriod (50ms).
	QuietPeriod time.Duration
	// WriteTimeout bounds writing the answer. Zero: DefaultAgentWriteTimeout (2s).
	WriteTimeout time.Duration
	// Pollers, when set, records which HAProxy asked for which server and
	// what it was told. Nil: nothing is recorded.
	Pollers *Pollers
	// MaxConns caps the connections served at once; beyond it a new
	// connection is closed at once and counted as result "rejected". The
	// server preallocates one small tracking slot per connection.
	// Zero: DefaultAgentMaxConns (4096).
	MaxConns int
}

func (o AgentOptions) withDefaults() AgentOptions {
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	o.ReadTimeout = cmp.Or(o.ReadTimeout, DefaultAgentReadTimeout)
	o.QuietPeriod = cmp.Or(o.QuietPeriod, DefaultAgentQuietPeriod)
	o.WriteTimeout = cmp.Or(o.WriteTimeout, DefaultAgentWriteTimeout)
	o.MaxConns = cmp.Or(o.MaxConns, DefaultAgentMaxConns)
	return o
}

// validate checks options that already have their defaults applied.
func (o AgentOptions) validate() error {
	switch {
	case o.Source == nil:
		return fmt.Errorf("%w: AgentOptions.Source is nil: pass the holder of the serving snapshot", ErrInvalidOptions)
	case o.ReadTimeout < 0:
		return fmt.Errorf("%w: AgentOptions.ReadTimeout %v is negative: use 0 for the default (%v)", ErrInvalidOptions, o.ReadTimeout, DefaultAgentReadTimeout)
	case o.QuietPeriod < 0:
		return fmt.Errorf("%w: AgentOptions.QuietPeriod %v is negative: use 0 for the default (%v)", ErrInvalidOptions, o.QuietPeriod, DefaultAgentQuietPeriod)
	case o.WriteTimeout < 0:
		return fmt.Errorf("%w: AgentOptions.WriteTimeout %v is negative: use 0 for the default (%v)", ErrInvalidOptions, o.WriteTimeout, DefaultAgentWriteTimeout)
	case o.QuietPeriod >= o.ReadTimeout:
		return fmt.Errorf("%w: AgentOptions.QuietPeriod %v must be shorter than ReadTimeout %v", ErrInvalidOptions, o.QuietPeriod, o.ReadTimeout)
	case o.MaxConns < 0:
		return fmt.Errorf("%w: AgentOptions.MaxConns %d is negative: use 0 for the default (%d)", ErrInvalidOptions, o.MaxConns, DefaultAgentMaxConns)
	}
	return nil
}

// readBufSize holds the longest accepted request plus one byte, so that a
// request without LF is known to be too long once the buffer is full.
const readBufSize = state.MaxRequest + 1

type readBuf [readBufSize]byte

// Kinds of rate-limited log events.
const (
	logMalformed = iota
	logTimeout
	logReadError
	logWriteError
	logRejected
	logAcceptError
	numLogKinds
)

var logKindNames = [numLogKinds]string{"malformed", "timeout", "read_error", "write_error", "rejected", "accept_error"}

// AgentServer answers HAProxy agent-check probes: one request line
// "<backend>/<server>" per connection, one answer line from the current
// snapshot, then close. Build it with NewAgentServer (the zero value is not
// usable); it is safe for concurrent use, and one server may Serve several
// listeners.
type AgentServer struct {
	src          SnapshotSource
	arrivals     ArrivalSource // src, when it is one (nil: not)
	log          *zap.Logger
	readTimeout  time.Duration
	quietPeriod  time.Duration
	writeTimeout time.Duration
	pollers      *Pollers // nil: not recorded

	m       agentMetrics
	limits  [numLogKinds]*ratelog.Limiter
	bufs    sync.Pool // *readBuf
	slots   []connSlot
	free    chan *connSlot // semaphore: the slots not in use
	active  atomic.Int64
	conns   sync.WaitGroup // connection goroutines; Add only under mu while !closed
	done    chan struct{}  // closed by Shutdown or Close
	flushed sync.Once

	mu        sync.Mutex
	closed    bool
	listeners map[*onceCloseListener]struct{}
}

// connSlot tracks one served connection so that Close can reach it.
type connSlot struct {
	mu sync.Mutex
	c  net.Conn
}

// NewAgentServer validates the options, registers the metrics and returns a
// server ready to Serve.
func NewAgentServer(o AgentOptions) (*AgentServer, error) {
	o = o.withDefaults()
	if err := o.validate(); err != nil {
		return nil, err
	}
	s := &AgentServer{
		src:          o.Source,
		log:          o.Logger,
		readTimeout:  o.ReadTimeout,
		quietPeriod:  o.QuietPeriod,
		writeTimeout: o.WriteTimeout,
		pollers:      o.Pollers,
		slots:        make([]connSlot, o.MaxConns),
		free:         make(chan *connSlot, o.MaxConns),
		done:         make(chan struct{}),
		listeners:    map[*onceCloseListener]struct{}{},
	}
	s.arrivals, _ = o.Source.(ArrivalSource)
	s.bufs.New = func() any { return new(readBuf) }
	for i := range s.slots {
		s.free <- &s.slots[i]
	}
	for i := range s.limits {
		s.limits[i] = ratelog.New(time.Second, nil)
	}
	s.m.init(o.Registerer) // one registry per server: a second registration panics
	return s, nil
}

// ListenAgent listens for agent checks on addr (TCP). Its connections
// carry no TCP keepalive: a check is one line in and one out, bounded by
// the read timeout, so a keepalive probe would never be sent, and turning
// it on cost four setsockopt calls per check (6 % of a replica's CPU
// under load; server/DESIGN.md).
func ListenAgent(ctx context.Context, addr string) (net.Listener, error) {
	lc := net.ListenConfig{KeepAlive: -1}
	return lc.Listen(ctx, "tcp", addr)
}

// ActiveConns returns the number of connections being served.
func (s *AgentServer) ActiveConns() int { return int(s.active.Load()) }

// Serve accepts connections on ln and serves each in its own goroutine until
// Shutdown or Close; then it returns ErrServerClosed. It always closes ln.
// Temporary Accept errors (such as running out of file descriptors) are
// retried after a pause growing from 5ms to 1s; any other Accept error is
// returned.
func (s *AgentServer) Serve(ln net.Listener) error {
	l := &onceCloseListener{Listener: ln}
	defer l.Close()
	if !s.trackListener(l, true) {
		return ErrServerClosed
	}
	defer s.trackListener(l, false)

	err := accept.Loop(l, s.done, func(c net.Conn) { s.startConn(c, time.Now()) }, func(err error, pause time.Duration) {
		if ok, hidden := s.limits[logAcceptError].Allow(); ok {
			s.log.Error("agent server: accept failed; retrying (check the file descriptor limit)",
				zap.Error(err), zap.Duration("retry_in", pause), zap.Int64("suppressed", hidden))
		}
	})
	if err == nil || s.isClosed() {
		return ErrServerClosed
	}
	return fmt.Errorf("agent server: accept on %s: %w", ln.Addr(), err)
}

// startConn admits c (or rejects it when MaxConns are busy) and starts its
// goroutine, owned by the server: Shutdown and Close wait for it.
func (s *AgentServer) startConn(c net.Conn, start time.Time) {
	var slot *connSlot
	select {
	case slot = <-s.free:
	default:
		c.Close()
		s.m.rejected.Inc()
		if ok, hidden := s.limits[logRejected].Allow(); ok {
			s.log.Warn("agent server: too many connections, closed a new one unanswered; raise MaxConns if this is normal load",
				zap.Stringer("remote", c.RemoteAddr()), zap.Int64("suppressed", hidden))
		}
		return
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.free <- slot
		c.Close()
		return
	}
	s.conns.Add(1)
	slot.set(c)
	s.mu.Unlock()
	s.active.Add(1)
	s.m.active.Inc()
	var arrival any
	if s.arrivals != nil {
		arrival = s.arrivals.Arrived()
	}
	go s.runConn(c, slot, start, arrival)
}

func (s *AgentServer) runConn(c net.Conn, slot *connSlot, start time.Time, arrival any) {
	defer s.conns.Done()
	s.serveConn(c, start, arrival)
	slot.set(nil)
	s.free <- slot
	s.m.active.Dec()
	s.active.Add(-1)
}

// serveConn runs the protocol on one accepted connection and closes it:
// read one request, look it up in the current snapshot, write the answer.
// start is the time of accept, arrival what the source's Arrived returned
// then (nil: the source is no ArrivalSource). It allocates nothing itself.
func (s *AgentServer) serveConn(c net.Conn, start time.Time, arrival any) {
	defer c.Close()
	buf := s.bufs.Get().(*readBuf)
	defer s.bufs.Put(buf)

	n, read, err := s.readRequest(c, buf, start.Add(s.readTimeout))
	switch {
	case err == nil:
	case errors.Is(err, net.ErrClosed):
		return // closed by Close or Shutdown: not the peer's doing
	case errors.Is(err, os.ErrDeadlineExceeded):
		s.m.timeout.Inc()
		s.logProbe(logTimeout, "agent probe: request did not arrive within the read timeout; closed unanswered", c, err, buf[:n])
		return
	case err == io.EOF:
		s.m.malformed.Inc()
		s.logProbe(logMalformed, "agent probe: connection closed without a request", c, err, nil)
		return
	case errors.Is(err, errTooLong):
		s.m.malformed.Inc()
		s.logProbe(logMalformed, "agent probe: malformed request; closed unanswered", c, err, buf[:n])
		return
	default:
		s.m.malformed.Inc()
		s.logProbe(logReadError, "agent probe: read failed before a request arrived; closed unanswered", c, err, buf[:n])
		return
	}

	req := buf[:n]
	backend, server, err := state.ParseRequest(req)
	if err != nil {
		s.m.malformed.Inc()
		s.logProbe(logMalformed, "agent probe: malformed request; closed unanswered", c, err, req)
		return
	}
	req = req[:len(backend)+1+len(server)]
	// A manual probe is never an HAProxy: it is answered, not recorded.
	pollers := s.pollers
	if bytes.HasPrefix(buf[n:read], probeMarker) {
		pollers = nil
	}
	var snap *state.Snapshot
	if s.arrivals != nil {
		snap = s.arrivals.SnapshotSince(arrival)
	} else {
		snap = s.src.Snapshot()
	}
	line := snap.Lookup(req, len(backend))
	if line == nil {
		s.m.withheld.Inc()
		if snap == nil {
			s.m.withheldUnconfirmed.Inc()
		} else {
			s.m.withheldInvalid.Inc()
		}
		pollers.Record(c.RemoteAddr(), req, nil, start)
		return
	}
	if err := c.SetWriteDeadline(time.Now().Add(s.writeTimeout)); err != nil {
		s.writeFailed(c, err)
		return
	}
	if _, err := c.Write(line); err != nil {
		s.writeFailed(c, err)
		return
	}
	s.m.answered.Inc()
	s.m.duration.Observe(time.Since(start).Seconds())
	pollers.Record(c.RemoteAddr(), req, line, start)
}

// probeMarker is state.ProbeMarker as bytes, so that checking for it does
// not allocate.
var probeMarker = []byte(state.ProbeMarker)

func (s *AgentServer) writeFailed(c net.Conn, err error) {
	if errors.Is(err, net.ErrClosed) {
		return
	}
	s.m.writeErrors.Inc()
	s.logProbe(logWriteError, "agent probe: writing the answer failed", c, err, nil)
}

// errTooLong: LF not found within the longest accepted request.
var errTooLong = fmt.Errorf("%w: longer than %d bytes", state.ErrMalformedRequest, state.MaxRequest)

// readRequest reads one request into buf and returns its length, LF
// included when there is one, and how many bytes it read into buf in all
// (what came with the request after its LF: a manual probe's marker). The request is complete at the first LF; at
// end of input (the peer half-closed) if data arrived; or, without LF, once
// the peer has sent nothing for the quiet period. It fails with an error
// wrapping os.ErrDeadlineExceeded when no complete request arrived before
// deadline, errTooLong when the buffer fills without LF, io.EOF when the
// peer closed without sending anything, or the read error.
func (s *AgentServer) readRequest(c net.Conn, buf *readBuf, deadline time.Time) (n, read int, err error) {
	if err := c.SetReadDeadline(deadline); err != nil {
		return 0, 0, err
	}
	quiet := false // the current read deadline is a quiet-period one
	for {
		m, err := c.Read(buf[n:])
		if m > 0 {
			if i := bytes.IndexByte(buf[n:n+m], '\n'); i >= 0 {
				return n + i + 1, n + m, nil
			}
			n += m
			if n == len(buf) {
				return n, n, errTooLong
			}
		}
		switch {
		case err == nil:
		case err == io.EOF && n > 0:
			return n, n, nil
		case quiet && n > 0 && errors.Is(err, os.ErrDeadlineExceeded):
			return n, n, nil
		default:
			return n, n, err
		}
		if m > 0 {
			// No LF yet: wait for more, but only for the quiet period.
			d, q := time.Now().Add(s.quietPeriod), true
			if !d.Before(deadline) {
				d, q = deadline, false
			}
			if err := c.SetReadDeadline(d); err != nil {
				return n, n, err
			}
			quiet = q
		}
	}
}

// logProbe logs a failed probe, at most once per second per kind.
func (s *AgentServer) logProbe(kind int, msg string, c net.Conn, err error, req []byte) {
	if !s.log.Core().Enabled(zap.WarnLevel) {
		return
	}
	ok, hidden := s.limits[kind].Allow()
	if !ok {
		return
	}
	const maxShown = 64
	if len(req) > maxShown {
		req = req[:maxShown]
	}
	s.log.Warn(msg,
		zap.String("kind", logKindNames[kind]),
		zap.Stringer("remote", c.RemoteAddr()),
		zap.Error(err),
		zap.ByteString("request", req),
		zap.Int64("suppressed", hidden))
}

// Shutdown stops the server gracefully: it closes the listeners (Serve
// returns ErrServerClosed), then waits for the connections being served to
// finish (each is bounded by ReadTimeout plus WriteTimeout). When ctx ends
// first, it closes them and returns ctx.Err(). It returns once no
// connection goroutine is left. It may be called more than once, and after
// Close.
func (s *AgentServer) Shutdown(ctx context.Context) error {
	err := s.stop()
	finished := make(chan struct{})
	go func() { // owned here: Shutdown waits for it below
		s.conns.Wait()
		close(finished)
	}()
	select {
	case <-finished:
	case <-ctx.Done():
		s.closeConns()
		<-finished
		err = ctx.Err()
	}
	s.flushLogs()
	return err
}

// Close closes the listeners and every connection now, without answering,
// and returns once no connection goroutine is left. It returns the error of
// closing a listener, if any. It may be called more than once, and after
// Shutdown.
func (s *AgentServer) Close() error {
	err := s.stop()
	s.closeConns()
	s.conns.Wait()
	s.flushLogs()
	return err
}

// stop marks the server closed and closes its listeners.
func (s *AgentServer) stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.closed = true
		close(s.done)
	}
	var err error
	for l := range s.listeners {
		if cerr := l.Close(); cerr != nil && !errors.Is(cerr, net.ErrClosed) && err == nil {
			err = fmt.Errorf("agent server: close listener %s: %w", l.Addr(), cerr)
		}
	}
	return err
}

// closeConns closes every tracked connection. Called after stop, so no new
// connection is tracked afterwards.
func (s *AgentServer) closeConns() {
	for i := range s.slots {
		s.slots[i].close()
	}
}

// flushLogs reports, once, the events still suppressed by the rate limits.
func (s *AgentServer) flushLogs() {
	s.flushed.Do(func() {
		for k, l := range s.limits {
			if n := l.Flush(); n > 0 {
				s.log.Warn("agent server: events not logged at stop due to rate limits",
					zap.String("kind", logKindNames[k]), zap.Int64("suppressed", n))
			}
		}
	})
}

func (s *AgentServer) isClosed() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// trackListener adds or removes l; adding fails once the server is closed.
func (s *AgentServer) trackListener(l *onceCloseListener, add bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !add {
		delete(s.listeners, l)
		return true
	}
	if s.closed {
		return false
	}
	s.listeners[l] = struct{}{}
	return true
}

func (cs *connSlot) set(c net.Conn) {
	cs.mu.Lock()
	cs.c = c
	cs.mu.Unlock()
}

func (cs *connSlot) close() {
	cs.mu.Lock()
	if cs.c != nil {
		cs.c.Close()
	}
	cs.mu.Unlock()
}

// onceCloseListener makes Close idempotent (Serve and Shutdown both close).
type onceCloseListener struct {
	net.Listener
	once sync.Once
	err  error
}

func (l *onceCloseListener) Close() error {
	l.once.Do(func() { l.err = l.Listener.Close() })
	return l.err
}

// agentMetrics are the agent server's metrics, with the label values
// resolved once so that counting a probe does not allocate.
type agentMetrics struct {
	answered, withheld, malformed, timeout, rejected prometheus.Counter
	// withheldInvalid and withheldUnconfirmed split withheld by why,
	// as far as the agent server can tell (see init).
	withheldInvalid, withheldUnconfirmed prometheus.Counter
	writeErrors                          prometheus.Counter
	duration                             prometheus.Histogram
	active                               prometheus.Gauge
}

func (m *agentMetrics) init(reg prometheus.Registerer) {
	f := promauto.With(reg)
	checks := f.NewCounterVec(prometheus.CounterOpts{
		Name: "hastate_agent_checks_total",
		Help: "Per replica (sum over replicas for the fleet): agent-check probes by result: answered, withheld (no answer: the replica holds no valid state for the server), malformed (bad request or read error), timeout (request not complete within the read timeout), rejected (over the connection limit).",
	}, []string{"result"})
	m.answered = checks.WithLabelValues("answered")
	m.withheld = checks.WithLabelValues("withheld")
	m.malformed = checks.WithLabelValues("malformed")
	m.timeout = checks.WithLabelValues("timeout")
	m.rejected = checks.WithLabelValues("rejected")
	withheld := f.NewCounterVec(prometheus.CounterOpts{
		Name: "hastate_agent_withheld_total",
		Help: "Per replica: agent checks answered nothing (result withheld of hastate_agent_checks_total), by why: invalid_key (the server's key is invalid and has no last valid value: fix the key, hastate status names it), unconfirmed (the replica had no state it could confirm with the raft leader: an election, a lost quorum, a replica catching up or holding no state; hastate_withheld says which while it lasts).",
	}, []string{"reason"})
	m.withheldInvalid = withheld.WithLabelValues("invalid_key")
	m.withheldUnconfirmed = withheld.WithLabelValues("unconfirmed")
	m.writeErrors = f.NewCounter(prometheus.CounterOpts{
		Name: "hastate_agent_write_errors_total",
		Help: "Per replica: agent-check answers that could not be written (the probe is not counted as answered).",
	})
	m.duration = f.NewHistogram(prometheus.HistogramOpts{
		Name:    "hastate_agent_check_duration_seconds",
		Help:    "Per replica: time from accepting an agent-check connection to having written its answer (answered probes only).",
		Buckets: []float64{50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 500e-3, 1},
	})
	m.active = f.NewGauge(prometheus.GaugeOpts{
		Name: "hastate_agent_connections_active",
		Help: "Per replica: agent-check connections being served now.",
	})
}
