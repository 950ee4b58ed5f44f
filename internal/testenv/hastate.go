package testenv

import (
	"context"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// BuildHastate builds ./cmd/hastate of the module at root (a path relative
// to the test's directory, such as "../..") into a temporary directory
// and returns the binary's path.
func BuildHastate(t testing.TB, root string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "hastate")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/hastate")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("testenv: go build ./cmd/hastate: %v\n%s", err, out)
	}
	return bin
}

// HermeticEnv is the test's environment without the variables hastate and
// the Consul client read (HASTATE_*, CONSUL_*).
func HermeticEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "HASTATE_") && !strings.HasPrefix(kv, "CONSUL_") {
			env = append(env, kv)
		}
	}
	return env
}

// AgentCheck sends one agent check to addr as HAProxy does (req and a line
// feed) and returns the answer, "" on any error.
func AgentCheck(addr, req string) string {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return ""
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := io.WriteString(c, req+"\n"); err != nil {
		return ""
	}
	b, _ := io.ReadAll(c)
	return string(b)
}

// Hastate is one `hastate serve` run by a test: a one-node cluster on free
// 127.0.0.1 ports.
type Hastate struct {
	Proc              *Process
	Agent, HTTP, Raft string // host:port of each listener
}

// StartHastate starts bin (see BuildHastate) as the one-node cluster id,
// reading Consul at consulAddr, with the extra serve flags given. It does
// not wait for the replica to answer. The process is killed when the test
// ends, and its log is printed if the test failed.
func StartHastate(t testing.TB, bin, id, consulAddr string, extra ...string) *Hastate {
	t.Helper()
	addr := func() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(FreePort(t))) }
	h := &Hastate{Agent: addr(), HTTP: addr(), Raft: addr(),
		Proc: &Process{Bin: bin, Env: HermeticEnv(), LogPath: filepath.Join(t.TempDir(), "hastate.log")}}
	args := append([]string{"serve", "--node-id", id, "--data-dir", t.TempDir(),
		"--agent-addr", h.Agent, "--http-addr", h.HTTP, "--raft-addr", h.Raft, "--raft-advertise", h.Raft,
		"--consul-addr", consulAddr}, extra...)
	h.Proc.Start(t, args...)
	t.Cleanup(func() {
		h.Proc.Kill()
		if t.Failed() {
			if b, err := h.Proc.Log(1 << 16); err == nil {
				t.Logf("testenv: hastate %s log:\n%s", id, b)
			}
		}
	})
	return h
}

// StartShowcase starts a Consul holding kv (keys under the hastate/
// prefix) and a one-node hastate id on it with a ramp in progress: it drains
// web/r, waits until it is answered, deletes the key and returns once web/r
// ramps. The extra serve flags must turn ramps on (--ramp-duration).
func StartShowcase(t testing.TB, bin, id string, kv map[string]string, extra ...string) (*Consul, *Hastate) {
	t.Helper()
	consul := StartConsul(t, ConsulOptions{})
	for k, v := range kv {
		consul.Put(t, k, v)
	}
	consul.Put(t, "hastate/state/web/r", "drain")
	h := StartHastate(t, bin, id, consul.Addr(), extra...)
	Eventually(t, 30*time.Second, func() error { return Expect(AgentCheck(h.Agent, "web/r") == "drain\n", "hastate never answered drain") })
	consul.Delete(t, "hastate/state/web/r") // undrain: a ramp
	Eventually(t, 10*time.Second, func() error {
		return Expect(strings.HasPrefix(AgentCheck(h.Agent, "web/r"), "ready 1"), "web/r never ramped")
	})
	return consul, h
}
