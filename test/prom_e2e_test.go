package test

import (
	"bytes"
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
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hastate/hastate/internal/testenv"
)

// The drain-for-maintenance runbook with HAProxy's own view: a real
// Prometheus scrapes, every second, the built-in exporter of two real
// HAProxy processes, and real client connections are held open through
// them to a backend server. `wait --idle` waits for the last session to
// end, `maint --drain-first` drains, waits out its idle timeout and sets
// maint, `verify` names the HAProxy that disagrees, and a stale or
// unreachable Prometheus cannot confirm anything. The two HAProxy nodes
// run the two releases tested (A Debian's 2.6, B the 3.0 LTS): wait --idle
// and verify read both exporters; the socket override is made on A, the
// disabled agent check on B.
func TestE2EHAProxyViewThroughPrometheus(t *testing.T) {
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	hs := StartCluster(t, 1, HastateOptions{ConsulAddr: consul.Addr()})
	be := Backend{Name: "be_hold", Servers: []string{"hold1", "hold2", "hold3"}}
	holds := map[string]*holdServer{}
	for _, s := range be.Servers {
		holds[s] = startHoldServer(t)
	}
	// Two HAProxy nodes: their agent checks reach hastate from 127.0.0.2
	// and 127.0.0.3, and their exporters listen there, so that the
	// Prometheus instance label and the poller address name the same node.
	var haps []*HAProxy
	var instances []string
	releases := haproxyReleases(t)
	for i, src := range []string{"127.0.0.2", "127.0.0.3"} {
		exp := net.JoinHostPort(src, strconv.Itoa(testenv.FreePort(t)))
		instances = append(instances, exp)
		t.Logf("HAProxy %c: %s (%s), exporter %s", 'A'+i, releases[i], releases[i].Version, exp)
		haps = append(haps, startHAProxy(t, freeAddr(t), hs, src, []Backend{be}, hapExtras{
			release:  releases[i],
			sections: exporterFrontend(exp),
			server:   func(_, s string) string { return holds[s].Addr() },
			timeout:  5 * time.Minute, // sessions outlive the test's steps
		}))
	}
	prom := startPrometheus(t, instances)
	promURL := "http://" + prom
	op := hs[0].Operator()
	op.Env = append(op.Env, "HASTATE_PROMETHEUS_URL="+promURL)
	run := func(want int, args ...string) string { t.Helper(); return op.RunExit(t, want, args...) }

	// Both HAProxy nodes poll every server, and Prometheus has samples of
	// both exporters.
	testenv.Eventually(t, 20*time.Second, func() error {
		var v stateView
		hs[0].GetJSON(t, "/v1/state?scope=cluster", &v)
		n := 0
		for _, r := range v.Servers {
			if r.Backend == be.Name && r.Polled == 2 {
				n++
			}
		}
		return testenv.Expect(n == len(be.Servers), "%d of the %d servers are polled by both HAProxy nodes", n, len(be.Servers))
	})
	testenv.Eventually(t, 20*time.Second, func() error {
		n := promUp(t, prom)
		return testenv.Expect(n == 2, "Prometheus does not scrape both exporters (up == 1 for %d of 2)", n)
	})

	// Client sessions held open through both HAProxy nodes: round robin
	// spreads them over the three servers.
	for _, h := range haps {
		for range 6 {
			holdClient(t, h.Frontend)
		}
	}
	perServer := func(s string) (n []int) {
		for _, h := range haps {
			n = append(n, h.Server(t, be.Name+"/"+s).Sessions)
		}
		return n
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		for _, s := range be.Servers {
			if n := perServer(s); slices.Contains(n, 0) {
				return fmt.Errorf("sessions on %s per HAProxy node: %v", s, n)
			}
		}
		return nil
	})
	t.Logf("sessions per HAProxy node: hold1 %v hold2 %v hold3 %v", perServer("hold1"), perServer("hold2"), perServer("hold3"))

	// 1. wait --idle does not return while hold1 has sessions, names both
	// HAProxy instances that hold them, and returns within seconds of the
	// last one closing.
	run(0, "drain", "be_hold/hold1", "--reason", "kernel upgrade")
	w := startOperator(t, op, "wait", "be_hold/hold1", "--idle", "--timeout", "90s")
	held := perServer("hold1")
	sessions := func(n int) string {
		return map[bool]string{true: "1 session", false: fmt.Sprintf("%d sessions", n)}[n == 1]
	}
	testenv.Eventually(t, 20*time.Second, func() error {
		out := w.Output()
		return testenv.Expect(strings.Contains(out, "be_hold/hold1 on HAProxy "+instances[0]+": "+sessions(held[0])) &&
			strings.Contains(out, "be_hold/hold1 on HAProxy "+instances[1]+": "+sessions(held[1])),
			"wait --idle does not name the %v sessions on the two HAProxy nodes:\n%s", held, out)
	})
	// It keeps waiting while they stay open: it reads Prometheus every
	// second meanwhile (the scrape above proves samples keep coming).
	consistently(t, 3*time.Second, func() bool { return !w.Exited() }, func() string {
		return "wait --idle returned with sessions open:\n" + w.Output()
	})
	closed := holds["hold1"].CloseAll()
	code, returned := w.Wait(t, 30*time.Second)
	if code != 0 || !strings.Contains(w.Output(), "idle: every HAProxy polling be_hold/hold1") {
		t.Fatalf("wait --idle after the sessions closed: exit %d\n%s", code, w.Output())
	}
	afterClose := returned.Sub(closed)
	t.Logf("wait --idle returned %s after the last session closed; %s", afterClose.Round(time.Millisecond), lastLine(w.Output()))
	if afterClose > 10*time.Second {
		t.Fatalf("wait --idle returned %s after the last session closed, want within a few seconds (scrape 1s)", afterClose)
	}
	if n := perServer("hold1"); n[0] != 0 || n[1] != 0 {
		t.Fatalf("wait --idle returned but HAProxy shows sessions on hold1: %v", n)
	}

	// 2. maint --drain-first with sessions that never close: drain, wait
	// the 5 s idle timeout, then maint on both HAProxy nodes.
	start := time.Now()
	out := run(0, "maint", "be_hold/hold2", "--drain-first", "--idle-timeout", "5s", "--reason", "disk swap")
	took := time.Since(start)
	t.Logf("maint --drain-first took %s:\n%s", took.Round(time.Millisecond), out)
	for _, want := range []string{"step 1/4: drain be_hold/hold2", "step 2/4: waiting up to 5s", "be_hold/hold2 on HAProxy " + instances[0],
		"idle timeout 5s passed", "step 3/4: maint be_hold/hold2", "step 4/4", "done: be_hold/hold2 in maint"} {
		if !strings.Contains(out, want) {
			t.Fatalf("maint --drain-first output lacks %q:\n%s", want, out)
		}
	}
	if took < 5*time.Second {
		t.Fatalf("maint --drain-first took %s, less than its idle timeout of 5s with sessions open", took)
	}
	for _, h := range haps {
		h.WaitServer(t, "be_hold/hold2", statMaint, -1)
	}
	if n := holds["hold2"].Open(); n == 0 {
		t.Fatalf("the sessions on hold2 were meant to stay open")
	}

	// The write guards are the drain's: the last ready server is refused
	// (--min-ready), a typo matches nothing (exit 3); nothing is written.
	if out := run(1, "maint", "be_hold/hold3", "--drain-first", "--idle-timeout", "5s"); !strings.Contains(out, "--min-ready") || !strings.Contains(out, "nothing written") {
		t.Fatalf("maint --drain-first of the last ready server:\n%s", out)
	}
	run(3, "maint", "be_hold/hold9", "--drain-first", "--idle-timeout", "5s")
	if out := run(0, "status", "be_hold/hold3"); !regexp.MustCompile(`hold3 +ready 100%`).MatchString(out) {
		t.Fatalf("a refused maint --drain-first wrote something:\n%s", out)
	}

	// 3. verify: every HAProxy agrees (hold1 drain, hold2 maint, hold3
	// ready) once Prometheus scraped the maint.
	var vout string
	testenv.Eventually(t, 15*time.Second, func() error {
		var code int
		vout, code = op.RunCode(t, "verify", "be_hold/*")
		return testenv.Expect(code == 0, "verify: exit %d:\n%s", code, vout)
	})
	if !strings.Contains(vout, "ok: every HAProxy agrees") || !strings.Contains(vout, "3 servers on 2 HAProxy instances") {
		t.Fatalf("verify output:\n%s", vout)
	}
	t.Logf("verify: %s", lastLine(vout))

	// A state set over one HAProxy's admin socket with its agent check
	// disabled (with the agent running, its next answer replaces it).
	hapCommand(t, haps[0], "disable agent be_hold/hold3")
	hapCommand(t, haps[0], "set server be_hold/hold3 state maint")
	testenv.Eventually(t, 15*time.Second, func() error {
		var code int
		vout, code = op.RunCode(t, "verify", "be_hold/hold3")
		return testenv.Expect(code == 1, "verify does not see the socket's maint: exit %d:\n%s", code, vout)
	})
	if !strings.Contains(vout, "be_hold/hold3 on HAProxy "+instances[0]+": reports MAINT") || strings.Contains(vout, "on HAProxy "+instances[1]+":") {
		t.Fatalf("verify after a socket maint on %s:\n%s", instances[0], vout)
	}
	t.Logf("verify after a socket maint on one HAProxy:\n%s", vout)
	hapCommand(t, haps[0], "enable agent be_hold/hold3")
	haps[0].WaitServer(t, "be_hold/hold3", "UP", -1)

	// An HAProxy whose agent check is disabled keeps its state through a
	// drain: verify exits 1 naming it, 0 for a server HAProxy agrees on.
	run(0, "clear", "be_hold/hold1")
	run(0, "wait", "be_hold/hold1", "--timeout", "20s")
	hapCommand(t, haps[1], "disable agent be_hold/hold3")
	run(0, "drain", "be_hold/hold3")
	haps[0].WaitServer(t, "be_hold/hold3", statDrainAgent, -1)
	testenv.Eventually(t, 15*time.Second, func() error {
		var code int
		vout, code = op.RunCode(t, "verify", "be_hold/hold3")
		// Once HAProxy A applied the drain and Prometheus scraped it, only
		// B disagrees.
		return testenv.Expect(code == 1 && strings.Contains(vout, "be_hold/hold3 on HAProxy "+instances[1]+": reports UP") &&
			!strings.Contains(vout, "on HAProxy "+instances[0]+":"), "verify does not name (only) the HAProxy with its agent disabled: exit %d:\n%s", code, vout)
	})
	if !strings.Contains(vout, "has not checked since") {
		t.Fatalf("verify with the agent disabled on %s:\n%s", instances[1], vout)
	}
	t.Logf("verify with the agent disabled on one HAProxy:\n%s", vout)
	testenv.Eventually(t, 15*time.Second, func() error {
		var code int
		vout, code = op.RunCode(t, "verify", "be_hold/hold1")
		return testenv.Expect(code == 0, "verify of a server both HAProxy nodes agree on: exit %d:\n%s", code, vout)
	})
	sout := run(0, "status", "be_hold", "--haproxy")
	if !regexp.MustCompile(`hold1 .*agrees \(2\)`).MatchString(sout) || !strings.Contains(sout, instances[1]+": UP weight 100") {
		t.Fatalf("status --haproxy:\n%s", sout)
	}
	t.Logf("status --haproxy:\n%s", sout)
	var rows []struct {
		Backend, Server string
		HAProxy         []struct{ Instance, State, Problem string } `json:"haproxy"`
	}
	jout, _ := op.RunCode(t, "status", "be_hold/hold3", "--haproxy", "-o", "json")
	if err := json.Unmarshal([]byte(jout[strings.Index(jout, "["):]), &rows); err != nil || len(rows) != 1 || len(rows[0].HAProxy) != 2 {
		t.Fatalf("status -o json --haproxy: %v\n%s", err, jout)
	}
	for _, h := range rows[0].HAProxy {
		if (h.Instance == instances[1]) != (h.Problem != "") || (h.Instance == instances[1]) != (h.State == "UP") {
			t.Fatalf("status -o json --haproxy: %+v; want only %s UP with a problem\n%s", rows[0].HAProxy, instances[1], jout)
		}
	}
	hapCommand(t, haps[1], "enable agent be_hold/hold3")

	// maint --drain-first interrupted while it waits for idle says what
	// it left: the drain, not the maint.
	d := startOperator(t, op, "maint", "be_hold/hold3", "--drain-first", "--idle-timeout", "60s")
	testenv.Eventually(t, 20*time.Second, func() error {
		return testenv.Expect(strings.Contains(d.Output(), "be_hold/hold3 on HAProxy "), "maint --drain-first is not waiting for sessions:\n%s", d.Output())
	})
	if err := d.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if code, _ := d.Wait(t, 10*time.Second); code != 1 || !strings.Contains(d.Output(), "interrupted during the wait for idle: be_hold/hold3 left drained") {
		t.Fatalf("maint --drain-first after SIGINT: exit %d\n%s", code, d.Output())
	}
	if sout := run(0, "status", "be_hold/hold3"); !regexp.MustCompile(`hold3 +drain`).MatchString(sout) {
		t.Fatalf("after the interrupted maint --drain-first, status:\n%s", sout)
	}

	// 4. An unreachable Prometheus cannot confirm anything: exit 4.
	dead := "http://" + freeAddr(t)
	for _, args := range [][]string{{"verify", "be_hold/hold1"}, {"wait", "be_hold/hold1", "--idle"}} {
		out := run(4, append(args, "--prometheus", dead)...)
		if !strings.Contains(out, "cannot confirm") || !strings.Contains(out, "Prometheus at "+dead) {
			t.Fatalf("hastate %s with Prometheus unreachable:\n%s", strings.Join(args, " "), out)
		}
	}
	// A stale one neither: with HAProxy B frozen, its scrapes fail and
	// its newest sample ages past --max-sample-age.
	haps[1].Signal(t, syscall.SIGSTOP)
	t.Cleanup(func() { _ = syscall.Kill(haps[1].proc.Pid(), syscall.SIGCONT) })
	out = run(4, "wait", "be_hold/hold1", "--idle", "--max-sample-age", "3s", "--timeout", "30s")
	if !strings.Contains(out, "cannot confirm") || !strings.Contains(out, instances[1]+" (newest sample") {
		t.Fatalf("wait --idle with a stale scrape:\n%s", out)
	}
	t.Logf("wait --idle with a stale scrape: %s", lastLine(out))
	out = run(4, "verify", "be_hold/hold1", "--max-sample-age", "3s")
	if !strings.Contains(out, "cannot confirm") || !strings.Contains(out, "be_hold/hold1 on HAProxy "+instances[1]+": cannot confirm: its newest sample is") {
		t.Fatalf("verify with a stale scrape:\n%s", out)
	}
}

// hapCommand runs one command on HAProxy's admin socket; HAProxy answers
// an empty line when it accepted it.
func hapCommand(t *testing.T, h *HAProxy, cmd string) {
	t.Helper()
	out, err := h.command(cmd)
	if err != nil || strings.TrimSpace(string(out)) != "" {
		t.Fatalf("haproxy %q: %v %s", cmd, err, out)
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// startPrometheus runs Debian's prometheus on 127.0.0.1 with its storage in
// t.TempDir(), scraping HAProxy's exporter at targets every second, and
// returns its host:port once it is ready. It is killed when the test ends.
func startPrometheus(t *testing.T, targets []string) string {
	t.Helper()
	return runPrometheus(t, func(string) string {
		return fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 900ms
scrape_configs:
  - job_name: haproxy
    metrics_path: /metrics
    static_configs:
      - targets: ['%s']
`, strings.Join(targets, "', '"))
	})
}

// runPrometheus runs Debian's prometheus on 127.0.0.1 with the
// configuration cfg returns (given the directory it runs in, where a
// test may write rule files) and its storage in that directory, and
// returns its host:port once it is ready. It is killed when the test ends.
func runPrometheus(t testing.TB, cfg func(dir string) string) string {
	t.Helper()
	bin := prometheusBin(t)
	dir := t.TempDir()
	addr := freeAddr(t)
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg(dir)), 0o644); err != nil {
		t.Fatal(err)
	}
	p := &testenv.Process{Bin: bin, LogPath: filepath.Join(dir, "prometheus.log")}
	p.Start(t, "--config.file="+cfgPath, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			b, _ := os.ReadFile(p.LogPath)
			t.Logf("prometheus log:\n%s", b)
		}
	})
	testenv.Eventually(t, 30*time.Second, func() error {
		if p.Exited() {
			b, _ := os.ReadFile(p.LogPath)
			t.Fatalf("prometheus exited at start:\n%s", b)
		}
		resp, err := http.Get("http://" + addr + "/-/ready")
		if err != nil {
			return fmt.Errorf("prometheus at %s: %w", addr, err)
		}
		resp.Body.Close()
		return testenv.Expect(resp.StatusCode == http.StatusOK, "prometheus at %s: /-/ready: %s", addr, resp.Status)
	})
	return addr
}

// prometheusBin finds Prometheus: $PROMETHEUS_BIN, else `prometheus` on
// PATH, else Debian's /usr/bin/prometheus. Without one the test fails.
func prometheusBin(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("PROMETHEUS_BIN"); p != "" {
		return p
	}
	if p, err := exec.LookPath("prometheus"); err == nil {
		return p
	}
	const deb = "/usr/bin/prometheus"
	if _, err := os.Stat(deb); err != nil {
		t.Fatalf("no Prometheus: PROMETHEUS_BIN is unset and %s does not exist; run `make test` (scripts/ensure-promtool.sh installs Debian's prometheus) or `apt-get install prometheus`", deb)
	}
	return deb
}

// promUp counts the HAProxy scrape targets Prometheus reports up.
func promUp(t *testing.T, addr string) int {
	t.Helper()
	return promCount(promClient(t, "http://"+addr), `up{job="haproxy"} == 1`)
}

// holdServer is a backend server that holds every connection open until
// the peer closes it or CloseAll: the sessions a drain waits for.
type holdServer struct {
	ln    net.Listener
	mu    sync.Mutex
	conns map[net.Conn]bool
	wg    sync.WaitGroup
}

func startHoldServer(t *testing.T) *holdServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &holdServer{ln: ln, conns: map[net.Conn]bool{}}
	h.wg.Add(1)
	go func() { // owned by h: the cleanup closes ln and waits
		defer h.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			h.mu.Lock()
			h.conns[c] = true
			h.mu.Unlock()
			h.wg.Add(1)
			go func() { // ends when the peer or CloseAll closes c
				defer h.wg.Done()
				_, _ = io.Copy(io.Discard, c)
				h.mu.Lock()
				delete(h.conns, c)
				h.mu.Unlock()
				c.Close()
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		h.CloseAll()
		h.wg.Wait()
	})
	return h
}

func (h *holdServer) Addr() string { return h.ln.Addr().String() }

// Open counts the connections held now (health checks come and go).
func (h *holdServer) Open() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.conns)
}

// CloseAll closes every held connection and returns when the last one was
// closed.
func (h *holdServer) CloseAll() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	for c := range h.conns {
		c.Close()
	}
	return time.Now()
}

// holdClient opens a client connection through HAProxy's frontend and
// holds it until the test ends or the server closes its side (then, as a
// client does, it closes too, ending the session in HAProxy).
func holdClient(t *testing.T, frontend string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", frontend, 2*time.Second)
	if err != nil {
		t.Fatalf("client connection to HAProxy %s: %v", frontend, err)
	}
	done := make(chan struct{})
	go func() { // owned by the cleanup below
		defer close(done)
		_, _ = io.Copy(io.Discard, c)
		c.Close()
	}()
	t.Cleanup(func() {
		c.Close()
		<-done
	})
}

// bgOperator is an operator command running in the background.
type bgOperator struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  bytes.Buffer
	done chan struct{}
	at   time.Time // when it exited
	code int
}

func (b *bgOperator) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.out.Write(p)
}

// startOperator starts `hastate args...` as op.RunCode would (but without
// a timeout), without waiting for it; it is killed when the test ends.
func startOperator(t *testing.T, op Operator, args ...string) *bgOperator {
	t.Helper()
	b := &bgOperator{done: make(chan struct{})}
	b.cmd = op.command(context.Background(), op.args(t, args)...)
	b.cmd.Stdout, b.cmd.Stderr = b, b
	if err := b.cmd.Start(); err != nil {
		t.Fatalf("hastate %s: %v", strings.Join(args, " "), err)
	}
	go func() { // owned by b: the cleanup waits for it
		err := b.cmd.Wait()
		b.mu.Lock()
		b.at = time.Now()
		var ee *exec.ExitError
		switch {
		case err == nil:
		case errors.As(err, &ee):
			b.code = ee.ExitCode()
		default:
			b.code = -1
		}
		b.mu.Unlock()
		close(b.done)
	}()
	t.Cleanup(func() {
		_ = b.cmd.Process.Kill()
		<-b.done
	})
	return b
}

func (b *bgOperator) Output() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.out.String()
}

func (b *bgOperator) Exited() bool {
	select {
	case <-b.done:
		return true
	default:
		return false
	}
}

// Wait waits up to timeout for the command to exit and returns its exit
// code and when it exited.
func (b *bgOperator) Wait(t *testing.T, timeout time.Duration) (int, time.Time) {
	t.Helper()
	select {
	case <-b.done:
	case <-time.After(timeout):
		t.Fatalf("hastate %s still runs after %s:\n%s", strings.Join(b.cmd.Args[1:], " "), timeout, b.Output())
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.code, b.at
}
