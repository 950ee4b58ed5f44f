package server

import (
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/hastate/hastate/state"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// fakeRead is one result of fakeConn.Read.
type fakeRead struct {
	data string
	err  error
}

// fakeConn is a net.Conn that plays a script of reads and records the
// written bytes, without allocating, so that the per-connection handler's
// own allocations can be counted.
type fakeConn struct {
	script  []fakeRead
	next    int
	written []byte
	closed  bool
	addr    net.TCPAddr
}

var _ net.Conn = (*fakeConn)(nil)

func newFakeConn(script ...fakeRead) *fakeConn {
	return &fakeConn{
		script:  script,
		written: make([]byte, 0, 64),
		addr:    net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000},
	}
}

func (c *fakeConn) reset() {
	c.next, c.written, c.closed = 0, c.written[:0], false
}

func (c *fakeConn) Read(p []byte) (int, error) {
	if c.next >= len(c.script) {
		return 0, io.EOF
	}
	r := c.script[c.next]
	c.next++
	return copy(p, r.data), r.err
}

func (c *fakeConn) Write(p []byte) (int, error) {
	c.written = append(c.written, p...)
	return len(p), nil
}

func (c *fakeConn) Close() error                     { c.closed = true; return nil }
func (c *fakeConn) LocalAddr() net.Addr              { return &c.addr }
func (c *fakeConn) RemoteAddr() net.Addr             { return &c.addr }
func (c *fakeConn) SetDeadline(time.Time) error      { return nil }
func (c *fakeConn) SetReadDeadline(time.Time) error  { return nil }
func (c *fakeConn) SetWriteDeadline(time.Time) error { return nil }

// deadlineErr is what a real TCP read returns at its deadline.
var deadlineErr = &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}

func handlerCases() []struct {
	name   string
	script []fakeRead
	want   string
	result string
} {
	return []struct {
		name   string
		script []fakeRead
		want   string
		result string
	}{
		{"LF", []fakeRead{{data: "web/a\n"}}, "drain\n", "answered"},
		{"CRLF", []fakeRead{{data: "web/a\r\n"}}, "drain\n", "answered"},
		{"LF in second read", []fakeRead{{data: "web/"}, {data: "a\n"}}, "drain\n", "answered"},
		{"wildcard", []fakeRead{{data: "api/x\n"}}, "maint\n", "answered"},
		{"absent", []fakeRead{{data: "other/x\n"}}, "ready 100%\n", "answered"},
		{"no LF, quiet period", []fakeRead{{data: "web/a"}, {err: deadlineErr}}, "drain\n", "answered"},
		{"no LF, half-close", []fakeRead{{data: "web/a", err: io.EOF}}, "drain\n", "answered"},
		{"manual probe", []fakeRead{{data: "web/a\n" + state.ProbeMarker}}, "drain\n", "answered"},
		{"withheld", []fakeRead{{data: "web/bad\n"}}, "", "withheld"},
		{"no slash", []fakeRead{{data: "web\n"}}, "", "malformed"},
		{"empty", []fakeRead{{data: "\n"}}, "", "malformed"},
		{"EOF", []fakeRead{{err: io.EOF}}, "", "malformed"},
		{"too long", []fakeRead{{data: string(make([]byte, 300))}}, "", "malformed"},
		{"timeout", []fakeRead{{err: deadlineErr}}, "", "timeout"},
	}
}

func TestAgentServeConn(t *testing.T) {
	for _, tc := range handlerCases() {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestServer(t, AgentOptions{Source: staticSource(t, testKV)})
			c := newFakeConn(tc.script...)
			s.serveConn(c, time.Now(), nil)
			if string(c.written) != tc.want {
				t.Errorf("answer %q, want %q", c.written, tc.want)
			}
			if !c.closed {
				t.Error("connection not closed")
			}
			if got := testutil.ToFloat64(s.m.counter(tc.result)); got != 1 {
				t.Errorf("result %q counted %v times, want 1", tc.result, got)
			}
		})
	}
}

func BenchmarkAgentServeConn(b *testing.B) {
	s := newTestServer(b, AgentOptions{Source: staticSource(b, testKV)})
	c := newFakeConn(fakeRead{data: "web/a\n"})
	b.ReportAllocs()
	for b.Loop() {
		c.reset()
		s.serveConn(c, time.Now(), nil)
	}
}

// Issue 15.2: a manual probe (`hastate probe` sends state.ProbeMarker
// after its request) is answered but never recorded as an HAProxy, answered
// or withheld; the same request without the marker is.
func TestAgentManualProbeIsNotAPoller(t *testing.T) {
	pollers := newPollers(t, PollersOptions{})
	s := newTestServer(t, AgentOptions{Source: staticSource(t, testKV), Pollers: pollers})
	for _, req := range []string{"web/a\n" + state.ProbeMarker, "web/bad\n" + state.ProbeMarker, "web/a\r\n" + state.ProbeMarker} {
		c := newFakeConn(fakeRead{data: req})
		s.serveConn(c, time.Now(), nil)
		if n := pollers.Len(); n != 0 {
			t.Fatalf("after a manual probe %q (answered %q): %d pollers recorded, want none: %+v", req, c.written, n, pollers.List(time.Time{}))
		}
	}
	c := newFakeConn(fakeRead{data: "web/a\n"})
	s.serveConn(c, time.Now(), nil)
	if got := pollers.List(time.Time{}); len(got) != 1 || got[0].Backend != "web" || got[0].Server != "a" || got[0].Answer != "drain" {
		t.Fatalf("an HAProxy's check: pollers %+v, want web/a told drain", got)
	}
}
