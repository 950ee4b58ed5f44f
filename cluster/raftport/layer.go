package raftport

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/internal/accept"
	"github.com/hastate/hastate/internal/ratelog"

	"github.com/hashicorp/raft"
	"go.uber.org/zap"
)

// The raft port carries two kinds of connection, told apart by their first
// byte: raft's own RPCs and hastate's named queries between members. One
// port keeps the firewall and the TLS story simple. The node's own status
// (api.PeerStatus) is the named query "status" (StatusQuery); the node adds
// others (Config.Queries, ArgQueries, Lines).
const (
	KindRaft  byte = 'R'
	KindQuery byte = 'Q' // followed by a query name and LF; answered with JSON
	// KindStatus is how replicas of versions before "status" was a named
	// query ask for it: the kind byte alone. It is answered as the query
	// "status", and asked only of a replica that answers that query with
	// null (one of those versions, which knows no such name), so that a
	// rolling upgrade works in both directions.
	KindStatus byte = 'S'
)

// StatusQuery is the name of the node's own status query.
const StatusQuery = "status"

// NoPipelining is the raft transport's MaxRPCsInFlight: below raft's
// minimum for pipelining (2), so AppendEntriesPipeline says it is not
// supported and raft replicates with one AppendEntries at a time.
//
// raft v1.7.3's pipeline deadlocks: its netPipeline channels are sized
// MaxRPCsInFlight-2, unbuffered at the default 2. When a follower answers
// Success=false or with a newer term, pipelineDecode returns and nothing
// reads the pipeline's done channel any more; if pipelineReplicate's loop
// then picks a send (a trigger, or its CommitTimeout, every 3 ms here)
// over the decoder's finish, the send parks on the in-progress channel
// while the decoder parks on the done channel, and the pipeline's Close,
// deferred in pipelineReplicate, never runs. Replication to that follower
// stops for good while heartbeats keep it from starting an election, and
// raft.Shutdown waits for the stuck goroutine forever. That was the hang
// of `go test ./cluster` (a soak caught it in the Shutdown of the old
// leader in TestRampContinuesAcrossLeaderChange; the dump ends in
// goroutines created by raft's NetworkTransport.listen). CommitTimeout at
// 3 ms makes the bad pick likely. hashicorp/raft#612 is the stall;
// grafana/pyroscope#5518 found the cause and turned pipelining off the
// same way.
// A larger value only makes the window rarer: both channels stay bounded.
//
// The cost is small at hastate's rate of entries: one round trip per
// append still carries every entry waiting (up to MaxAppendEntries), and
// a single entry commits in one round trip either way.
const NoPipelining = 1

// Layer is raft's network layer over plain TCP (or mutual TLS). It
// listens on a bind address but advertises a host name, and dials peers by
// name at connect time: a StatefulSet pod that comes back with a new IP
// under the same DNS name is reached again without reconfiguring raft.
// (raft.NewTCPTransport insists on an IP advertise address.)
//
// Every inbound connection passes the guard (caps per remote address and in
// total, closed at once when over), then must identify itself (the TLS
// handshake, then its kind byte) within the identify timeout. Only then is
// it handed to raft or answered.
type Layer struct {
	ln        net.Listener // plain TCP; TLS is layered per connection
	advertise advertiseAddr
	tls       *tls.Config           // nil: plain TCP
	queries   map[string]func() any // Config.Queries and "status"
	// argQueries are the named queries that take an argument: one line
	// of JSON after the name.
	argQueries map[string]func(json.RawMessage) any
	// lines are the named queries answered line by line on a connection
	// that stays open (Config.Lines).
	lines    map[string]LineHandler
	log      *zap.Logger
	identify time.Duration
	guard    *connGuard
	metrics  *Metrics
	rejects  *rejectLog
	retries  *ratelog.Limiter // accept retries logged
	// failed receives the Accept error that ended the accept loop (one at
	// most); Failed hands it to the node's owner.
	failed chan error

	raftConns chan net.Conn
	// queriesReady is closed once the node can answer named
	// queries (its raft is up); until then those connections wait.
	queriesReady chan struct{}
	readyOnce    sync.Once
	closed       chan struct{}
	closeOnce    sync.Once
	wg           sync.WaitGroup
}

// LineHandler answers one request line of a named query served line by
// line (Config.Lines): answer is encoded as one JSON value; keep false
// closes the connection instead (nothing is sent). peer is the
// certificate of a mutual TLS connection (nil on plain TCP).
type LineHandler func(peer *x509.Certificate, line string) (answer any, keep bool)

// Config is what New needs.
type Config struct {
	Bind, Advertise string
	TLS             *tls.Config
	// Status answers the query "status" (nil: null).
	Status func() api.PeerStatus
	// Queries are the named queries answered with one JSON value,
	// ArgQueries those that take one line of JSON as their argument, Lines
	// those answered line by line on a connection kept open. A name may
	// be used once, and never "status".
	Queries    map[string]func() any
	ArgQueries map[string]func(json.RawMessage) any
	Lines      map[string]LineHandler
	Log        *zap.Logger
	Metrics    *Metrics
	Limits     Limits // with its defaults set (Limits.WithDefaults)
	// Peers is the size of the initial cluster; more than one without TLS
	// is warned about.
	Peers int
}

type advertiseAddr string

func (a advertiseAddr) Network() string { return "tcp" }
func (a advertiseAddr) String() string  { return string(a) }

var _ raft.StreamLayer = (*Layer)(nil)

// errLayerClosed is returned by Accept after Close.
var errLayerClosed = errors.New("raft stream layer closed")

// New listens on c.Bind and starts accepting. Named queries wait until
// ServeQueries; raft's connections are handed to Accept.
func New(c Config) (*Layer, error) {
	if _, _, err := net.SplitHostPort(c.Advertise); err != nil {
		return nil, fmt.Errorf("raft advertise address %q: want host:port: %w", c.Advertise, err)
	}
	queries := maps.Clone(c.Queries)
	if queries == nil {
		queries = map[string]func() any{}
	}
	if _, ok := queries[StatusQuery]; ok {
		return nil, fmt.Errorf("peer query %q: the name is the node's own %s query; name the query otherwise", StatusQuery, StatusQuery)
	}
	if c.Status != nil {
		queries[StatusQuery] = func() any { return c.Status() }
	}
	for name := range c.Lines {
		_, q := queries[name]
		_, aq := c.ArgQueries[name]
		if q || aq {
			return nil, fmt.Errorf("peer query %q: the name is the node's own %s query; name the query otherwise", name, name)
		}
	}
	ln, err := net.Listen("tcp", c.Bind)
	if err != nil {
		return nil, fmt.Errorf("raft listen on %s: %w (is another hastate using this --raft-addr?)", c.Bind, err)
	}
	s := &Layer{ln: ln, advertise: advertiseAddr(c.Advertise), tls: c.TLS, queries: queries, argQueries: c.ArgQueries, lines: c.Lines, log: c.Log,
		identify: c.Limits.IdentifyTimeout, guard: newConnGuard(c.Limits.MaxConnsPerIP, c.Limits.MaxConns, c.Metrics.Open), metrics: c.Metrics,
		rejects: newRejectLog(c.Log, time.Second), retries: ratelog.New(time.Second, nil), failed: make(chan error, 1),
		raftConns: make(chan net.Conn), queriesReady: make(chan struct{}), closed: make(chan struct{})}
	if c.TLS != nil {
		c.Metrics.TLSEnabled.Set(1)
	} else if c.Peers > 1 {
		c.Log.Warn("the raft port of this multi-node cluster runs without TLS: anyone who reaches it can send raft RPCs (and so change what replicas serve) and read status and pollers; "+
			"turn mutual TLS on with --raft-tls-cert, --raft-tls-key and --raft-tls-ca (see the README, \"Raft mutual TLS\")",
			zap.String("raft_addr", c.Bind), zap.Int("peers", c.Peers))
	}
	s.wg.Add(1)
	go s.acceptLoop()
	return s, nil
}

// acceptLoop runs the raft port's accept loop (internal/accept: the same
// rules as the agent-check port's). An Accept error that is not temporary
// ends it: the port takes no more connections, which ListenerFailed
// reports so that the replica is restarted.
func (s *Layer) acceptLoop() {
	defer s.wg.Done()
	err := accept.Loop(s.ln, s.closed, s.admit, func(err error, pause time.Duration) {
		if ok, hidden := s.retries.Allow(); ok {
			s.log.Warn("raft accept failed; retrying (check the file descriptor limit)", zap.Error(err), zap.Duration("retry_in", pause), zap.Int64("suppressed", hidden))
		}
	})
	if err != nil {
		err = fmt.Errorf("raft accept on %s: %w", s.ln.Addr(), err)
		s.log.Error("the raft port stopped accepting connections", zap.Error(err))
		s.failed <- err
	}
}

// admit passes an accepted connection through the guard and starts its
// routing goroutine.
func (s *Layer) admit(c net.Conn) {
	gc, reason := s.guard.admit(c)
	if reason != "" {
		s.reject(c, reason, nil)
		return
	}
	s.wg.Add(1)
	go s.route(gc)
}

// Failed receives an error when the port stopped accepting connections
// for another reason than Close (an Accept error that is not temporary).
func (s *Layer) Failed() <-chan error { return s.failed }

// OpenFrom is the number of inbound connections held open from ip.
func (s *Layer) OpenFrom(ip string) int { return s.guard.openFrom(ip) }

// reject closes a connection unserved, counts it and logs it (rate-limited).
// Connections cut by Close are neither counted nor logged.
func (s *Layer) reject(c net.Conn, reason string, err error) {
	c.Close()
	select {
	case <-s.closed:
		return
	default:
	}
	s.metrics.Rejected.WithLabelValues(reason).Inc()
	s.rejects.warn(reason, c.RemoteAddr(), err)
}

// route makes the connection identify itself (the TLS handshake, then its
// kind byte) within the identify timeout, then hands it to raft or answers
// it. A connection that fails TLS never reaches raft or a query.
func (s *Layer) route(c net.Conn) {
	defer s.wg.Done()
	raw := c
	_ = c.SetDeadline(time.Now().Add(s.identify))
	if s.tls != nil {
		tc := tls.Server(c, s.tls)
		if err := tc.Handshake(); err != nil {
			s.reject(raw, rejectTLS, err)
			return
		}
		c = tc
	}
	var kind [1]byte
	if _, err := io.ReadFull(c, kind[:]); err != nil {
		s.reject(raw, rejectIdentify, err)
		return
	}
	_ = c.SetDeadline(time.Time{})
	switch kind[0] {
	case KindRaft:
		select {
		case s.raftConns <- c:
		case <-s.closed:
			c.Close()
		}
	case KindStatus, KindQuery:
		select {
		case <-s.queriesReady:
		case <-s.closed:
			c.Close()
			return
		}
		s.answer(c, kind[0])
	default:
		s.reject(raw, rejectKind, fmt.Errorf("first byte %#x", kind[0]))
	}
}

// ServeQueries lets named queries (the status among them) be answered.
func (s *Layer) ServeQueries() { s.readyOnce.Do(func() { close(s.queriesReady) }) }

// answer serves one named query (KindStatus: the query "status") and
// closes the connection. An unknown name is answered with null.
func (s *Layer) answer(c net.Conn, kind byte) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	name := StatusQuery
	var r *bufio.Reader
	if kind == KindQuery {
		r = bufio.NewReaderSize(c, 64)
		line, err := readLine(r, 64)
		if err != nil {
			return
		}
		name = line
		if h, ok := s.lines[name]; ok {
			serveLines(c, r, h) // stays open for the next requests
			return
		}
	}
	var v any
	if q, ok := s.queries[name]; ok {
		v = q()
	} else if q, ok := s.argQueries[name]; ok && r != nil {
		arg, err := readLine(r, maxQueryArg)
		if err != nil {
			return
		}
		v = q(json.RawMessage(arg))
	}
	// As json.Encoder writes it; an answer that writes itself
	// (LineAnswer: a peer's poll-summary, 1 MB at 10,000 servers) is
	// not scanned and compacted again.
	if b, err := appendJSONLine(nil, v); err == nil {
		_, _ = c.Write(b)
	}
}

// maxQueryArg bounds the argument line of a named query.
const maxQueryArg = 64 << 10

// readLine reads a line of at most limit bytes (LF included) from r,
// without its LF.
func readLine(r *bufio.Reader, limit int) (string, error) {
	var b []byte
	for len(b) < limit {
		c, err := r.ReadByte()
		if err != nil {
			return "", err
		}
		if c == '\n' {
			return string(b), nil
		}
		b = append(b, c)
	}
	return "", fmt.Errorf("query line longer than %d bytes", limit)
}

// Accept returns the next raft connection.
func (s *Layer) Accept() (net.Conn, error) {
	select {
	case c := <-s.raftConns:
		return c, nil
	case <-s.closed:
		return nil, errLayerClosed
	}
}

// Close stops accepting, closes every inbound connection (raft's handlers
// of inbound connections only return when their connection closes) and
// waits for the routing goroutines.
func (s *Layer) Close() error {
	var err error
	s.closeOnce.Do(func() {
		close(s.closed)
		err = s.ln.Close()
		s.guard.closeAll()
		s.wg.Wait()
	})
	return err
}

// Addr is the advertised address, which raft hands to its peers.
func (s *Layer) Addr() net.Addr { return s.advertise }

// Dial resolves the peer's name now, not at start-up.
func (s *Layer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	return s.dial(string(address), KindRaft, timeout)
}

func (s *Layer) dial(address string, kind byte, timeout time.Duration) (net.Conn, error) {
	d := &net.Dialer{Timeout: timeout}
	var c net.Conn
	var err error
	if s.tls != nil {
		c, err = (&tls.Dialer{NetDialer: d, Config: s.tls}).Dial("tcp", address)
	} else {
		c, err = d.Dial("tcp", address)
	}
	if err != nil {
		return nil, err
	}
	_ = c.SetWriteDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte{kind}); err != nil {
		c.Close()
		return nil, err
	}
	_ = c.SetWriteDeadline(time.Time{})
	return c, nil
}

// Query asks the node at address for the answer to a named query: JSON,
// null if it knows no such query.
func (s *Layer) Query(address, name string, timeout time.Duration) (json.RawMessage, error) {
	c, err := s.dial(address, KindQuery, timeout)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := io.WriteString(c, name+"\n"); err != nil {
		return nil, err
	}
	var raw json.RawMessage
	err = json.NewDecoder(io.LimitReader(c, 64<<20)).Decode(&raw)
	return raw, err
}

// QueryWith asks the node at address for the answer to a named query that
// takes an argument (arg: compact JSON, one line): its line of JSON as it
// came, not validated (readQueryAnswer: its decoding reports a malformed
// one), null if it knows no such query. A release that does not know the name answers null
// without reading the argument, and may reset the connection for it:
// callers fall back to a query that release knows on null or an error.
func (s *Layer) QueryWith(address, name string, arg []byte, timeout time.Duration) (json.RawMessage, error) {
	if len(arg) >= maxQueryArg || bytes.IndexByte(arg, '\n') >= 0 {
		return nil, fmt.Errorf("peer query %q: the argument is longer than %d bytes or holds a line break", name, maxQueryArg)
	}
	c, err := s.dial(address, KindQuery, timeout)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write(append(append([]byte(name+"\n"), arg...), '\n')); err != nil {
		return nil, err
	}
	return readQueryAnswer(c, maxQueryAnswer)
}

// maxQueryAnswer bounds the answer to a named query with an argument.
const maxQueryAnswer = 64 << 20

// readQueryAnswer reads the answer to a named query: one line of JSON, as
// every release writes it (json.Encoder's, or a LineAnswer's), returned
// without its LF and not scanned: its reader's decoding reports a
// malformed one (a peer's poll-summary, 1 MB at 10,000 servers, was
// scanned twice here and again when decoded). An answer that ends
// without its LF is returned when it is JSON; otherwise, cut short, it is
// io.ErrUnexpectedEOF, and no answer at all io.EOF, as json.Decoder
// reported them.
func readQueryAnswer(r io.Reader, limit int) (json.RawMessage, error) {
	buf := make([]byte, 0, 16<<10)
	for {
		if len(buf) == cap(buf) {
			if len(buf) >= limit {
				return nil, fmt.Errorf("an answer longer than %d bytes: ask for less (a smaller chunk)", limit)
			}
			buf = slices.Grow(buf, min(len(buf), limit-len(buf)))
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		if i := bytes.IndexByte(buf[len(buf):len(buf)+n], '\n'); i >= 0 {
			return bytes.TrimSpace(buf[:len(buf)+i]), nil
		}
		buf = buf[:len(buf)+n]
		switch {
		case err == io.EOF && len(bytes.TrimSpace(buf)) == 0:
			return nil, io.EOF
		case err == io.EOF && json.Valid(buf):
			return bytes.TrimSpace(buf), nil
		case err == io.EOF:
			return nil, io.ErrUnexpectedEOF
		case err != nil:
			return nil, err
		}
	}
}

// QueryStatus asks the node at address for its api.PeerStatus, the named
// query "status"; a replica of an older version answers that with null,
// and is asked the way it knows (KindStatus).
func (s *Layer) QueryStatus(address string, timeout time.Duration) (api.PeerStatus, error) {
	var st api.PeerStatus
	raw, err := s.Query(address, StatusQuery, timeout)
	if err == nil && string(raw) == "null" {
		raw, err = s.legacyStatus(address, timeout)
	}
	if err != nil {
		return st, err
	}
	err = json.Unmarshal(raw, &st)
	return st, err
}

// legacyStatus asks for the status with KindStatus, as versions before
// the named query did.
func (s *Layer) legacyStatus(address string, timeout time.Duration) (json.RawMessage, error) {
	c, err := s.dial(address, KindStatus, timeout)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	var raw json.RawMessage
	err = json.NewDecoder(io.LimitReader(c, 64<<10)).Decode(&raw)
	return raw, err
}
