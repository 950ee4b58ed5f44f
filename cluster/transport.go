package cluster

import (
	"bufio"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	"go.uber.org/zap"
)

// The raft port carries two kinds of connection, told apart by their first
// byte: raft's own RPCs and hastate's peer status query (each node's Consul
// reachability, which the leader needs to pick a successor when its own
// Consul watch fails). One port keeps the firewall and the TLS story simple.
const (
	connRaft   byte = 'R'
	connStatus byte = 'S'
	connQuery  byte = 'Q' // followed by a query name and LF; answered with JSON
)

// PeerStatus is what a node reports about itself over the raft port.
type PeerStatus struct {
	ID              string    `json:"id"`
	ConsulReachable bool      `json:"consul_reachable"`
	ConsulChecked   time.Time `json:"consul_checked"`
	State           string    `json:"state"`
	// LastContact is how long ago this node last heard from the leader
	// (empty on the leader itself).
	LastContact  string `json:"last_contact,omitempty"`
	AppliedIndex uint64 `json:"applied_index"`
	// StateIndex is the raft index of the last entry this node serves
	// (raft's applied index may run ahead while entries wait in the FSM's
	// queue).
	StateIndex uint64 `json:"state_index"`
	// KVSynced and KVSyncAgeSeconds are the leader's KV sync report
	// (see KVView); a leader's ConsulReachable includes its watch.
	KVSynced         bool    `json:"kv_synced,omitempty"`
	KVSyncAgeSeconds float64 `json:"kv_sync_age_seconds,omitempty"`
}

// streamLayer is raft's network layer over plain TCP (or mutual TLS). It
// listens on a bind address but advertises a host name, and dials peers by
// name at connect time: a StatefulSet pod that comes back with a new IP
// under the same DNS name is reached again without reconfiguring raft.
// (raft.NewTCPTransport insists on an IP advertise address.)
type streamLayer struct {
	ln        net.Listener
	advertise advertiseAddr
	tls       *tls.Config // nil: plain TCP
	status    func() PeerStatus
	queries   map[string]func() any
	log       *zap.Logger

	raftConns chan net.Conn
	// queriesReady is closed once the node can answer status and named
	// queries (its raft is up); until then those connections wait.
	queriesReady chan struct{}
	readyOnce    sync.Once
	mu           sync.Mutex
	open         map[net.Conn]struct{} // raft conns handed out, closed on Close
	closed       chan struct{}
	closeOnce    sync.Once
	wg           sync.WaitGroup
}

type advertiseAddr string

func (a advertiseAddr) Network() string { return "tcp" }
func (a advertiseAddr) String() string  { return string(a) }

var _ raft.StreamLayer = (*streamLayer)(nil)

// errLayerClosed is returned by Accept after Close.
var errLayerClosed = errors.New("raft stream layer closed")

func newStreamLayer(bind, advertise string, tlsConf *tls.Config, status func() PeerStatus, queries map[string]func() any, log *zap.Logger) (*streamLayer, error) {
	if _, _, err := net.SplitHostPort(advertise); err != nil {
		return nil, fmt.Errorf("raft advertise address %q: want host:port: %w", advertise, err)
	}
	ln, err := net.Listen("tcp", bind)
	if err != nil {
		return nil, fmt.Errorf("raft listen on %s: %w (is another hastate using this --raft-addr?)", bind, err)
	}
	if tlsConf != nil {
		ln = tls.NewListener(ln, tlsConf)
	}
	s := &streamLayer{ln: ln, advertise: advertiseAddr(advertise), tls: tlsConf, status: status, queries: queries, log: log,
		raftConns: make(chan net.Conn), queriesReady: make(chan struct{}), open: map[net.Conn]struct{}{}, closed: make(chan struct{})}
	s.wg.Add(1)
	go s.acceptLoop()
	return s, nil
}

func (s *streamLayer) acceptLoop() {
	defer s.wg.Done()
	var delay time.Duration
	for {
		c, err := s.ln.Accept()
		if err != nil {
			select {
			case <-s.closed:
				return
			default:
			}
			delay = max(5*time.Millisecond, min(2*delay, time.Second))
			s.log.Warn("raft accept failed; retrying", zap.Error(err), zap.Duration("retry_in", delay))
			select {
			case <-time.After(delay):
			case <-s.closed:
				return
			}
			continue
		}
		delay = 0
		s.wg.Add(1)
		go s.route(c)
	}
}

// route reads the connection's kind and hands it to raft or answers it.
func (s *streamLayer) route(c net.Conn) {
	defer s.wg.Done()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var kind [1]byte
	if _, err := io.ReadFull(c, kind[:]); err != nil {
		c.Close()
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	switch kind[0] {
	case connRaft:
		select {
		case s.raftConns <- c:
		case <-s.closed:
			c.Close()
		}
	case connStatus, connQuery:
		select {
		case <-s.queriesReady:
		case <-s.closed:
			c.Close()
			return
		}
		s.answer(c, kind[0])
	default:
		c.Close()
	}
}

// serveQueries lets status and named queries be answered.
func (s *streamLayer) serveQueries() { s.readyOnce.Do(func() { close(s.queriesReady) }) }

// answer serves one status or named query and closes the connection.
func (s *streamLayer) answer(c net.Conn, kind byte) {
	switch kind {
	case connStatus:
		defer c.Close()
		_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
		var st PeerStatus
		if s.status != nil {
			st = s.status()
		}
		_ = json.NewEncoder(c).Encode(st)
	case connQuery:
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		name, err := bufio.NewReaderSize(io.LimitReader(c, 64), 64).ReadString('\n')
		if err != nil {
			return
		}
		var v any
		if q, ok := s.queries[strings.TrimSuffix(name, "\n")]; ok {
			v = q()
		}
		_ = json.NewEncoder(c).Encode(v)
	}
}

// Accept returns the next raft connection.
func (s *streamLayer) Accept() (net.Conn, error) {
	select {
	case c := <-s.raftConns:
		s.mu.Lock()
		s.open[c] = struct{}{}
		s.mu.Unlock()
		return &trackedConn{Conn: c, s: s}, nil
	case <-s.closed:
		return nil, errLayerClosed
	}
}

// Close stops accepting and waits for the routing goroutines.
func (s *streamLayer) Close() error {
	var err error
	s.closeOnce.Do(func() {
		close(s.closed)
		err = s.ln.Close()
		s.wg.Wait()
		// raft's handlers of inbound connections only return when their
		// connection closes.
		s.mu.Lock()
		for c := range s.open {
			c.Close()
		}
		s.mu.Unlock()
	})
	return err
}

// trackedConn forgets itself in the layer when raft closes it.
type trackedConn struct {
	net.Conn
	s *streamLayer
}

func (c *trackedConn) Close() error {
	c.s.mu.Lock()
	delete(c.s.open, c.Conn)
	c.s.mu.Unlock()
	return c.Conn.Close()
}

// Addr is the advertised address, which raft hands to its peers.
func (s *streamLayer) Addr() net.Addr { return s.advertise }

// Dial resolves the peer's name now, not at start-up.
func (s *streamLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	return s.dial(string(address), connRaft, timeout)
}

func (s *streamLayer) dial(address string, kind byte, timeout time.Duration) (net.Conn, error) {
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

// query asks the node at address for the answer to a named query.
func (s *streamLayer) query(address, name string, timeout time.Duration) (json.RawMessage, error) {
	c, err := s.dial(address, connQuery, timeout)
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

// queryStatus asks the node at address for its PeerStatus.
func (s *streamLayer) queryStatus(address string, timeout time.Duration) (PeerStatus, error) {
	var st PeerStatus
	c, err := s.dial(address, connStatus, timeout)
	if err != nil {
		return st, err
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	err = json.NewDecoder(io.LimitReader(c, 64<<10)).Decode(&st)
	return st, err
}
