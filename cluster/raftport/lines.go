package raftport

// This file holds the named queries answered line by line on a connection
// kept open (a follower's "readindex" to its leader, a leader's "ack" to a
// voter): the serving side (serveLines) and the asking side (LineConn).

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net"
	"time"
)

// lineIdle closes a kept-open connection that carried no request for this
// long.
const lineIdle = 30 * time.Second

// serveLines answers each request line on a connection kept open with one
// JSON value (h's; keep false: close the connection instead), until the
// peer closes or stays idle for lineIdle. On a mutual TLS connection the
// peer's certificate goes with each request.
func serveLines(c net.Conn, r *bufio.Reader, h LineHandler) {
	var peer *x509.Certificate
	if tc, ok := c.(*tls.Conn); ok {
		if certs := tc.ConnectionState().PeerCertificates; len(certs) > 0 {
			peer = certs[0]
		}
	}
	enc := json.NewEncoder(c)
	for {
		_ = c.SetReadDeadline(time.Now().Add(lineIdle))
		line, err := readLine(r, 128)
		if err != nil {
			return
		}
		v, keep := h(peer, line)
		if !keep {
			return
		}
		_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
		if err := enc.Encode(v); err != nil {
			return
		}
	}
}

// LineConn is a connection kept open for one named query answered line by
// line; one request at a time. Its zero value is not usable: make it with
// Layer.LineConn.
type LineConn struct {
	layer *Layer
	addr  string
	c     net.Conn
	dec   *json.Decoder
}

// LineConn returns a closed LineConn that dials through s when asked.
func (s *Layer) LineConn() *LineConn { return &LineConn{layer: s} }

// Ask sends one request line (with its LF) to addr, reusing the open
// connection when it goes there (a new one starts with the query's name),
// and decodes the answer into v. known is false when the peer answered
// null: it runs a release without the query.
func (lc *LineConn) Ask(addr, query, line string, deadline time.Time, v any) (known bool, err error) {
	if lc.c != nil && lc.addr != addr {
		lc.Close()
	}
	if lc.c == nil {
		c, err := lc.layer.dial(addr, KindQuery, time.Until(deadline))
		if err != nil {
			return true, err
		}
		lc.c, lc.addr, lc.dec = c, addr, json.NewDecoder(c)
		line = query + "\n" + line
	}
	_ = lc.c.SetWriteDeadline(deadline)
	if _, err := io.WriteString(lc.c, line); err != nil {
		lc.Close()
		return true, err
	}
	_ = lc.c.SetReadDeadline(deadline)
	var raw json.RawMessage
	if err := lc.dec.Decode(&raw); err != nil {
		lc.Close() // a late answer would be taken for the next request's
		return true, err
	}
	if string(raw) == "null" {
		lc.Close()
		return false, nil
	}
	return true, json.Unmarshal(raw, v)
}

// Close closes the connection; the next Ask dials again.
func (lc *LineConn) Close() {
	if lc.c != nil {
		lc.c.Close()
	}
	lc.c, lc.dec, lc.addr = nil, nil, ""
}
