package testenv

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
)

// consulVersion is the version scripts/ensure-consul.sh builds and caches.
const consulVersion = "1.13.9"

// readyTimeout bounds how long StartConsul and Restart wait for the KV API.
const readyTimeout = 60 * time.Second

// ConsulBin returns the Consul binary tests run: $CONSUL_BIN if set, else
// `consul` on PATH, else the build scripts/ensure-consul.sh caches in
// ${HASTATE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hastate}/bin. Without one
// the test fails (it is never skipped).
func ConsulBin(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("CONSUL_BIN"); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("testenv: CONSUL_BIN=%s: %v; unset it or run scripts/ensure-consul.sh", p, err)
		}
		return p
	}
	if p, err := exec.LookPath("consul"); err == nil {
		return p
	}
	p := filepath.Join(cacheDir(), "bin", "consul-"+consulVersion)
	if _, err := os.Stat(p); err == nil {
		return p
	}
	t.Fatalf("testenv: no Consul binary: $CONSUL_BIN is unset, `consul` is not on PATH and %s does not exist; "+
		"run `make test` or `scripts/ensure-consul.sh` (it builds consul v%s once, about 10 minutes)", p, consulVersion)
	return ""
}

// cacheDir mirrors scripts/ensure-consul.sh:
// ${HASTATE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hastate}.
func cacheDir() string {
	if d := os.Getenv("HASTATE_CACHE"); d != "" {
		return d
	}
	base := os.Getenv("XDG_CACHE_HOME")
	if base == "" {
		home, _ := os.UserHomeDir()
		base = filepath.Join(home, ".cache")
	}
	return filepath.Join(base, "hastate")
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago and
// that this process has not handed out before.
func FreePort(t testing.TB) int {
	t.Helper()
	handedOut.Lock()
	defer handedOut.Unlock()
	for range 50 {
		if p := freePort(t); !handedOut.ports[p] {
			handedOut.ports[p] = true
			return p
		}
	}
	t.Fatalf("testenv: 50 free ports in a row were ones this process already handed out")
	return 0
}

// handedOut is every port FreePort returned in this process. The port
// space is the kernel's, shared by every test of the process, so the
// record is process-wide too: testenv's one package-level variable. The
// TIME_WAIT that freePort leaves keeps the kernel from handing a port out
// again, but not always: with tcp_tw_reuse (on for loopback by default) a
// busy machine's outgoing connections take over TIME_WAIT ports, and a
// port closed again after that is free at once (make test beside a
// benchmark: one port twice in 300 calls).
var handedOut = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// freePort is a port no socket holds, left in TIME_WAIT (FreePort).
func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testenv: pick a free port: %v", err)
	}
	defer ln.Close()
	// Listen on port 0 hands out a port that was just closed again often
	// enough (9 repeats in 300 calls, measured) that one test's ports
	// collided. A connection closed by the listening side first leaves the
	// port in TIME_WAIT: the kernel skips it when it picks a port for
	// another Listen on port 0, while a server that binds it by number
	// with SO_REUSEADDR (Go, Consul, HAProxy all set it) still can.
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("testenv: reserve port %s: %v", ln.Addr(), err)
	}
	defer c.Close()
	s, err := ln.Accept()
	if err != nil {
		t.Fatalf("testenv: reserve port %s: %v", ln.Addr(), err)
	}
	s.Close()
	_, _ = io.Copy(io.Discard, c) // until the listening side's FIN: it closed first
	return ln.Addr().(*net.TCPAddr).Port
}

// ConsulOptions chooses how StartConsul runs the agent. The zero value is a
// dev-mode agent (in-memory KV) on free ports.
type ConsulOptions struct {
	// Persistent runs a single-node server with a data directory instead of
	// -dev, so the KV survives Kill and Restart.
	Persistent bool
	// HTTPPort is the HTTP API port; 0 picks a free one. Set it to start
	// Consul where a client is already pointed.
	HTTPPort int
	// ACL runs Consul as production does: ACLs on, default_policy "deny".
	// The test's own client (Client, Put, Delete) then uses the
	// management token (ManagementToken); what hastate may do comes from
	// the tokens the test makes (CreateToken), with the shipped policies
	// (ShippedPolicy). Without ACL, every token may do everything.
	ACL bool
	// KeyListPolicy also sets acl.enable_key_list_policy (with ACL): a
	// recursive read then needs "list" on the prefix, and a token without
	// it gets 403 instead of a filtered listing.
	KeyListPolicy bool
}

// Consul is a Consul agent run by a test. Its methods are meant for the
// test's own goroutine; Kill is also safe from a cleanup.
type Consul struct {
	proc Process
	args []string
	addr string
	// mgmt is the management token with ACL, "" without.
	mgmt string

	mu     sync.Mutex
	client *api.Client
}

// StartConsul starts a Consul agent bound to 127.0.0.1 and returns once its
// KV API answers. The agent is killed when the test ends; its log is printed
// if the test failed.
func StartConsul(t testing.TB, opts ConsulOptions) *Consul {
	t.Helper()
	dir := t.TempDir()
	httpPort := opts.HTTPPort
	if httpPort == 0 {
		httpPort = FreePort(t)
	}
	args := []string{
		"agent",
		"-node", "testenv",
		"-bind", "127.0.0.1",
		"-client", "127.0.0.1",
		"-advertise", "127.0.0.1",
		"-http-port", strconv.Itoa(httpPort),
		"-serf-lan-port", strconv.Itoa(FreePort(t)),
		"-serf-wan-port", strconv.Itoa(FreePort(t)),
		"-server-port", strconv.Itoa(FreePort(t)),
		"-dns-port", "-1",
		"-grpc-port", "-1",
		"-log-level", "info",
		"-hcl", "disable_update_check = true",
	}
	var mgmt string
	if opts.ACL {
		mgmt = NewUUID(t)
		// The agent's own token is the management one: with default deny
		// it could not even register its node otherwise.
		args = append(args, "-hcl", fmt.Sprintf(`acl {
  enabled = true
  default_policy = "deny"
  enable_key_list_policy = %t
  tokens {
    initial_management = %q
    agent = %q
  }
}`, opts.KeyListPolicy, mgmt, mgmt))
	} else if opts.KeyListPolicy {
		t.Fatalf("testenv: ConsulOptions.KeyListPolicy needs ACL")
	}
	if opts.Persistent {
		args = append(args,
			"-server", "-bootstrap-expect=1",
			"-data-dir", filepath.Join(dir, "data"),
			"-ui=false",
			// Elect the single server in about a second, not five.
			"-hcl", "performance { raft_multiplier = 1 }",
		)
	} else {
		args = append(args, "-dev")
	}
	c := &Consul{
		proc: Process{Bin: ConsulBin(t), LogPath: filepath.Join(dir, "consul.log")},
		args: args,
		addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(httpPort)),
		mgmt: mgmt,
	}
	t.Cleanup(func() {
		c.Kill()
		if t.Failed() {
			b, err := c.proc.Log(32 << 10)
			t.Logf("testenv: consul log %s (last %d bytes, %v):\n%s", c.proc.LogPath, len(b), err, b)
		}
	})
	c.start(t)
	return c
}

// Addr returns the host:port of the agent's HTTP API.
func (c *Consul) Addr() string { return c.addr }

// Client returns an API client for the agent (plain HTTP), with the
// management token when the agent runs with ACL. It is created once and
// shared; it survives Restart.
func (c *Consul) Client(t testing.TB) *api.Client {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.client == nil {
		cl, err := api.NewClient(&api.Config{Address: c.addr, Scheme: "http", Token: c.mgmt})
		if err != nil {
			t.Fatalf("testenv: consul client for %s: %v", c.addr, err)
		}
		c.client = cl
	}
	return c.client
}

// Kill sends SIGKILL to the agent and waits for it to exit. Killing an
// agent that is not running does nothing.
func (c *Consul) Kill() { c.proc.Kill() }

// Restart kills the agent if it runs and starts it again with the same
// ports and data directory, returning once the KV API answers.
func (c *Consul) Restart(t testing.TB) {
	t.Helper()
	c.Kill()
	c.start(t)
}

// Put writes key=value and returns the raft index of the write.
func (c *Consul) Put(t testing.TB, key, value string) uint64 {
	t.Helper()
	kv := c.Client(t).KV()
	if _, err := kv.Put(&api.KVPair{Key: key, Value: []byte(value)}, nil); err != nil {
		t.Fatalf("testenv: consul put %s: %v", key, err)
	}
	_, meta, err := kv.Get(key, &api.QueryOptions{RequireConsistent: true})
	if err != nil {
		t.Fatalf("testenv: consul get %s after put: %v", key, err)
	}
	return meta.LastIndex
}

// Delete removes key and returns an index at or after the delete.
func (c *Consul) Delete(t testing.TB, key string) uint64 {
	t.Helper()
	kv := c.Client(t).KV()
	if _, err := kv.Delete(key, nil); err != nil {
		t.Fatalf("testenv: consul delete %s: %v", key, err)
	}
	_, meta, err := kv.Get(key, &api.QueryOptions{RequireConsistent: true})
	if err != nil {
		t.Fatalf("testenv: consul get %s after delete: %v", key, err)
	}
	return meta.LastIndex
}

func (c *Consul) start(t testing.TB) {
	t.Helper()
	c.proc.Start(t, c.args...)
	if err := c.waitReady(c.proc.Done()); err != nil {
		// The cleanup prints the agent's log since the test failed.
		t.Fatalf("testenv: consul at %s: %v", c.addr, err)
	}
}

// waitReady polls until a leader is elected and a consistent KV read works.
func (c *Consul) waitReady(exited <-chan struct{}) error {
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	probe, err := api.NewClient(&api.Config{
		Address:    c.addr,
		Scheme:     "http",
		Token:      c.mgmt,
		HttpClient: &http.Client{Timeout: 2 * time.Second, Transport: tr},
	})
	if err != nil {
		return err
	}
	deadline := time.Now().Add(readyTimeout)
	lastErr := errors.New("not polled yet")
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return errors.New("agent exited before it was ready (its log follows)")
		default:
		}
		leader, err := probe.Status().Leader()
		switch {
		case err != nil:
			lastErr = err
		case leader == "":
			lastErr = errors.New("no leader yet")
		default:
			_, _, err := probe.KV().Get("testenv/ready-probe", &api.QueryOptions{RequireConsistent: true})
			if err == nil {
				return nil
			}
			lastErr = err
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("KV API not ready within %s: %v", readyTimeout, lastErr)
}
