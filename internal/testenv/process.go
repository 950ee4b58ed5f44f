package testenv

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// Process is a child process run by a test: Consul, hastate, HAProxy. Its
// output is appended to LogPath (across restarts, each start headed by its
// command line), one goroutine per start waits for it, and Kill or Wait
// reap it. The kernel kills it if the test binary dies without running its
// cleanups. Its methods are safe for concurrent use.
type Process struct {
	Bin     string
	Env     []string // nil: the test's environment
	LogPath string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed once cmd has exited and been waited for
	ps   *os.ProcessState
}

// Start starts Bin with args. It fails the test when the process is
// already running or cannot start; it does not wait for readiness.
func (p *Process) Start(t testing.TB, args ...string) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		t.Fatalf("testenv: %s is already running", p.Bin)
	}
	logf, err := os.OpenFile(p.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatalf("testenv: log of %s: %v", p.Bin, err)
	}
	defer logf.Close() // the child holds its own descriptor
	fmt.Fprintf(logf, "==> testenv: %s %s\n", p.Bin, strings.Join(args, " "))
	cmd := exec.Command(p.Bin, args...)
	cmd.Env = p.Env
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = ProcAttr()
	if err := cmd.Start(); err != nil {
		t.Fatalf("testenv: start %s: %v", p.Bin, err)
	}
	done := make(chan struct{})
	go func() { // owned by p: Kill and Wait wait for it
		_ = cmd.Wait()
		p.mu.Lock()
		p.ps = cmd.ProcessState
		p.mu.Unlock()
		close(done)
	}()
	p.cmd, p.done, p.ps = cmd, done, nil
}

// Done returns a channel closed once the process started last has exited,
// or nil when it is not running.
func (p *Process) Done() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done
}

// Running reports whether the process was started and not reaped yet (it
// may have exited on its own).
func (p *Process) Running() bool { return p.Done() != nil }

// Exited reports whether the process started last has exited (or none
// runs).
func (p *Process) Exited() bool {
	done := p.Done()
	if done == nil {
		return true
	}
	select {
	case <-done:
		return true
	default:
		return false
	}
}

// Pid returns the process ID of the process started last, or 0 when none
// runs: benchmarks read its memory from /proc/<pid>/status.
func (p *Process) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Kill sends SIGKILL and waits for the process to exit. Killing a process
// that does not run does nothing.
func (p *Process) Kill() {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-done
	p.reap()
}

// Signal sends sig to the running process and returns when it sent it.
func (p *Process) Signal(t testing.TB, sig os.Signal) time.Time {
	t.Helper()
	p.mu.Lock()
	cmd := p.cmd
	p.mu.Unlock()
	if cmd == nil {
		t.Fatalf("testenv: %v to %s: it is not running", sig, p.Bin)
	}
	sent := time.Now()
	if err := cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		t.Fatalf("testenv: %v to %s: %v", sig, p.Bin, err)
	}
	return sent
}

// Wait waits up to timeout for the process to exit and returns its exit
// code. A process still running then is killed and the test fails.
func (p *Process) Wait(t testing.TB, timeout time.Duration) int {
	t.Helper()
	done := p.Done()
	if done == nil {
		t.Fatalf("testenv: wait for %s: it is not running", p.Bin)
	}
	select {
	case <-done:
	case <-time.After(timeout):
		p.Kill()
		t.Fatalf("testenv: %s did not exit within %s; killed it", p.Bin, timeout)
	}
	p.mu.Lock()
	ps := p.ps
	p.mu.Unlock()
	p.reap()
	return ps.ExitCode()
}

func (p *Process) reap() {
	p.mu.Lock()
	p.cmd, p.done = nil, nil
	p.mu.Unlock()
}

// Log returns the last max bytes of the log.
func (p *Process) Log(max int) ([]byte, error) {
	b, err := os.ReadFile(p.LogPath)
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return b, err
}
