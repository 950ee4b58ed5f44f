package test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hastate/hastate/server"
	"github.com/hastate/hastate/state"
)

// The agent-check benchmarks compare hastate's agent server with a minimal
// responder (accept, goroutine per connection, bufio line read, map lookup,
// answer, close) under the same load: benchWorkers concurrent clients, each
// doing connect, write "backend/server\n", read one line, close, against
// 127.0.0.1. The target is a throughput ratio (hastate/baseline) of at least
// 0.8 and a p99 latency ratio of at most 2; BenchmarkAgentCheckRatio reports
// both, it does not assert them.
//
//	go test -run '^$' -bench AgentCheck ./test/
//
// (BenchmarkAgentCheckRatio makes ratioRounds x ratioChecks checks per
// server and iteration, so one iteration is enough: -benchtime 1x is fine for
// it, but gives BenchmarkAgentCheck a single check.)

const (
	benchWorkers = 32
	benchKeys    = 1000 // state keys in the served snapshot (100 backends x 10 servers)
	ratioRounds  = 3
	ratioChecks  = 20000
)

// benchKV returns the KV content both servers serve, the requests the
// clients send and, per request, the expected answer.
func benchKV() (kv map[string]string, reqs [][]byte, answers [][]byte) {
	values := []struct{ value, answer string }{
		{"drain", "drain\n"},
		{"maint", "maint\n"},
		{"50%", "ready 50%\n"},
		{"ready", "ready 100%\n"},
	}
	kv = make(map[string]string, benchKeys)
	for i := range benchKeys {
		name := fmt.Sprintf("be%d/srv%d", i/10, i%10)
		v := values[i%len(values)]
		kv[state.StatePrefix+name] = v.value
		reqs = append(reqs, []byte(name+"\n"))
		answers = append(answers, []byte(v.answer))
	}
	return kv, reqs, answers
}

// loadResult is the outcome of one load run.
type loadResult struct {
	checks     int
	elapsed    time.Duration
	lat        []time.Duration // sorted
	unanswered int             // empty replies (runAgentLoadOf with tolerateEmpty)
}

func (r loadResult) rate() float64 { return float64(r.checks) / r.elapsed.Seconds() }

func (r loadResult) quantile(q float64) time.Duration {
	if len(r.lat) == 0 {
		return 0
	}
	return r.lat[min(len(r.lat)-1, int(q*float64(len(r.lat))))]
}

func (r loadResult) report(b *testing.B, prefix string) {
	b.ReportMetric(r.rate(), prefix+"checks/s")
	b.ReportMetric(float64(r.quantile(0.50))/float64(time.Microsecond), prefix+"p50_us")
	b.ReportMetric(float64(r.quantile(0.99))/float64(time.Microsecond), prefix+"p99_us")
}

// merge combines runs of the same server.
func merge(rs ...loadResult) loadResult {
	var m loadResult
	for _, r := range rs {
		m.checks += r.checks
		m.elapsed += r.elapsed
		m.lat = append(m.lat, r.lat...)
		m.unanswered += r.unanswered
	}
	slices.Sort(m.lat)
	return m
}

// runAgentLoad makes n checks against addr with benchWorkers concurrent
// clients and checks every answer.
func runAgentLoad(tb testing.TB, addr string, n int, reqs, answers [][]byte) loadResult {
	tb.Helper()
	return runAgentLoadOf(tb, addr, n, reqs, answers, false)
}

// runAgentLoadOf is runAgentLoad; with tolerateEmpty an empty reply (a
// replica that cannot confirm, during an election) is counted, not fatal.
func runAgentLoadOf(tb testing.TB, addr string, n int, reqs, answers [][]byte, tolerateEmpty bool) loadResult {
	tb.Helper()
	return runAgentLoadWith(tb, addr, benchWorkers, n, reqs, answers, tolerateEmpty)
}

// runAgentLoadWith is runAgentLoadOf with workers concurrent clients.
func runAgentLoadWith(tb testing.TB, addr string, workers, n int, reqs, answers [][]byte, tolerateEmpty bool) loadResult {
	tb.Helper()
	return runAgentLoadTicking(tb, addr, workers, n, reqs, answers, tolerateEmpty, 0, nil)
}

// runAgentLoadTicking is runAgentLoadWith that, every every checks (as
// each one every-th begins), also offers tick a value without waiting
// (nil: none); BenchmarkConfirmCPU's floor asks for a round trip per
// batch of checks that way, as a follower's round begins per batch.
func runAgentLoadTicking(tb testing.TB, addr string, workers, n int, reqs, answers [][]byte, tolerateEmpty bool, every int, tick chan<- struct{}) loadResult {
	tb.Helper()
	var (
		empty    atomic.Int64
		next     atomic.Int64
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	lats := make([][]time.Duration, workers)
	start := time.Now()
	for w := range workers {
		wg.Go(func() {
			var buf [64]byte
			lat := make([]time.Duration, 0, n/workers+1)
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					break
				}
				if tick != nil && i%every == 0 {
					select {
					case tick <- struct{}{}:
					default:
					}
				}
				req, want := reqs[i%len(reqs)], answers[i%len(reqs)]
				t0 := time.Now()
				line, err := agentCheck(addr, req, buf[:])
				if err != nil && tolerateEmpty && len(line) == 0 && errors.Is(err, io.EOF) {
					empty.Add(1)
					continue
				}
				if err == nil && !bytes.Equal(line, want) {
					err = fmt.Errorf("answer to %q: %q, want %q", req, line, want)
				}
				if err != nil {
					errOnce.Do(func() { firstErr = err })
					break
				}
				lat = append(lat, time.Since(t0))
			}
			lats[w] = lat
		})
	}
	wg.Wait()
	r := loadResult{elapsed: time.Since(start), unanswered: int(empty.Load())}
	if firstErr != nil {
		tb.Fatalf("agent check against %s: %v", addr, firstErr)
	}
	for _, l := range lats {
		r.lat = append(r.lat, l...)
	}
	r.checks = len(r.lat)
	slices.Sort(r.lat)
	return r
}

// agentCheck is one probe as HAProxy makes it: connect, send, read one
// line, close. The line is returned in buf.
func agentCheck(addr string, req, buf []byte) ([]byte, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(5 * time.Second)); err != nil {
		return nil, err
	}
	if _, err := c.Write(req); err != nil {
		return nil, err
	}
	n := 0
	for n < len(buf) {
		m, err := c.Read(buf[n:])
		n += m
		if i := bytes.IndexByte(buf[:n], '\n'); i >= 0 {
			return buf[:i+1], nil
		}
		if err != nil {
			return buf[:n], fmt.Errorf("read %q: %w", buf[:n], err)
		}
	}
	return buf[:n], errors.New("answer longer than the buffer")
}

// startBaselineResponder serves kv as a minimal agent responder would.
func startBaselineResponder(tb testing.TB, kv map[string]string) string {
	tb.Helper()
	answers, err := bareAnswers(kv)
	if err != nil {
		tb.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() { serveBare(ln, answers, &wg) })
	tb.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	return ln.Addr().String()
}

// bareAnswers are the minimal responder's answers to kv's servers.
func bareAnswers(kv map[string]string) (map[string]string, error) {
	answers := make(map[string]string, len(kv))
	for k, v := range kv {
		a, err := state.ParseValue(v)
		if err != nil {
			return nil, err
		}
		answers[strings.TrimPrefix(k, state.StatePrefix)] = state.ValueAnswer(a).String() + "\n"
	}
	return answers, nil
}

// serveBare answers agent checks on ln as a minimal responder does (one
// line in, the answer out, close), until ln is closed.
func serveBare(ln net.Listener, answers map[string]string, wg *sync.WaitGroup) {
	serveEach(ln, wg, func(c net.Conn) {
		defer c.Close()
		c.SetDeadline(time.Now().Add(2 * time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			return
		}
		a, ok := answers[strings.TrimRight(line, "\r\n")]
		if !ok {
			a = "ready 100%\n"
		}
		c.Write([]byte(a))
	})
}

// serveEach serves each connection ln accepts with serve, on a goroutine
// of wg, until ln is closed.
func serveEach(ln net.Listener, wg *sync.WaitGroup, serve func(net.Conn)) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		wg.Go(func() { serve(c) })
	}
}

// bareProcessEnv names the file of the kv a test binary started by
// startBaselineProcess serves as the bare responder (instead of running
// tests).
const bareProcessEnv = "HASTATE_BENCH_BARE_KV"

// echoProcessEnv, set to 1, makes a test binary started by
// startHelperProcess the echo process (echoProcessMain).
const echoProcessEnv = "HASTATE_BENCH_ECHO"

// echoProcessMain answers every request line, on connections kept open,
// with one fixed line of a read-index answer's size, and nothing else:
// the least a process woken for one round trip does (BenchmarkConfirmCPU
// measures a leader's answers to a follower's rounds against it). It
// prints its address and runs until its stdin closes.
func echoProcessMain() int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, "echo process:", err)
		return 1
	}
	var wg sync.WaitGroup
	answer := []byte(`{"id":"n1","index":1234567}` + "\n")
	wg.Go(func() {
		serveEach(ln, &wg, func(c net.Conn) {
			defer c.Close()
			r := bufio.NewReaderSize(c, 512)
			for {
				if _, err := r.ReadSlice('\n'); err != nil {
					return
				}
				if _, err := c.Write(answer); err != nil {
					return
				}
			}
		})
	})
	fmt.Println(ln.Addr().String())
	_, _ = io.Copy(io.Discard, os.Stdin)
	ln.Close()
	wg.Wait()
	return 0
}

// startBaselineProcess is startBaselineResponder in a process of its own
// (this test binary again, bareProcessMain), as each hastate replica is:
// beside replicas, an in-process responder would share the load
// generator's Go runtime and measure the placement as much as the server.
// It stops when the test ends (its stdin closes). pid is its process ID.
func startBaselineProcess(tb testing.TB, kv map[string]string) (addr string, pid int) {
	tb.Helper()
	f := filepath.Join(tb.TempDir(), "kv.json")
	data, err := json.Marshal(kv)
	if err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(f, data, 0o644); err != nil {
		tb.Fatal(err)
	}
	return startHelperProcess(tb, "bare responder", bareProcessEnv+"="+f)
}

// startHelperProcess runs this test binary again with env set (TestMain
// then runs the helper it names instead of tests), reads the address it
// prints, and stops it when the test ends (its stdin closes).
func startHelperProcess(tb testing.TB, what, env string) (addr string, pid int) {
	tb.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		stdin.Close()
		if err := cmd.Wait(); err != nil {
			tb.Errorf("%s process: %v", what, err)
		}
	})
	addr, err = bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		tb.Fatalf("%s process: no address: %v", what, err)
	}
	return strings.TrimSpace(addr), cmd.Process.Pid
}

// bareProcessMain is the bare responder process: it serves the kv of
// file, prints its address and runs until its stdin closes.
func bareProcessMain(file string) int {
	data, err := os.ReadFile(file)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bare responder:", err)
		return 1
	}
	var kv map[string]string
	if err := json.Unmarshal(data, &kv); err != nil {
		fmt.Fprintln(os.Stderr, "bare responder:", err)
		return 1
	}
	answers, err := bareAnswers(kv)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bare responder:", err)
		return 1
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, "bare responder:", err)
		return 1
	}
	var wg sync.WaitGroup
	wg.Go(func() { serveBare(ln, answers, &wg) })
	fmt.Println(ln.Addr().String())
	_, _ = io.Copy(io.Discard, os.Stdin)
	ln.Close()
	wg.Wait()
	return 0
}

// startHastateAgent serves kv with server.AgentServer.
func startHastateAgent(tb testing.TB, kv map[string]string) string {
	tb.Helper()
	m := state.NewMirror()
	m.Apply(state.Change{Set: kv})
	snap := m.Snapshot()
	return startAgentServer(tb, server.AgentOptions{Source: server.SnapshotFunc(func() *state.Snapshot { return snap })})
}

// startAgentServer serves an agent server of o on loopback until the
// test ends.
func startAgentServer(tb testing.TB, o server.AgentOptions) string {
	tb.Helper()
	s, err := server.NewAgentServer(o)
	if err != nil {
		tb.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	tb.Cleanup(func() {
		s.Close()
		if err := <-done; !errors.Is(err, server.ErrServerClosed) {
			tb.Errorf("Serve: %v", err)
		}
	})
	return ln.Addr().String()
}

// agentResponders are the two servers under comparison.
var agentResponders = []struct {
	name  string
	start func(testing.TB, map[string]string) string
}{
	{"baseline", startBaselineResponder},
	{"hastate", startHastateAgent},
}

func BenchmarkAgentCheck(b *testing.B) {
	kv, reqs, answers := benchKV()
	for _, r := range agentResponders {
		b.Run(r.name, func(b *testing.B) {
			addr := r.start(b, kv)
			runAgentLoad(b, addr, 2*benchWorkers, reqs, answers) // warm up
			b.ResetTimer()
			res := runAgentLoad(b, addr, b.N, reqs, answers)
			b.StopTimer()
			res.report(b, "")
		})
	}
}

// BenchmarkAgentCheckRatio runs both servers in the same process and run,
// alternating ratioRounds rounds of ratioChecks checks each, and reports
// hastate's throughput and p99 latency relative to the baseline's.
func BenchmarkAgentCheckRatio(b *testing.B) {
	kv, reqs, answers := benchKV()
	baseAddr := startBaselineResponder(b, kv)
	hastateAddr := startHastateAgent(b, kv)
	runAgentLoad(b, baseAddr, 2*benchWorkers, reqs, answers)
	runAgentLoad(b, hastateAddr, 2*benchWorkers, reqs, answers)

	var base, hastate []loadResult
	b.ResetTimer()
	for range b.N {
		for range ratioRounds {
			base = append(base, runAgentLoad(b, baseAddr, ratioChecks, reqs, answers))
			hastate = append(hastate, runAgentLoad(b, hastateAddr, ratioChecks, reqs, answers))
		}
	}
	b.StopTimer()
	bm, hm := merge(base...), merge(hastate...)
	bm.report(b, "baseline_")
	hm.report(b, "hastate_")
	b.ReportMetric(hm.rate()/bm.rate(), "throughput_ratio")
	b.ReportMetric(float64(hm.quantile(0.99))/float64(bm.quantile(0.99)), "p99_ratio")
	for i := range base {
		b.Logf("round %d: baseline %.0f checks/s p99 %v; hastate %.0f checks/s p99 %v",
			i+1, base[i].rate(), base[i].quantile(0.99), hastate[i].rate(), hastate[i].quantile(0.99))
	}
}
