package test

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/internal/testenv"
)

// Bounds of the harness's waits. They are generous: a hastate built with
// -race on two busy cores starts in well under a second.
const (
	readyTimeout = 30 * time.Second // hastate start until /-/readiness is 200
	stopTimeout  = 20 * time.Second // SIGTERM until exit, before SIGKILL
	probeTimeout = 5 * time.Second  // one agent-check round trip
)

// HastateOptions choose how a hastate replica is started.
type HastateOptions struct {
	// ConsulAddr is the Consul HTTP address (host:port). Required.
	ConsulAddr string
	// KVPrefix is passed as --kv-prefix when set.
	KVPrefix string
	// NodeID is --node-id; "" means "n1".
	NodeID string
	// Args are extra `hastate serve` flags.
	Args []string
}

// Hastate is one `hastate serve` process run by a test, on its own ports on
// 127.0.0.1 with its data dir in t.TempDir(). Ports and data dir stay the
// same across Restart. Its log is printed when the test fails.
type Hastate struct {
	NodeID    string
	DataDir   string
	AgentAddr string // host:port of the agent-check listener
	HTTPAddr  string // host:port of the HTTP listener
	RaftAddr  string

	consulAddr, kvPrefix string // for Operator

	proc testenv.Process

	mu   sync.Mutex
	args []string
	// extra are flags appended after args (see Use).
	extra []string
}

// StartHastate starts a one-replica hastate and waits until it is ready.
func StartHastate(t testing.TB, o HastateOptions) *Hastate {
	t.Helper()
	h := NewHastate(t, o)
	h.Start(t)
	h.WaitReady(t)
	return h
}

// NewHastate prepares a replica (ports, data dir, flags) without starting it.
func NewHastate(t testing.TB, o HastateOptions) *Hastate {
	t.Helper()
	if o.ConsulAddr == "" {
		t.Fatal("harness: HastateOptions.ConsulAddr is required")
	}
	logDir := t.TempDir()
	if o.NodeID == "" {
		o.NodeID = "n1"
	}
	h := &Hastate{
		NodeID:     o.NodeID,
		DataDir:    t.TempDir(),
		AgentAddr:  freeAddr(t),
		HTTPAddr:   freeAddr(t),
		RaftAddr:   freeAddr(t),
		consulAddr: o.ConsulAddr, kvPrefix: o.KVPrefix,
		proc: testenv.Process{Bin: hastateBin, Env: hermeticEnv(), LogPath: filepath.Join(logDir, "hastate.log")},
	}
	h.args = []string{"serve",
		"--node-id", h.NodeID,
		"--data-dir", h.DataDir,
		"--raft-addr", h.RaftAddr,
		"--raft-advertise", h.RaftAddr,
		"--agent-addr", h.AgentAddr,
		"--http-addr", h.HTTPAddr,
		"--consul-addr", o.ConsulAddr,
		"--log-format", "json",
		// Undrain ramps off unless a test turns them on through Args
		// (the last --ramp-duration wins): most tests check that a
		// cleared key is served at 100% at once.
		"--ramp-duration", "0",
	}
	if o.KVPrefix != "" {
		h.args = append(h.args, "--kv-prefix", o.KVPrefix)
	}
	h.args = append(h.args, o.Args...)
	t.Cleanup(func() {
		h.Kill()
		h.checkLog(t)
	})
	return h
}

// StartCluster starts n replicas n1..nn that bootstrap one raft cluster
// (--peers lists all of them) and waits until every one is ready.
func StartCluster(t testing.TB, n int, o HastateOptions) []*Hastate {
	t.Helper()
	hs := NewCluster(t, n, o)
	StartAll(t, hs...)
	return hs
}

// StartAll starts every replica, all at once as a StatefulSet with
// podManagementPolicy Parallel does, then waits until each is ready.
func StartAll(t testing.TB, hs ...*Hastate) {
	t.Helper()
	for _, h := range hs {
		h.Start(t)
	}
	for _, h := range hs {
		h.WaitReady(t)
	}
}

// NewCluster prepares n replicas n1..nn whose --peers lists all of them,
// without starting them: a test adds per-replica flags with AddArgs (e.g.
// --raft-dial through a proxy), then starts them.
func NewCluster(t testing.TB, n int, o HastateOptions) []*Hastate {
	t.Helper()
	hs := make([]*Hastate, n)
	var peers []string
	for i := range hs {
		o := o
		o.NodeID = fmt.Sprintf("n%d", i+1)
		hs[i] = NewHastate(t, o)
		peers = append(peers, hs[i].NodeID+"="+hs[i].RaftAddr)
	}
	for _, h := range hs {
		h.AddArgs("--peers", strings.Join(peers, ","))
	}
	return hs
}

// AddArgs appends `hastate serve` flags; they apply from the next Start.
// Of a flag given twice, the last one wins (e.g. --consul-addr).
func (h *Hastate) AddArgs(args ...string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.args = append(h.args, args...)
}

func freeAddr(t testing.TB) string {
	t.Helper()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(testenv.FreePort(t)))
}

// hermeticEnv is the test's environment without the variables hastate and
// the Consul client read, so the machine's settings cannot leak in. A
// binary built with -race would sleep 1s at exit; GORACE turns that off so
// that exit times and CLI round trips are the product's own.
func hermeticEnv(extra ...string) []string {
	env := slices.DeleteFunc(testenv.HermeticEnv(), func(kv string) bool { return strings.HasPrefix(kv, "GORACE=") })
	return append(append(env, "GORACE=atexit_sleep_ms=0"), extra...)
}

// Start starts the process; it does not wait for readiness.
func (h *Hastate) Start(t testing.TB) {
	t.Helper()
	h.mu.Lock()
	args := append(slices.Clone(h.args), h.extra...)
	h.mu.Unlock()
	h.proc.Start(t, args...)
}

// Use makes the next Start run bin ("": this build's) with extra flags
// after the others, on the same ports and data dir: a rolling upgrade to
// another release, or back. Call it while the replica is stopped.
func (h *Hastate) Use(bin string, extra ...string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.proc.Bin = cmp.Or(bin, hastateBin)
	h.extra = extra
}

// SetEnv sets the environment of the next Start (nil: the test's own,
// without hastate's and Consul's variables).
func (h *Hastate) SetEnv(env []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.proc.Env = env
}

// Pid returns the replica's process ID, 0 when it is not running.
func (h *Hastate) Pid() int { return h.proc.Pid() }

// Kill sends SIGKILL and waits for the process to exit. Killing a stopped
// replica does nothing.
func (h *Hastate) Kill() { h.proc.Kill() }

// Stop sends SIGTERM and waits for the process to exit; it returns the exit
// code and how long the exit took. A process that has not exited within
// stopTimeout is killed and the test fails.
func (h *Hastate) Stop(t testing.TB) (code int, took time.Duration) {
	t.Helper()
	return h.Wait(t, h.Signal(t, syscall.SIGTERM))
}

// Signal sends sig to the running process and returns when it sent it.
func (h *Hastate) Signal(t testing.TB, sig os.Signal) time.Time {
	t.Helper()
	return h.proc.Signal(t, sig)
}

// Wait waits for the process to exit after a signal sent at start, as
// Stop does, and returns the exit code and the time since start.
func (h *Hastate) Wait(t testing.TB, start time.Time) (code int, took time.Duration) {
	t.Helper()
	code = h.proc.Wait(t, stopTimeout)
	return code, time.Since(start)
}

// Restart stops the replica with SIGTERM (it must exit with code 0) if it
// runs, and starts it again with the same flags, ports and data dir. It
// does not wait for readiness.
func (h *Hastate) Restart(t testing.TB) {
	t.Helper()
	if h.proc.Running() {
		if code, took := h.Stop(t); code != 0 {
			t.Fatalf("hastate exited with code %d after SIGTERM (took %s)", code, took)
		}
	}
	h.Start(t)
}

// WaitReady polls /-/readiness until it answers 200.
func (h *Hastate) WaitReady(t testing.TB) {
	t.Helper()
	var last string
	testenv.Eventually(t, readyTimeout, func() error {
		if h.proc.Exited() {
			t.Fatalf("hastate exited before it was ready")
		}
		code, body, err := h.get("/-/readiness")
		if err != nil {
			last = err.Error()
			return fmt.Errorf("hastate /-/readiness never answered 200; last: %s", last)
		}
		last = fmt.Sprintf("HTTP %d %s", code, body)
		return testenv.Expect(code == http.StatusOK, "hastate /-/readiness never answered 200; last: %s", last)
	})
}

// Readiness returns the /-/readiness status code and decoded body.
func (h *Hastate) Readiness(t testing.TB) (int, Readiness) {
	t.Helper()
	code, body, err := h.get("/-/readiness")
	if err != nil {
		t.Fatalf("GET /-/readiness: %v", err)
	}
	var r Readiness
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatalf("GET /-/readiness: decode %q: %v", body, err)
	}
	return code, r
}

// Readiness is the /-/readiness body.
type Readiness = api.Readiness

// watch is the leader's watch status in a readiness body (zero on a
// follower or before the watch started).
func watch(rd Readiness) api.WatchStatus {
	if rd.KV.Watch == nil {
		return api.WatchStatus{}
	}
	return *rd.KV.Watch
}

// GetJSON fetches path from the HTTP API, fails unless it is 200, and
// decodes the body into v.
func (h *Hastate) GetJSON(t testing.TB, path string, v any) {
	t.Helper()
	code, body, err := h.get(path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	if code != http.StatusOK {
		t.Fatalf("GET %s: HTTP %d: %s", path, code, body)
	}
	if err := json.Unmarshal(body, v); err != nil {
		t.Fatalf("GET %s: decode %q: %v", path, body, err)
	}
}

var httpClient = &http.Client{Timeout: 5 * time.Second}

func (h *Hastate) get(path string) (int, []byte, error) { return h.getWith(httpClient, path) }

// getWith is get with another client (a shorter timeout).
func (h *Hastate) getWith(c *http.Client, path string) (int, []byte, error) {
	resp, err := c.Get("http://" + h.HTTPAddr + path)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// Metric returns the value of one sample of /-/metrics, e.g.
// `hastate_agent_checks_total{result="withheld"}`; 0 when absent.
func (h *Hastate) Metric(t testing.TB, sample string) float64 {
	t.Helper()
	code, body, err := h.get("/-/metrics")
	if err != nil || code != http.StatusOK {
		t.Fatalf("GET /-/metrics: HTTP %d: %v", code, err)
	}
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), " ")
		if ok && name == sample {
			f, err := strconv.ParseFloat(val, 64)
			if err != nil {
				t.Fatalf("metric %s: %q: %v", sample, val, err)
			}
			return f
		}
	}
	return 0
}

// Ask does one agent-check round trip as HAProxy does: send "b/s\n", read
// until the server closes. It returns the answer line without its LF, or ""
// when the connection was closed without an answer. An answer without LF
// fails the test: HAProxy only parses a line once it has its LF.
func (h *Hastate) Ask(t testing.TB, server string) string {
	t.Helper()
	p := h.Probe(t, []byte(server+"\n"), false)
	if p.Err != nil {
		t.Fatalf("agent probe %q: %v", server, p.Err)
	}
	return p.Line(t)
}

// ProbeResult is what one raw agent-check connection saw.
type ProbeResult struct {
	Answer []byte        // everything read before the close
	Closed bool          // the server closed the connection (EOF or reset)
	Took   time.Duration // from connect until the close
	Err    error         // anything else: a dial error or our read deadline
}

// Line returns the answer without its LF; "" when there was none.
func (p ProbeResult) Line(t testing.TB) string {
	t.Helper()
	if len(p.Answer) == 0 {
		return ""
	}
	if !bytes.HasSuffix(p.Answer, []byte("\n")) || bytes.Count(p.Answer, []byte("\n")) != 1 {
		t.Fatalf("agent answer %q is not one LF-terminated line", p.Answer)
	}
	return string(bytes.TrimSuffix(p.Answer, []byte("\n")))
}

// Probe connects to the agent port, writes payload (nothing when nil),
// half-closes the write side when closeWrite, and reads until the server
// closes the connection or probeTimeout passes.
func (h *Hastate) Probe(t testing.TB, payload []byte, closeWrite bool) ProbeResult {
	t.Helper()
	start := time.Now()
	c, err := net.DialTimeout("tcp", h.AgentAddr, probeTimeout)
	if err != nil {
		return ProbeResult{Err: err}
	}
	defer c.Close()
	_ = c.SetDeadline(start.Add(probeTimeout))
	if len(payload) > 0 {
		if _, err := c.Write(payload); err != nil {
			return ProbeResult{Err: fmt.Errorf("write: %w", err), Took: time.Since(start)}
		}
	}
	if closeWrite {
		_ = c.(*net.TCPConn).CloseWrite()
	}
	var res ProbeResult
	var buf bytes.Buffer
	_, err = io.Copy(&buf, c)
	res.Answer, res.Took = buf.Bytes(), time.Since(start)
	switch {
	case err == nil: // EOF
		res.Closed = true
	case errors.Is(err, syscall.ECONNRESET):
		res.Closed = true // closed with our bytes unread: a reset
	default:
		res.Err = err
	}
	return res
}

// Answers asks for every server and returns server -> answer line.
func (h *Hastate) Answers(t testing.TB, servers ...string) map[string]string {
	t.Helper()
	m := make(map[string]string, len(servers))
	for _, s := range servers {
		m[s] = h.Ask(t, s)
	}
	return m
}

// WaitAnswer waits until the agent answers want for server.
func (h *Hastate) WaitAnswer(t testing.TB, server, want string) {
	t.Helper()
	var got string
	testenv.Eventually(t, 10*time.Second, func() error {
		got = h.Ask(t, server)
		return testenv.Expect(got == want, "agent answer for %s: got %q, want %q", server, got, want)
	})
}

// LogContains reports whether the replica's log has a line containing s.
func (h *Hastate) LogContains(t testing.TB, s string) bool {
	t.Helper()
	b, err := os.ReadFile(h.proc.LogPath)
	if err != nil {
		t.Fatalf("read hastate log: %v", err)
	}
	return bytes.Contains(b, []byte(s))
}

// LogLine returns the last line of the replica's log containing s ("" if none).
func (h *Hastate) LogLine(t testing.TB, s string) string {
	t.Helper()
	b, err := os.ReadFile(h.proc.LogPath)
	if err != nil {
		t.Fatalf("read hastate log: %v", err)
	}
	var last string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, s) {
			last = l
		}
	}
	return last
}

// checkLog fails the test on a data race report and prints the log when
// the test failed.
func (h *Hastate) checkLog(t testing.TB) {
	b, err := os.ReadFile(h.proc.LogPath)
	if err != nil {
		t.Logf("harness: hastate log: %v", err)
		return
	}
	if bytes.Contains(b, []byte("WARNING: DATA RACE")) {
		t.Errorf("hastate reported a data race (log follows)")
	}
	if !t.Failed() {
		return
	}
	const max = 48 << 10
	if len(b) > max {
		b = b[len(b)-max:]
	}
	t.Logf("harness: hastate %s log %s (last %d bytes):\n%s", h.NodeID, h.proc.LogPath, len(b), b)
}

// Operator runs the operator commands (`hastate drain|maint|ready|weight|
// clear|status|wait|precheck|...`) as an SRE would: the same binary,
// CONSUL_HTTP_ADDR set, and HASTATE_ADDR pointed at the replica under test
// (Addr; required for every command that asks a replica). Nothing is added
// to a command: a write plans against that replica's fleet with every
// guard on, so a test whose writes name servers no HAProxy polls says so
// with WriteFlags (e.g. --allow-unknown), the narrowest override it needs.
// h.Operator() is the Operator of replica h.
type Operator struct {
	// Bin is the hastate binary ("": this build's).
	Bin        string
	ConsulAddr string
	// Addr is the HTTP address (host:port or URL) of the replica under
	// test: HASTATE_ADDR.
	Addr string
	Env  []string // extra KEY=VALUE, e.g. HASTATE_KV_PREFIX=...
	// WriteFlags are appended to every write command (drain, maint,
	// ready, weight, clear), e.g. --allow-unknown where no HAProxy polls
	// the servers a test writes. Empty: none.
	WriteFlags []string
}

// Operator returns the Operator of replica h: its Consul, its KV prefix,
// HASTATE_ADDR at its HTTP address, no flags added.
func (h *Hastate) Operator(writeFlags ...string) Operator {
	o := Operator{ConsulAddr: h.consulAddr, Addr: h.HTTPAddr, WriteFlags: writeFlags}
	if h.kvPrefix != "" {
		o.Env = []string{"HASTATE_KV_PREFIX=" + h.kvPrefix}
	}
	return o
}

// writeCommands are the operator commands that write to Consul.
var writeCommands = map[string]bool{"drain": true, "maint": true, "ready": true, "weight": true, "clear": true}

// replicaless are the commands that ask no replica.
var replicaless = map[string]bool{"probe": true, "version": true, "serve": true, "help": true, "--help": true, "--version": true}

// Run runs `hastate args...` and returns its combined output; a non-zero
// exit fails the test.
func (o Operator) Run(t testing.TB, args ...string) string {
	t.Helper()
	out, code := o.RunCode(t, args...)
	if code != 0 {
		t.Fatalf("hastate %s: exit code %d:\n%s", strings.Join(args, " "), code, out)
	}
	return out
}

// RunExit runs `hastate args...` and returns its combined output; an exit
// code other than want fails the test.
func (o Operator) RunExit(t testing.TB, want int, args ...string) string {
	t.Helper()
	out, code := o.RunCode(t, args...)
	if code != want {
		t.Fatalf("hastate %s: exit %d, want %d:\n%s", strings.Join(args, " "), code, want, out)
	}
	return out
}

// RunCode runs `hastate args...` and returns its combined output and exit code.
func (o Operator) RunCode(t testing.TB, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	args = o.args(t, args)
	out, err := o.command(ctx, args...).CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &ee) && ctx.Err() == nil:
		return string(out), ee.ExitCode()
	default:
		t.Fatalf("hastate %s: %v:\n%s", strings.Join(args, " "), err, out)
		return "", -1
	}
}

// args are the command's arguments with o.WriteFlags for a write; a
// command that asks a replica fails the test when o names none.
func (o Operator) args(t testing.TB, args []string) []string {
	t.Helper()
	if len(args) == 0 {
		return args
	}
	if !replicaless[args[0]] && o.Addr == "" && !slices.ContainsFunc(o.Env, func(kv string) bool { return strings.HasPrefix(kv, "HASTATE_ADDR=") }) {
		t.Fatalf("harness: hastate %s: Operator.Addr is empty: point it at the replica under test (h.Operator())", args[0])
	}
	if writeCommands[args[0]] {
		args = append(slices.Clone(args), o.WriteFlags...)
	}
	return args
}

// command is `hastate args...` as the operator runs it: o.Bin, the
// hermetic environment with o's Consul address, HASTATE_ADDR and o.Env.
func (o Operator) command(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, cmp.Or(o.Bin, hastateBin), args...)
	env := []string{"CONSUL_HTTP_ADDR=" + o.ConsulAddr}
	if o.Addr != "" {
		env = append(env, "HASTATE_ADDR="+o.Addr)
	}
	cmd.Env = hermeticEnv(append(env, o.Env...)...)
	cmd.SysProcAttr = testenv.ProcAttr()
	return cmd
}

// consistently checks cond every 50ms for d and fails the test with msg()
// the first time it is false. Use it only after something proves the
// system was exercised during d (e.g. probe counters moved).
func consistently(t testing.TB, d time.Duration, cond func() bool, msg func() string) {
	t.Helper()
	testenv.Consistently(t, d, holds(cond, msg))
}

// ClusterInfo is the /v1/cluster body.
type ClusterInfo = api.ClusterInfo

// Cluster returns the replica's /v1/cluster.
func (h *Hastate) Cluster(t testing.TB) ClusterInfo {
	t.Helper()
	var c ClusterInfo
	h.GetJSON(t, "/v1/cluster", &c)
	return c
}

// WaitLeader waits until one of the replicas says it leads and every other
// one names it as leader, and returns it.
func WaitLeader(t testing.TB, timeout time.Duration, hs ...*Hastate) *Hastate {
	t.Helper()
	var leader *Hastate
	var seen []string
	testenv.Eventually(t, timeout, func() error {
		leader, seen = nil, nil
		infos := make([]ClusterInfo, len(hs))
		for i, h := range hs {
			infos[i] = h.Cluster(t)
			seen = append(seen, fmt.Sprintf("%s:%s(leader %q)", infos[i].NodeID, infos[i].State, infos[i].LeaderID))
			if infos[i].State == "leader" {
				if leader != nil {
					return fmt.Errorf("no agreed raft leader: %v", seen)
				}
				leader = h
			}
		}
		if leader == nil {
			return fmt.Errorf("no agreed raft leader: %v", seen)
		}
		for _, in := range infos {
			if in.LeaderID != leader.NodeID {
				return fmt.Errorf("no agreed raft leader: %v", seen)
			}
		}
		return nil
	})
	return leader
}
