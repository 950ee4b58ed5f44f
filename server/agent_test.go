package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/hastate/hastate/internal/testenv"
	"github.com/hastate/hastate/state"
)

func TestMain(m *testing.M) {
	if addr := os.Getenv(garbageEnv); addr != "" {
		runGarbageWriters(addr) // a child process of TestAgentIdleAndGarbageDoNotSlowChecks
		return
	}
	goleak.VerifyTestMain(m)
}

// testKV is the KV content most tests serve.
var testKV = map[string]string{
	"state/web/a":       "drain",
	"state/web/b":       "25%",
	"state/web/bad":     "bogus", // invalid, never valid: withheld
	"state/api/*":       "maint",
	"state/api/special": "ready",
}

func buildSnapshot(tb testing.TB, kv map[string]string) *state.Snapshot {
	tb.Helper()
	m := state.NewMirror()
	m.Apply(state.Change{Set: kv})
	return m.Snapshot()
}

// snapshotHolder is a SnapshotSource whose snapshot tests can swap.
type snapshotHolder struct {
	p atomic.Pointer[state.Snapshot]
}

var _ SnapshotSource = (*snapshotHolder)(nil)

func (h *snapshotHolder) Snapshot() *state.Snapshot { return h.p.Load() }

func staticSource(tb testing.TB, kv map[string]string) SnapshotSource {
	tb.Helper()
	snap := buildSnapshot(tb, kv)
	return SnapshotFunc(func() *state.Snapshot { return snap })
}

// counter returns the checks counter child for a result.
func (m *agentMetrics) counter(result string) prometheus.Counter {
	switch result {
	case "answered":
		return m.answered
	case "withheld":
		return m.withheld
	case "malformed":
		return m.malformed
	case "timeout":
		return m.timeout
	case "rejected":
		return m.rejected
	}
	panic("unknown result " + result)
}

func newTestServer(tb testing.TB, o AgentOptions) *AgentServer {
	tb.Helper()
	s, err := NewAgentServer(o)
	if err != nil {
		tb.Fatalf("NewAgentServer: %v", err)
	}
	return s
}

// agentFixture is a server serving on 127.0.0.1 with its own registry.
type agentFixture struct {
	s         *AgentServer
	addr      string
	reg       *prometheus.Registry
	serveDone chan error // receives Serve's result
}

// startAgent serves o on a fresh 127.0.0.1 port; the server is closed, and
// Serve's result checked, when the test ends.
func startAgent(t *testing.T, o AgentOptions) *agentFixture {
	t.Helper()
	if o.Source == nil {
		o.Source = staticSource(t, testKV)
	}
	f := &agentFixture{reg: prometheus.NewRegistry(), serveDone: make(chan error, 1)}
	o.Registerer = f.reg
	f.s = newTestServer(t, o)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	f.addr = ln.Addr().String()
	go func() { f.serveDone <- f.s.Serve(ln) }()
	t.Cleanup(func() {
		if err := f.s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		select {
		case err := <-f.serveDone:
			if !errors.Is(err, ErrServerClosed) {
				t.Errorf("Serve returned %v, want ErrServerClosed", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("Serve did not return after Close")
		}
	})
	return f
}

// checks returns hastate_agent_checks_total{result} as gathered from the registry.
func (f *agentFixture) checks(t *testing.T, result string) float64 {
	t.Helper()
	return gathered(t, f.reg, "hastate_agent_checks_total", result)
}

func gathered(t *testing.T, reg *prometheus.Registry, name, result string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			match := result == ""
			for _, l := range m.GetLabel() {
				if (l.GetName() == "result" || l.GetName() == "reason") && l.GetValue() == result {
					match = true
				}
			}
			if !match {
				continue
			}
			switch {
			case m.Counter != nil:
				return m.GetCounter().GetValue()
			case m.Gauge != nil:
				return m.GetGauge().GetValue()
			case m.Histogram != nil:
				return float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return 0
}

func dial(t *testing.T, addr string) *net.TCPConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return c.(*net.TCPConn)
}

// readAll reads until the server closes; a reset counts as a close.
func readAll(t *testing.T, c net.Conn) string {
	t.Helper()
	if err := c.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("server did not close the connection (read so far %q)", b)
	}
	return string(b)
}

// probe sends req on a new connection and returns everything the server
// sent before closing.
func probe(t *testing.T, addr, req string) string {
	t.Helper()
	c := dial(t, addr)
	if _, err := c.Write([]byte(req)); err != nil {
		t.Fatalf("write: %v", err)
	}
	return readAll(t, c)
}

func TestAgentAnswers(t *testing.T) {
	f := startAgent(t, AgentOptions{})
	tests := []struct {
		name, req, want string
	}{
		{"exact drain", "web/a\n", "drain\n"},
		{"CRLF", "web/a\r\n", "drain\n"},
		{"exact weight", "web/b\n", "ready 25%\n"},
		{"wildcard", "api/x\n", "maint\n"},
		{"exact beats wildcard", "api/special\n", "ready 100%\n"},
		{"absent", "nothing/here\n", "ready 100%\n"},
		{"absent server of known backend", "web/z\n", "ready 100%\n"},
		{"withheld", "web/bad\n", ""},
		{"no LF, half-closed", "web/b", "ready 25%\n"},
		{"longest request", strings.Repeat("b", 100) + "/" + strings.Repeat("s", 154) + "\n", "ready 100%\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := dial(t, f.addr)
			if _, err := c.Write([]byte(tc.req)); err != nil {
				t.Fatal(err)
			}
			if !strings.HasSuffix(tc.req, "\n") {
				c.CloseWrite()
			}
			if got := readAll(t, c); got != tc.want {
				t.Errorf("answer to %q = %q, want %q", tc.req, got, tc.want)
			}
		})
	}
	testenv.Eventually(t, 5*time.Second, func() error {
		return testenv.Expect(f.checks(t, "answered") == 9 && f.checks(t, "withheld") == 1,
			"answered %v withheld %v, want 9 and 1", f.checks(t, "answered"), f.checks(t, "withheld"))
	})
}

// arrivalSource is an ArrivalSource that records each arrival: whether
// it was taken, and which one SnapshotSince got back.
type arrivalSource struct {
	snap    *state.Snapshot
	mu      sync.Mutex
	taken   []*int // one per Arrived, in order
	since   []*int // what SnapshotSince got
	current int    // Snapshot calls (it must not be called)
}

func (a *arrivalSource) Arrived() any {
	a.mu.Lock()
	defer a.mu.Unlock()
	p := new(int)
	*p = len(a.taken)
	a.taken = append(a.taken, p)
	return p
}

func (a *arrivalSource) SnapshotSince(arrival any) *state.Snapshot {
	a.mu.Lock()
	defer a.mu.Unlock()
	p, _ := arrival.(*int)
	a.since = append(a.since, p)
	return a.snap
}

func (a *arrivalSource) Snapshot() *state.Snapshot {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.current++
	return a.snap
}

func (a *arrivalSource) counts() (taken, since, current int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.taken), len(a.since), a.current
}

// TestAgentTakesTheArrivalAtAccept: with an ArrivalSource the server takes
// a probe's arrival when its connection is accepted, before its request
// arrives (so that a confirmation runs while the request is read), and
// answers from SnapshotSince of that same arrival, never from Snapshot.
func TestAgentTakesTheArrivalAtAccept(t *testing.T) {
	src := &arrivalSource{snap: buildSnapshot(t, testKV)}
	f := startAgent(t, AgentOptions{Source: src})
	c := dial(t, f.addr)
	testenv.Eventually(t, 5*time.Second, func() error {
		taken, since, _ := src.counts()
		return testenv.Expect(taken == 1 && since == 0, "arrivals taken %d, answered %d: want the arrival taken at accept, before the request", taken, since)
	})
	if _, err := c.Write([]byte("web/a\n")); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, c); got != "drain\n" {
		t.Fatalf("answer %q, want %q", got, "drain\n")
	}
	if got := probe(t, f.addr, "api/x\n"); got != "maint\n" {
		t.Fatalf("second probe: answer %q, want %q", got, "maint\n")
	}
	src.mu.Lock()
	defer src.mu.Unlock()
	if len(src.since) != 2 || src.since[0] != src.taken[0] || src.since[1] != src.taken[1] || src.current != 0 {
		t.Fatalf("answered from arrivals %v (taken %v) and %d Snapshot calls; want each probe's own arrival and no Snapshot call", src.since, src.taken, src.current)
	}
}

func TestAgentNilSnapshotWithholds(t *testing.T) {
	f := startAgent(t, AgentOptions{Source: SnapshotFunc(func() *state.Snapshot { return nil })})
	if got := probe(t, f.addr, "web/a\n"); got != "" {
		t.Fatalf("answer %q from a replica without state, want none", got)
	}
	testenv.Eventually(t, 5*time.Second, func() error { return testenv.Expect(f.checks(t, "withheld") == 1, "withheld not counted") })
}

// Issue 45: hastate_withheld{reason} is a gauge, so why checks were
// withheld could not be seen afterwards. hastate_agent_withheld_total
// counts them by why: an invalid key, or no state the replica could
// confirm (an election, a lost quorum, ...).
func TestAgentCountsWithheldByReason(t *testing.T) {
	invalid := startAgent(t, AgentOptions{})
	if got := probe(t, invalid.addr, "web/bad\n"); got != "" {
		t.Fatalf("answer %q for an invalid key, want none", got)
	}
	none := startAgent(t, AgentOptions{Source: SnapshotFunc(func() *state.Snapshot { return nil })})
	for range 2 {
		if got := probe(t, none.addr, "web/a\n"); got != "" {
			t.Fatalf("answer %q from a replica without a confirmed state, want none", got)
		}
	}
	testenv.Eventually(t, 5*time.Second, func() error {
		i, iu := gathered(t, invalid.reg, "hastate_agent_withheld_total", "invalid_key"), gathered(t, invalid.reg, "hastate_agent_withheld_total", "unconfirmed")
		n, nu := gathered(t, none.reg, "hastate_agent_withheld_total", "invalid_key"), gathered(t, none.reg, "hastate_agent_withheld_total", "unconfirmed")
		return testenv.Expect(i == 1 && iu == 0 && n == 0 && nu == 2,
			"withheld by reason: invalid key %v/%v (invalid_key/unconfirmed), no snapshot %v/%v; want 1/0 and 0/2", i, iu, n, nu)
	})
}

func TestAgentNoLFQuietPeriod(t *testing.T) {
	const quiet = 150 * time.Millisecond
	f := startAgent(t, AgentOptions{QuietPeriod: quiet, ReadTimeout: 5 * time.Second})
	c := dial(t, f.addr)
	start := time.Now()
	if _, err := c.Write([]byte("web/a")); err != nil {
		t.Fatal(err)
	}
	got := readAll(t, c)
	took := time.Since(start)
	if got != "drain\n" {
		t.Fatalf("answer %q, want %q", got, "drain\n")
	}
	if took < quiet || took > 2*time.Second {
		t.Errorf("answer after %v, want about the quiet period %v", took, quiet)
	}
}

func TestAgentNoLFInPieces(t *testing.T) {
	// Pieces closer together than the quiet period make one request.
	f := startAgent(t, AgentOptions{QuietPeriod: 300 * time.Millisecond, ReadTimeout: 5 * time.Second})
	c := dial(t, f.addr)
	for _, piece := range []string{"we", "b/", "a"} {
		if _, err := c.Write([]byte(piece)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond) // the behaviour under test: a gap shorter than the quiet period
	}
	if got := readAll(t, c); got != "drain\n" {
		t.Fatalf("answer %q, want %q", got, "drain\n")
	}
}

func TestAgentMalformed(t *testing.T) {
	f := startAgent(t, AgentOptions{QuietPeriod: 50 * time.Millisecond})
	tests := []struct {
		name, req string
	}{
		{"257 bytes with LF", strings.Repeat("b", 100) + "/" + strings.Repeat("s", 155) + "\n"},
		{"300 bytes without LF", strings.Repeat("b", 100) + "/" + strings.Repeat("s", 199)},
		{"no slash", "webserver\n"},
		{"empty line", "\n"},
		{"empty CRLF line", "\r\n"},
		{"no backend", "/a\n"},
		{"no server", "web/\n"},
		{"no slash without LF", "webserver"},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := probe(t, f.addr, tc.req); got != "" {
				t.Errorf("answer %q to %q, want none", got, tc.req)
			}
			testenv.Eventually(t, 5*time.Second, func() error {
				return testenv.Expect(f.checks(t, "malformed") == float64(i+1), "malformed = %v, want %d", f.checks(t, "malformed"), i+1)
			})
		})
	}
	if got := f.checks(t, "answered"); got != 0 {
		t.Errorf("answered = %v, want 0", got)
	}
}

func TestAgentConnectAndClose(t *testing.T) {
	f := startAgent(t, AgentOptions{})
	c := dial(t, f.addr)
	c.Close()
	testenv.Eventually(t, 5*time.Second, func() error {
		return testenv.Expect(f.checks(t, "malformed") == 1, "empty connection not counted as malformed")
	})
}

func TestAgentReadTimeout(t *testing.T) {
	tests := []struct {
		name string
		talk func(c net.Conn, stop <-chan struct{})
	}{
		{"silent", func(net.Conn, <-chan struct{}) {}},
		{"trickle faster than the quiet period", func(c net.Conn, stop <-chan struct{}) {
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
					if _, err := c.Write([]byte("w")); err != nil {
						return
					}
				}
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			const timeout = 300 * time.Millisecond
			f := startAgent(t, AgentOptions{ReadTimeout: timeout, QuietPeriod: 100 * time.Millisecond})
			// Before the dial: the server's read timeout runs from its
			// accept, which may come before dial returns.
			start := time.Now()
			c := dial(t, f.addr)
			stop := make(chan struct{})
			var wg sync.WaitGroup
			wg.Go(func() { tc.talk(c, stop) })
			got := readAll(t, c)
			took := time.Since(start)
			close(stop)
			wg.Wait()
			if got != "" {
				t.Errorf("answer %q, want none", got)
			}
			if took < timeout || took > 3*time.Second {
				t.Errorf("closed after %v, want about the read timeout %v", took, timeout)
			}
			testenv.Eventually(t, 5*time.Second, func() error { return testenv.Expect(f.checks(t, "timeout") == 1, "timeout not counted") })
			if got := f.checks(t, "malformed"); got != 0 {
				t.Errorf("malformed = %v, want 0", got)
			}
		})
	}
}

func TestAgentMetrics(t *testing.T) {
	f := startAgent(t, AgentOptions{MaxConns: 1, ReadTimeout: 10 * time.Second})
	// The client sees the close a moment before the server frees the slot.
	for _, req := range []string{"web/a\n", "web/a\n", "web/a\n", "web/bad\n", "nonsense\n"} {
		probe(t, f.addr, req)
		testenv.Eventually(t, 5*time.Second, func() error {
			return testenv.Expect(f.s.ActiveConns() == 0, "connection for %q still active", req)
		})
	}

	// Hold the only slot, then get rejected.
	idle := dial(t, f.addr)
	testenv.Eventually(t, 5*time.Second, func() error { return testenv.Expect(f.s.ActiveConns() == 1, "idle connection not active") })
	if got := gathered(t, f.reg, "hastate_agent_connections_active", ""); got != 1 {
		t.Errorf("hastate_agent_connections_active = %v, want 1", got)
	}
	rejected := dial(t, f.addr)
	rejected.Write([]byte("web/a\n")) // may fail: the server may have closed already
	if got := readAll(t, rejected); got != "" {
		t.Errorf("over MaxConns: answer %q, want none", got)
	}
	idle.Close()

	want := map[string]float64{"answered": 3, "withheld": 1, "malformed": 2, "timeout": 0, "rejected": 1}
	testenv.Eventually(t, 5*time.Second, func() error {
		for result, n := range want {
			if got := f.checks(t, result); got != n {
				return fmt.Errorf("checks{result=%q} = %v, want %v", result, got, n)
			}
		}
		return testenv.Expect(f.s.ActiveConns() == 0, "ActiveConns = %d, want 0", f.s.ActiveConns())
	})
	for result, n := range want {
		if got := testutil.ToFloat64(f.s.m.counter(result)); got != n {
			t.Errorf("checks{result=%q} = %v, want %v", result, got, n)
		}
	}
	if got := gathered(t, f.reg, "hastate_agent_check_duration_seconds", ""); got != 3 {
		t.Errorf("duration observations = %v, want 3 (answered probes)", got)
	}
	if got := gathered(t, f.reg, "hastate_agent_connections_active", ""); got != 0 {
		t.Errorf("hastate_agent_connections_active = %v, want 0", got)
	}
	if n, err := testutil.GatherAndCount(f.reg, "hastate_agent_checks_total"); err != nil || n != 5 {
		t.Errorf("checks_total series = %d (%v), want all 5 results exported from the start", n, err)
	}
}

func TestAgentSnapshotSwap(t *testing.T) {
	var h snapshotHolder
	f := startAgent(t, AgentOptions{Source: &h})
	if got := probe(t, f.addr, "web/a\n"); got != "" {
		t.Fatalf("before any snapshot: %q, want none", got)
	}
	h.p.Store(buildSnapshot(t, map[string]string{"state/web/a": "drain"}))
	if got := probe(t, f.addr, "web/a\n"); got != "drain\n" {
		t.Fatalf("after first snapshot: %q, want drain", got)
	}
	h.p.Store(buildSnapshot(t, map[string]string{"state/web/a": "10%"}))
	if got := probe(t, f.addr, "web/a\n"); got != "ready 10%\n" {
		t.Fatalf("after swap: %q, want ready 10%%", got)
	}
}

func TestAgentMaxConns(t *testing.T) {
	f := startAgent(t, AgentOptions{MaxConns: 2, ReadTimeout: 10 * time.Second})
	idle1 := dial(t, f.addr)
	dial(t, f.addr) // idle too, closed at the end of the test
	testenv.Eventually(t, 5*time.Second, func() error {
		return testenv.Expect(f.s.ActiveConns() == 2, "ActiveConns = %d, want 2", f.s.ActiveConns())
	})

	c := dial(t, f.addr)
	start := time.Now()
	c.Write([]byte("web/a\n")) // may fail: the server may have closed already
	if got := readAll(t, c); got != "" {
		t.Fatalf("third connection answered %q, want closed unanswered", got)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("rejection took %v, want at once", took)
	}
	testenv.Eventually(t, 5*time.Second, func() error { return testenv.Expect(f.checks(t, "rejected") == 1, "rejection not counted") })

	idle1.Close()
	testenv.Eventually(t, 5*time.Second, func() error { return testenv.Expect(f.s.ActiveConns() == 1, "slot not released") })
	if got := probe(t, f.addr, "web/a\n"); got != "drain\n" {
		t.Fatalf("after a slot freed: %q, want drain", got)
	}
}

func TestAgentShutdownWaitsForInFlight(t *testing.T) {
	f := startAgent(t, AgentOptions{ReadTimeout: 10 * time.Second})
	inflight := dial(t, f.addr)
	testenv.Eventually(t, 5*time.Second, func() error { return testenv.Expect(f.s.ActiveConns() == 1, "connection not active") })

	shutdownDone := make(chan error, 1)
	go func() { shutdownDone <- f.s.Shutdown(context.Background()) }()

	select {
	case err := <-f.serveDone:
		if !errors.Is(err, ErrServerClosed) {
			t.Fatalf("Serve returned %v, want ErrServerClosed", err)
		}
		f.serveDone <- err // for the cleanup
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after Shutdown")
	}
	if _, err := net.DialTimeout("tcp", f.addr, time.Second); err == nil {
		t.Error("new connection accepted after Shutdown")
	}
	select {
	case err := <-shutdownDone:
		t.Fatalf("Shutdown returned %v with a connection in flight", err)
	default:
	}

	if _, err := inflight.Write([]byte("web/a\n")); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, inflight); got != "drain\n" {
		t.Fatalf("in-flight probe got %q, want drain", got)
	}
	select {
	case err := <-shutdownDone:
		if err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Shutdown did not return after the last connection finished")
	}
	if n := f.s.ActiveConns(); n != 0 {
		t.Errorf("ActiveConns = %d after Shutdown", n)
	}
	if err := f.s.Shutdown(context.Background()); err != nil {
		t.Errorf("second Shutdown: %v", err)
	}
}

func TestAgentShutdownForceCloses(t *testing.T) {
	f := startAgent(t, AgentOptions{ReadTimeout: 30 * time.Second})
	idle := dial(t, f.addr)
	testenv.Eventually(t, 5*time.Second, func() error { return testenv.Expect(f.s.ActiveConns() == 1, "connection not active") })

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := f.s.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown = %v, want context.DeadlineExceeded", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("Shutdown took %v", took)
	}
	if got := readAll(t, idle); got != "" {
		t.Errorf("force-closed connection got %q", got)
	}
	if n := f.s.ActiveConns(); n != 0 {
		t.Errorf("ActiveConns = %d after Shutdown returned", n)
	}
	for _, r := range []string{"timeout", "malformed"} {
		if got := f.checks(t, r); got != 0 {
			t.Errorf("force-closed connection counted as %s", r)
		}
	}
}

func TestAgentCloseIdempotent(t *testing.T) {
	f := startAgent(t, AgentOptions{})
	idle := dial(t, f.addr)
	testenv.Eventually(t, 5*time.Second, func() error { return testenv.Expect(f.s.ActiveConns() == 1, "connection not active") })
	if err := f.s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if n := f.s.ActiveConns(); n != 0 {
		t.Errorf("ActiveConns = %d after Close", n)
	}
	if got := readAll(t, idle); got != "" {
		t.Errorf("closed connection got %q", got)
	}
	if err := f.s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := f.s.Shutdown(context.Background()); err != nil {
		t.Errorf("Shutdown after Close: %v", err)
	}

	// Serve on a closed server returns at once and closes the listener.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := f.s.Serve(ln); !errors.Is(err, ErrServerClosed) {
		t.Errorf("Serve after Close = %v, want ErrServerClosed", err)
	}
	if _, err := ln.Accept(); err == nil {
		t.Error("listener still open after Serve returned")
	}
}

// fakeListener is a net.Listener driven by function fields.
type fakeListener struct {
	accept func() (net.Conn, error)
	close  func() error
}

var _ net.Listener = (*fakeListener)(nil)

func (l *fakeListener) Accept() (net.Conn, error) { return l.accept() }
func (l *fakeListener) Close() error              { return l.close() }
func (l *fakeListener) Addr() net.Addr            { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

type temporaryError struct{}

func (temporaryError) Error() string   { return "accept: too many open files" }
func (temporaryError) Temporary() bool { return true }
func (temporaryError) Timeout() bool   { return false }

func TestAgentServeAcceptErrors(t *testing.T) {
	t.Run("temporary errors are retried", func(t *testing.T) {
		s := newTestServer(t, AgentOptions{Source: staticSource(t, testKV)})
		closed := make(chan struct{})
		var closeOnce sync.Once
		var calls atomic.Int32
		ln := &fakeListener{
			accept: func() (net.Conn, error) {
				if calls.Add(1) <= 3 {
					return nil, &net.OpError{Op: "accept", Net: "tcp", Err: temporaryError{}}
				}
				<-closed
				return nil, net.ErrClosed
			},
			close: func() error { closeOnce.Do(func() { close(closed) }); return nil },
		}
		done := make(chan error, 1)
		go func() { done <- s.Serve(ln) }()
		testenv.Eventually(t, 5*time.Second, func() error {
			return testenv.Expect(calls.Load() >= 4, "Serve stopped accepting after temporary errors")
		})
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if err := <-done; !errors.Is(err, ErrServerClosed) {
			t.Fatalf("Serve = %v, want ErrServerClosed", err)
		}
	})
	t.Run("close during backoff", func(t *testing.T) {
		s := newTestServer(t, AgentOptions{Source: staticSource(t, testKV)})
		var calls atomic.Int32
		ln := &fakeListener{
			accept: func() (net.Conn, error) { calls.Add(1); return nil, temporaryError{} },
			close:  func() error { return nil },
		}
		done := make(chan error, 1)
		go func() { done <- s.Serve(ln) }()
		testenv.Eventually(t, 5*time.Second, func() error { return testenv.Expect(calls.Load() >= 1, "Serve did not accept") })
		s.Close()
		select {
		case err := <-done:
			if !errors.Is(err, ErrServerClosed) {
				t.Fatalf("Serve = %v, want ErrServerClosed", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Serve kept backing off after Close")
		}
	})
	t.Run("other errors are returned", func(t *testing.T) {
		s := newTestServer(t, AgentOptions{Source: staticSource(t, testKV)})
		boom := errors.New("boom")
		ln := &fakeListener{
			accept: func() (net.Conn, error) { return nil, boom },
			close:  func() error { return nil },
		}
		if err := s.Serve(ln); !errors.Is(err, boom) {
			t.Fatalf("Serve = %v, want it to wrap %v", err, boom)
		}
	})
}

func TestNewAgentServerValidates(t *testing.T) {
	src := staticSource(t, testKV)
	tests := []struct {
		name string
		o    AgentOptions
		want string // in the error; "" means valid
	}{
		{"defaults", AgentOptions{Source: src}, ""},
		{"no source", AgentOptions{}, "Source"},
		{"negative read timeout", AgentOptions{Source: src, ReadTimeout: -1}, "ReadTimeout"},
		{"negative quiet period", AgentOptions{Source: src, QuietPeriod: -1}, "QuietPeriod"},
		{"negative write timeout", AgentOptions{Source: src, WriteTimeout: -1}, "WriteTimeout"},
		{"quiet period not below read timeout", AgentOptions{Source: src, ReadTimeout: time.Second, QuietPeriod: time.Second}, "shorter than ReadTimeout"},
		{"quiet default above short read timeout", AgentOptions{Source: src, ReadTimeout: 10 * time.Millisecond}, "QuietPeriod"},
		{"negative max conns", AgentOptions{Source: src, MaxConns: -1}, "MaxConns"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := NewAgentServer(tc.o)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("NewAgentServer: %v", err)
				}
				if s.readTimeout != DefaultAgentReadTimeout || s.quietPeriod != DefaultAgentQuietPeriod ||
					s.writeTimeout != DefaultAgentWriteTimeout || cap(s.free) != DefaultAgentMaxConns {
					t.Error("defaults not applied")
				}
				return
			}
			if !errors.Is(err, ErrInvalidOptions) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("NewAgentServer = %v, want ErrInvalidOptions naming %q", err, tc.want)
			}
		})
	}
}

func TestAgentTwoServersOneRegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	src := staticSource(t, testKV)
	if _, err := NewAgentServer(AgentOptions{Source: src, Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	func() { // one registry per server: a second is a programming error
		defer func() {
			if recover() == nil {
				t.Fatal("second server on the same registry: no panic")
			}
		}()
		_, _ = NewAgentServer(AgentOptions{Source: src, Registerer: reg})
	}()
	// Each replica with its own registry works.
	if _, err := NewAgentServer(AgentOptions{Source: src, Registerer: prometheus.NewRegistry()}); err != nil {
		t.Fatal(err)
	}
}

func TestAgentLogsRateLimited(t *testing.T) {
	core, logs := observer.New(zapcore.WarnLevel)
	f := startAgent(t, AgentOptions{Logger: zap.New(core)})
	const bad = 40
	for range bad {
		probe(t, f.addr, "garbage\n")
	}
	testenv.Eventually(t, 5*time.Second, func() error { return testenv.Expect(f.checks(t, "malformed") == bad, "malformed not counted") })
	if err := f.s.Close(); err != nil {
		t.Fatal(err)
	}
	var lines, reported int64
	for _, e := range logs.All() {
		if e.ContextMap()["kind"] != "malformed" {
			continue
		}
		lines++
		reported += e.ContextMap()["suppressed"].(int64)
		if !strings.Contains(e.Message, "at stop") { // the line at Close only reports what was still suppressed
			reported++
		}
	}
	if lines > 4 {
		t.Errorf("%d log lines for %d bad probes, want a few", lines, bad)
	}
	if reported != bad {
		t.Errorf("log lines account for %d bad probes, want %d", reported, bad)
	}
}

// TestAgentIdleAndGarbageDoNotSlowChecks: idle connections and clients
// sending garbage do not delay normal probes. The garbage comes from a
// child process, as it would from other hosts: in this process its tight
// write loops would compete with the server for the Go scheduler and
// measure the test harness instead of the server.
func TestAgentIdleAndGarbageDoNotSlowChecks(t *testing.T) {
	f := startAgent(t, AgentOptions{ReadTimeout: 30 * time.Second})

	const idle = 500
	for range idle {
		dial(t, f.addr)
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		return testenv.Expect(f.s.ActiveConns() >= idle, "ActiveConns = %d, want %d", f.s.ActiveConns(), idle)
	})

	startGarbageWriters(t, f.addr)
	testenv.Eventually(t, 10*time.Second, func() error { return testenv.Expect(f.checks(t, "malformed") > 100, "garbage writers not running") })

	var worst time.Duration
	for range 200 {
		start := time.Now()
		if got := probe(t, f.addr, "web/a\n"); got != "drain\n" {
			t.Fatalf("answer %q under load, want drain", got)
		}
		worst = max(worst, time.Since(start))
	}
	t.Logf("worst probe latency with %d idle connections and %d garbage writers: %v (%v garbage connections)",
		idle, garbageWriters, worst, f.checks(t, "malformed"))
	if worst >= 500*time.Millisecond {
		t.Errorf("worst probe latency %v, want < 500ms", worst)
	}
}

const (
	garbageEnv     = "HASTATE_TEST_GARBAGE_ADDR"
	garbageWriters = 20
)

// startGarbageWriters runs garbageWriters clients writing garbage to addr in
// a child process (this test binary) until the test ends.
func startGarbageWriters(t *testing.T, addr string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), garbageEnv+"="+addr)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start garbage writers: %v", err)
	}
	t.Cleanup(func() {
		stdin.Close() // the child stops at EOF on stdin
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("garbage writers: %v", err)
			}
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
			t.Error("garbage writers did not stop")
		}
	})
}

// runGarbageWriters is the child process: garbageWriters clients connect to
// addr and write random bytes until the server hangs up, again and again,
// until stdin is closed.
func runGarbageWriters(addr string) {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range garbageWriters {
		wg.Go(func() { garbageWriter(addr, uint64(i), stop) })
	}
	io.Copy(io.Discard, os.Stdin)
	close(stop)
	wg.Wait()
}

// garbageWriter connects and writes random bytes without LF until the
// server hangs up, again and again, until stop is closed.
func garbageWriter(addr string, seed uint64, stop <-chan struct{}) {
	rnd := rand.New(rand.NewPCG(seed, 42))
	junk := make([]byte, 1024)
	for i := range junk {
		junk[i] = byte(rnd.IntN(256))
	}
	junk = bytes.ReplaceAll(junk, []byte{'\n'}, []byte{'/'})
	for {
		select {
		case <-stop:
			return
		default:
		}
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			continue
		}
		for {
			c.SetWriteDeadline(time.Now().Add(time.Second))
			if _, err := c.Write(junk); err != nil {
				break
			}
			select {
			case <-stop:
				c.Close()
				return
			default:
			}
		}
		c.Close()
	}
}

// TestListenAgentTurnsKeepaliveOff: the agent listener's connections carry
// no TCP keepalive (a check is one line each way; turning it on cost four
// setsockopt calls per check), where net.Listen's turn it on.
func TestListenAgentTurnsKeepaliveOff(t *testing.T) {
	plain, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	agent, err := ListenAgent(context.Background(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer agent.Close()
	for _, tc := range []struct {
		name string
		ln   net.Listener
		want int
	}{{"net.Listen", plain, 1}, {"ListenAgent", agent, 0}} {
		c, err := net.Dial("tcp", tc.ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		s, err := tc.ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		if got := keepaliveOf(t, s); got != tc.want {
			t.Errorf("%s: an accepted connection's SO_KEEPALIVE is %d, want %d", tc.name, got, tc.want)
		}
		c.Close()
		s.Close()
	}
}

// keepaliveOf is c's SO_KEEPALIVE option.
func keepaliveOf(t *testing.T, c net.Conn) int {
	t.Helper()
	raw, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var v int
	var serr error
	if err := raw.Control(func(fd uintptr) { v, serr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_KEEPALIVE) }); err != nil {
		t.Fatal(err)
	}
	if serr != nil {
		t.Fatal(serr)
	}
	return v
}
