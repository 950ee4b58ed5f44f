package raftport

// This file holds the named queries answered line by line on a connection
// kept open (a follower's "readindex" to its leader, a leader's "ack" to a
// voter): the serving side (serveLines) and the asking side (LineConn).

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net"
	"time"
)

// lineIdle closes a kept-open connection that carried no request for this
// long.
const lineIdle = 30 * time.Second

// LineAnswer is an answer that writes itself as one line of JSON (one
// value, then LF), so that serveLines encodes it without reflection; any
// other answer is encoded with encoding/json. Confirmed reads answer one
// line per round (cluster/DESIGN.md, "Pipelining").
type LineAnswer interface {
	AppendJSONLine(b []byte) []byte
}

// LineDecoder is an answer that reads itself from one line of JSON, so
// that Ask decodes it without reflection. DecodeJSONLine reports false
// when the line is not in the form it reads (and leaves the value zero);
// Ask then decodes the line with encoding/json.
type LineDecoder interface {
	DecodeJSONLine(line []byte) bool
}

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
	var out []byte
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
		if out, err = appendJSONLine(out[:0], v); err != nil {
			return
		}
		_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write(out); err != nil {
			return
		}
	}
}

// appendJSONLine appends v as one line of JSON, as json.Encoder writes it.
func appendJSONLine(b []byte, v any) ([]byte, error) {
	if a, ok := v.(LineAnswer); ok {
		return a.AppendJSONLine(b), nil
	}
	j, err := json.Marshal(v)
	if err != nil {
		return b, err
	}
	return append(append(b, j...), '\n'), nil
}

// maxAnswerLine bounds an answer line read by Ask.
const maxAnswerLine = 64 << 10

// LineConn is a connection kept open for one named query answered line by
// line; one request at a time. Its zero value is not usable: make it with
// Layer.LineConn.
type LineConn struct {
	layer *Layer
	addr  string
	c     net.Conn
	r     *bufio.Reader
	req   []byte
}

// LineConn returns a closed LineConn that dials through s when asked.
func (s *Layer) LineConn() *LineConn { return &LineConn{layer: s} }

// Ask sends one request line (with its LF) to addr, reusing the open
// connection when it goes there (a new one starts with the query's name),
// and decodes the answer, one line of JSON, into v (by v's own
// DecodeJSONLine when it is a LineDecoder). known is false when the peer
// answered null: it runs a release without the query.
func (lc *LineConn) Ask(addr, query, line string, deadline time.Time, v any) (known bool, err error) {
	if lc.c != nil && lc.addr != addr {
		lc.Close()
	}
	lc.req = lc.req[:0]
	if lc.c == nil {
		c, err := lc.layer.dial(addr, KindQuery, time.Until(deadline))
		if err != nil {
			return true, err
		}
		lc.c, lc.addr, lc.r = c, addr, bufio.NewReaderSize(c, 512)
		lc.req = append(append(lc.req, query...), '\n')
	}
	lc.req = append(lc.req, line...)
	_ = lc.c.SetWriteDeadline(deadline)
	if _, err := lc.c.Write(lc.req); err != nil {
		lc.Close()
		return true, err
	}
	_ = lc.c.SetReadDeadline(deadline)
	ans, err := readAnswer(lc.r)
	if err != nil {
		lc.Close() // a late answer would be taken for the next request's
		return true, err
	}
	if string(bytes.TrimSpace(ans)) == "null" {
		lc.Close()
		return false, nil
	}
	if d, ok := v.(LineDecoder); ok && d.DecodeJSONLine(ans) {
		return true, nil
	}
	return true, json.Unmarshal(ans, v)
}

// readAnswer reads one answer line (LF included), valid until the next
// read of r.
func readAnswer(r *bufio.Reader) ([]byte, error) {
	line, err := r.ReadSlice('\n')
	if err != bufio.ErrBufferFull {
		return line, err
	}
	long := append([]byte(nil), line...)
	for err == bufio.ErrBufferFull && len(long) < maxAnswerLine {
		line, err = r.ReadSlice('\n')
		long = append(long, line...)
	}
	if err == bufio.ErrBufferFull {
		return nil, fmt.Errorf("an answer line longer than %d bytes", maxAnswerLine)
	}
	return long, err
}

// Close closes the connection; the next Ask dials again.
func (lc *LineConn) Close() {
	if lc.c != nil {
		lc.c.Close()
	}
	lc.c, lc.r, lc.addr = nil, nil, ""
}
