package cluster

import (
	"crypto/tls"
	"fmt"
	"net"
	"time"

	"github.com/hashicorp/raft"
)

// streamLayer is raft's network layer over plain TCP (or mutual TLS). It
// listens on a bind address but advertises a host name, and dials peers by
// name at connect time: a StatefulSet pod that comes back with a new IP
// under the same DNS name is reached again without reconfiguring raft.
// (raft.NewTCPTransport insists on an IP advertise address.)
type streamLayer struct {
	net.Listener
	advertise advertiseAddr
	tls       *tls.Config // nil: plain TCP
	dialer    net.Dialer
}

type advertiseAddr string

func (a advertiseAddr) Network() string { return "tcp" }
func (a advertiseAddr) String() string  { return string(a) }

var _ raft.StreamLayer = (*streamLayer)(nil)

func newStreamLayer(bind, advertise string, tlsConf *tls.Config) (*streamLayer, error) {
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
	return &streamLayer{Listener: ln, advertise: advertiseAddr(advertise), tls: tlsConf}, nil
}

// Addr is the advertised address, which raft hands to its peers.
func (s *streamLayer) Addr() net.Addr { return s.advertise }

// Dial resolves the peer's name now, not at start-up.
func (s *streamLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	d := s.dialer
	d.Timeout = timeout
	if s.tls != nil {
		return (&tls.Dialer{NetDialer: &d, Config: s.tls}).Dial("tcp", string(address))
	}
	return d.Dial("tcp", string(address))
}
