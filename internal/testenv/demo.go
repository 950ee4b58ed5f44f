package testenv

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
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Demo is scripts/demo.sh run by a test as a user runs it: in a terminal
// (a pseudo-terminal made by script(1)), with its output through `| tee`,
// stopped with Ctrl-C. Each Demo has a loopback block of its own
// (HASTATE_DEMO_NET=127.a.b) and a directory of its own
// (HASTATE_DEMO_DIR), so that it never meets a developer's `make demo` or
// another test. Its methods are not safe for concurrent use.
type Demo struct {
	Root string // the repository (scripts/demo.sh is below it)
	Bin  string // the hastate binary
	Dir  string // HASTATE_DEMO_DIR
	Net  string // HASTATE_DEMO_NET, e.g. "127.83.17"
	// Extra is added to the script's environment (HAPROXY_BIN=...,
	// PROMETHEUS_BIN=...); CONSUL_BIN is ConsulBin's.
	Extra []string

	consul string

	run *demoRun // the script that runs, nil when none
}

// demoRun is one start of the script.
type demoRun struct {
	cmd   *exec.Cmd
	pty   io.WriteCloser // the terminal's keyboard (script's stdin); nil: no terminal
	out   *syncBuffer    // what the terminal showed
	tee   string         // the file tee wrote, "" without tee
	done  chan struct{}
	state *os.ProcessState
}

// NewDemo prepares a demo of the repository at root (relative to the
// test's directory, e.g. ".." or "../..") run with the hastate binary
// bin. It does not start it. When the test ends, whatever the demo left
// running is stopped (scripts/demo.sh stop), and the demo's logs are
// printed if the test failed.
func NewDemo(t testing.TB, root, bin string) *Demo {
	t.Helper()
	root, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}
	// HAProxy's admin sockets live in the directory: a unix socket path
	// must fit in 108 bytes, which t.TempDir() paths may not.
	dir, err := os.MkdirTemp("", "hsdemo-")
	if err != nil {
		t.Fatal(err)
	}
	d := &Demo{Root: root, Bin: bin, Dir: filepath.Join(dir, "demo"), Net: freeNet(t), consul: ConsulBin(t)}
	t.Cleanup(func() {
		if d.run != nil {
			d.interruptGroup()
			d.waitRun(60 * time.Second)
		}
		if out, _, err := d.script("stop"); err != nil {
			t.Logf("testenv: demo: scripts/demo.sh stop: %v\n%s", err, out)
		}
		for _, p := range d.Processes() { // what stop did not stop
			t.Logf("testenv: demo: %s left running after stop: killed", p)
			if pid, err := strconv.Atoi(strings.Fields(p)[0]); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		if t.Failed() {
			d.logTails(t)
		}
		os.RemoveAll(dir)
	})
	return d
}

// freeNet picks a loopback block 127.a.b (a >= 100) where nothing listens
// on the demo's first address.
func freeNet(t testing.TB) string {
	t.Helper()
	for range 50 {
		n := fmt.Sprintf("127.%d.%d", 100+rand.IntN(150), 1+rand.IntN(250))
		ln, err := net.Listen("tcp", n+".1:8500")
		if err != nil {
			continue
		}
		ln.Close()
		return n
	}
	t.Fatal("testenv: demo: no free loopback block 127.a.b found")
	return ""
}

// Env is the environment of the commands the demo prints, without the
// PATH: CONSUL_HTTP_ADDR, HASTATE_ADDR, HASTATE_PROMETHEUS_URL and the two
// that find this demo.
func (d *Demo) Env() []string {
	return append(HermeticEnv(),
		"CONSUL_HTTP_ADDR="+d.Net+".1:8500",
		"HASTATE_ADDR=http://"+d.Net+".1:9778",
		"HASTATE_PROMETHEUS_URL=http://"+d.Net+".1:9090",
		"HASTATE_DEMO_DIR="+d.Dir,
		"HASTATE_DEMO_NET="+d.Net,
	)
}

// Addr is the demo's address a.b.c.<host> with port.
func (d *Demo) Addr(host, port int) string {
	return net.JoinHostPort(d.Net+"."+strconv.Itoa(host), strconv.Itoa(port))
}

func (d *Demo) scriptEnv() []string {
	env := append(d.Env(), "HASTATE_BIN="+d.Bin, "CONSUL_BIN="+d.consul)
	return append(env, d.Extra...)
}

// Start runs `scripts/demo.sh args...` in a terminal, its output through
// `2>&1 | tee` (as `make demo | tee` runs), and returns once it printed
// that the demo runs, with what the terminal showed until then. The demo
// is then the terminal's foreground job, stopped by Interrupt.
func (d *Demo) Start(t testing.TB, args ...string) string {
	t.Helper()
	tee := filepath.Join(filepath.Dir(d.Dir), fmt.Sprintf("tee-%d.txt", time.Now().UnixNano()))
	inner := "scripts/demo.sh"
	for _, a := range args {
		inner += " " + shellQuote(a)
	}
	inner += " 2>&1 | tee " + shellQuote(tee)
	// script(1) makes the terminal; env --default-signal=INT undoes a
	// SIGINT ignored by whatever started the test (a background job), or
	// Ctrl-C would reach nothing.
	cmd := exec.Command("env", "--default-signal=INT", "script", "-qfec", inner, "/dev/null")
	return d.start(t, cmd, tee)
}

// StartPlain runs `scripts/demo.sh args...` without a terminal (as a CI
// job or `nohup` would), in a process group of its own; Interrupt sends
// SIGINT to that group, as a terminal's Ctrl-C does.
func (d *Demo) StartPlain(t testing.TB, args ...string) string {
	t.Helper()
	cmd := exec.Command("env", append([]string{"--default-signal=INT", "scripts/demo.sh"}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	return d.start(t, cmd, "")
}

func (d *Demo) start(t testing.TB, cmd *exec.Cmd, tee string) string {
	t.Helper()
	if d.run != nil {
		t.Fatal("testenv: demo: already started")
	}
	cmd.Dir = d.Root
	cmd.Env = d.scriptEnv()
	r := &demoRun{cmd: cmd, out: &syncBuffer{}, tee: tee, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = r.out, r.out
	if tee != "" {
		w, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		r.pty = w
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("testenv: demo: start %v: %v", cmd.Args, err)
	}
	go func() { // owned by the run: waitRun waits for it
		_ = cmd.Wait()
		r.state = cmd.ProcessState
		close(r.done)
	}()
	d.run = r
	const running = "hastate demo is running."
	deadline := time.Now().Add(3 * time.Minute)
	for !strings.Contains(r.out.String(), running) {
		select {
		case <-r.done:
			d.run = nil
			t.Fatalf("testenv: demo: %v exited (%v) before it ran:\n%s", cmd.Args, r.state, r.out.String())
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("testenv: demo: not running within 3m:\n%s", r.out.String())
		}
	}
	// The command list follows that line; its last line ends it.
	Eventually(t, 10*time.Second, func() error {
		return Expect(strings.Contains(r.out.String(), "commands.txt.)"), "the demo's command list did not end:\n%s", r.out.String())
	})
	return r.out.String()
}

// Output is what the terminal of the running (or last) demo showed.
func (d *Demo) Output() string {
	if d.run == nil {
		return ""
	}
	return d.run.out.String()
}

// Running reports whether the demo script runs.
func (d *Demo) Running() bool {
	if d.run == nil {
		return false
	}
	select {
	case <-d.run.done:
		return false
	default:
		return true
	}
}

// Interrupt is Ctrl-C: typed into the demo's terminal, or SIGINT to its
// process group without one. It waits up to timeout for the demo to exit
// and returns what the terminal showed and what tee kept ("" without tee).
func (d *Demo) Interrupt(t testing.TB, timeout time.Duration) (terminal, tee string) {
	t.Helper()
	if d.run == nil {
		t.Fatal("testenv: demo: not started")
	}
	r := d.run
	if r.pty != nil {
		if _, err := r.pty.Write([]byte{3}); err != nil {
			t.Fatalf("testenv: demo: Ctrl-C: %v", err)
		}
	} else {
		d.interruptGroup()
	}
	if !d.waitRun(timeout) {
		t.Fatalf("testenv: demo: still running %s after Ctrl-C:\n%s", timeout, r.out.String())
	}
	if r.tee != "" {
		b, _ := os.ReadFile(r.tee)
		tee = string(b)
	}
	return r.out.String(), tee
}

// interruptGroup sends SIGINT to the demo's process group.
func (d *Demo) interruptGroup() {
	r := d.run
	if r.pty != nil {
		_, _ = r.pty.Write([]byte{3})
		return
	}
	_ = syscall.Kill(-r.cmd.Process.Pid, syscall.SIGINT)
}

// waitRun waits up to timeout for the run to end; false if it still runs.
func (d *Demo) waitRun(timeout time.Duration) bool {
	r := d.run
	select {
	case <-r.done:
	case <-time.After(timeout):
		return false
	}
	if r.pty != nil {
		r.pty.Close()
	}
	d.run = nil
	return true
}

// Script runs `scripts/demo.sh args...` from another shell (consul
// stop|start, restart, stop) and returns its output and exit code.
func (d *Demo) Script(t testing.TB, args ...string) (string, int) {
	t.Helper()
	out, code, err := d.script(args...)
	if err != nil {
		t.Fatalf("testenv: demo: scripts/demo.sh %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out, code
}

func (d *Demo) script(args ...string) (string, int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(d.Root, "scripts", "demo.sh"), args...)
	cmd.Dir = d.Root
	cmd.Env = d.scriptEnv()
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return string(out), ee.ExitCode(), nil
	}
	return string(out), 0, err
}

// Hastate runs the hastate CLI as the demo's printed commands do (its
// environment) and returns its combined output and exit code.
func (d *Demo) Hastate(t testing.TB, args ...string) (string, int) {
	t.Helper()
	return d.combined(t, "hastate "+strings.Join(args, " "), d.Env(), d.Bin, args...)
}

// Shell runs a command line as an operator types it in "another shell"
// (bash -c, from the repository): with the demo's environment (the export
// line the demo prints completes it), the binary scripts/demo.sh restarts
// a replica with (make demo builds it as bin/hastate) and the test's PATH.
// It returns the combined output and exit code.
func (d *Demo) Shell(t testing.TB, line string) (string, int) {
	t.Helper()
	env := append(d.Env(), "HASTATE_BIN="+d.Bin, "PATH="+os.Getenv("PATH"))
	return d.combined(t, line, env, "bash", "-c", line)
}

// combined runs name args with env (for at most 3 minutes) and returns
// its combined output and exit code; what names it in a failure.
func (d *Demo) combined(t testing.TB, what string, env []string, name string, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir, cmd.Env = d.Root, env
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return string(out), ee.ExitCode()
	case err != nil:
		t.Fatalf("testenv: demo: %s: %v\n%s", what, err, out)
	}
	return string(out), 0
}

// Processes lists, as "pid command line", every process whose command
// line names the demo's directory: what the demo started and still runs.
func (d *Demo) Processes() []string {
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !bytes.Contains(b, []byte(d.Dir+"/")) {
			continue
		}
		if st, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); err == nil {
			if f := strings.Fields(string(st[bytes.LastIndexByte(st, ')')+1:])); len(f) > 0 && f[0] == "Z" {
				continue // exited, not yet reaped by its parent
			}
		}
		out = append(out, fmt.Sprintf("%d %s", pid, strings.TrimSpace(string(bytes.ReplaceAll(b, []byte{0}, []byte{' '})))))
	}
	return out
}

// logTails prints the end of every log of the demo.
func (d *Demo) logTails(t testing.TB) {
	logs, _ := filepath.Glob(filepath.Join(d.Dir, "*.log"))
	for _, l := range logs {
		b, err := os.ReadFile(l)
		if err != nil {
			continue
		}
		if len(b) > 8<<10 {
			b = b[len(b)-8<<10:]
		}
		t.Logf("testenv: demo: %s (last %d bytes):\n%s", l, len(b), b)
	}
}

// shellQuote quotes s for sh.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// syncBuffer is a bytes.Buffer written by a process and read by the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
