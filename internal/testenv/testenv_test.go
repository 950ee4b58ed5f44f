package testenv

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
)

func TestStartConsulDev(t *testing.T) {
	t.Parallel()
	c := StartConsul(t, ConsulOptions{})
	host, _, err := net.SplitHostPort(c.Addr())
	if err != nil || host != "127.0.0.1" {
		t.Fatalf("Addr() = %q, want 127.0.0.1:port", c.Addr())
	}
	i1 := c.Put(t, "a/b", "c")
	pair, _, err := c.Client(t).KV().Get("a/b", nil)
	if err != nil || pair == nil || string(pair.Value) != "c" {
		t.Fatalf("get a/b = %v, %v", pair, err)
	}
	i2 := c.Delete(t, "a/b")
	if i1 == 0 || i2 <= i1 {
		t.Errorf("put index %d, delete index %d: want increasing, non-zero", i1, i2)
	}
	if pair, _, _ := c.Client(t).KV().Get("a/b", nil); pair != nil {
		t.Errorf("a/b still there after Delete")
	}
}

func TestStartConsulPersistentSurvivesRestart(t *testing.T) {
	t.Parallel()
	c := StartConsul(t, ConsulOptions{Persistent: true})
	c.Put(t, "hastate/state/web/a", "drain")
	addr := c.Addr()
	c.Kill()
	if _, _, err := c.Client(t).KV().Get("hastate/state/web/a", nil); err == nil {
		t.Fatal("KV answers after Kill")
	}
	c.Kill() // twice is harmless
	c.Restart(t)
	if c.Addr() != addr {
		t.Errorf("address changed across Restart: %s -> %s", addr, c.Addr())
	}
	pair, _, err := c.Client(t).KV().Get("hastate/state/web/a", nil)
	if err != nil || pair == nil || string(pair.Value) != "drain" {
		t.Fatalf("after restart get = %v, %v; want drain", pair, err)
	}
}

// A persistent Consul with ACLs keeps its policies and tokens across a
// restart (the nemesis restarts it with the replicas' tokens in use), and
// a deleted token created again with its accessor and secret is let in
// again.
func TestPersistentACLConsulKeepsTokens(t *testing.T) {
	t.Parallel()
	c := StartConsul(t, ConsulOptions{Persistent: true, ACL: true})
	c.Put(t, "hastate/state/web/a", "drain")
	read, _ := c.ShippedTokens(t, "hastate/")
	list := func() error {
		cl, err := api.NewClient(&api.Config{Address: c.Addr(), Token: read.SecretID})
		if err != nil {
			return err
		}
		pairs, _, err := cl.KV().List("hastate/", &api.QueryOptions{RequireConsistent: true})
		if err == nil && len(pairs) != 1 {
			err = fmt.Errorf("listed %d keys, want 1", len(pairs))
		}
		return err
	}
	if err := list(); err != nil {
		t.Fatalf("the read token before the restart: %v", err)
	}
	c.Restart(t)
	if err := list(); err != nil {
		t.Fatalf("the read token after the restart: %v", err)
	}
	c.DeleteToken(t, read)
	if err := list(); err == nil || !strings.Contains(err.Error(), "403") {
		t.Fatalf("the deleted token lists: %v, want 403", err)
	}
	c.RecreateToken(t, read, "hastate replicas, restored", "hastate-read")
	if err := list(); err != nil {
		t.Fatalf("the re-created token: %v", err)
	}
}

func TestStartConsulOnChosenPort(t *testing.T) {
	t.Parallel()
	port := FreePort(t)
	c := StartConsul(t, ConsulOptions{HTTPPort: port})
	if want := "127.0.0.1:" + strconv.Itoa(port); c.Addr() != want {
		t.Fatalf("Addr() = %s, want %s", c.Addr(), want)
	}
	cl, err := api.NewClient(&api.Config{Address: c.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Status().Leader(); err != nil {
		t.Fatalf("no answer on the chosen port: %v", err)
	}
}

// recTB records Fatalf instead of stopping the test.
type recTB struct {
	testing.TB
	fatal string
}

func (r *recTB) Helper() {}

func (r *recTB) Fatalf(format string, args ...any) { r.fatal = fmt.Sprintf(format, args...) }

// binFatals checks how find fails: with env set to a missing path it names
// env; with env empty (and nothing else found) it names `make test` and
// script. It leaves env empty.
func binFatals(t *testing.T, env, missing, script string, find func(testing.TB)) {
	t.Helper()
	t.Setenv(env, missing)
	r := &recTB{TB: t}
	find(r)
	if !strings.Contains(r.fatal, env) {
		t.Errorf("missing $%s: fatal = %q", env, r.fatal)
	}
	t.Setenv(env, "")
	r = &recTB{TB: t}
	find(r)
	if !strings.Contains(r.fatal, "make test") || !strings.Contains(r.fatal, script) {
		t.Errorf("no binary: fatal = %q, want it to name make test and %s", r.fatal, script)
	}
}

func TestConsulBin(t *testing.T) {
	// Not parallel: it sets environment variables.
	cache := t.TempDir()
	cached := filepath.Join(cache, "hastate", "bin", "consul-"+consulVersion)
	t.Setenv("PATH", t.TempDir()) // no consul on PATH
	t.Setenv("HASTATE_CACHE", "")
	t.Setenv("XDG_CACHE_HOME", cache)

	binFatals(t, "CONSUL_BIN", filepath.Join(cache, "missing"), "scripts/ensure-consul.sh", func(tb testing.TB) { ConsulBin(tb) })

	if err := os.MkdirAll(filepath.Dir(cached), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cached, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got := ConsulBin(t); got != cached {
		t.Errorf("ConsulBin = %q, want the XDG cache %q", got, cached)
	}
	t.Setenv("HASTATE_CACHE", filepath.Join(cache, "hastate"))
	t.Setenv("XDG_CACHE_HOME", "/nonexistent")
	if got := ConsulBin(t); got != cached {
		t.Errorf("ConsulBin = %q, want the HASTATE_CACHE one %q", got, cached)
	}
	t.Setenv("CONSUL_BIN", "/bin/sh")
	if got := ConsulBin(t); got != "/bin/sh" {
		t.Errorf("ConsulBin = %q, want $CONSUL_BIN", got)
	}
}

// FreePort does not hand out the same port twice in a row of calls (plain
// Listen on port 0 did, 9 times in 300), and the port can still be bound.
func TestFreePortDoesNotRepeat(t *testing.T) {
	seen := map[int]bool{}
	for range 300 {
		p := FreePort(t)
		if seen[p] {
			t.Fatalf("port %d handed out twice", p)
		}
		seen[p] = true
	}
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(FreePort(t))))
	if err != nil {
		t.Fatalf("a server cannot bind the port FreePort returned: %v", err)
	}
	ln.Close()
}

// Consistently passes while cond holds for the whole time, and fails at
// the first error (issue 27.19).
func TestConsistently(t *testing.T) {
	calls := 0
	start := time.Now()
	Consistently(t, 120*time.Millisecond, func() error { calls++; return nil })
	if took := time.Since(start); took < 120*time.Millisecond || calls < 2 {
		t.Errorf("held for %s with %d checks, want at least 120ms and 2 checks", took, calls)
	}
	ft := &fatalT{TB: t}
	func() {
		defer func() { _ = recover() }()
		n := 0
		Consistently(ft, time.Second, func() error {
			if n++; n == 3 {
				return Expect(false, "third check")
			}
			return nil
		})
	}()
	if !strings.Contains(ft.msg, "third check") {
		t.Errorf("failure %q, want the third check's error", ft.msg)
	}
}

// fatalT records a Fatalf and stops the check (by panic) as t.Fatal would.
type fatalT struct {
	testing.TB
	msg string
}

func (f *fatalT) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	panic("fatal")
}
func (f *fatalT) Helper() {}

func TestHAProxy3Bin(t *testing.T) {
	// Not parallel: it sets environment variables.
	cache := filepath.Join(t.TempDir(), "hastate")
	t.Setenv("HASTATE_CACHE", cache)

	binFatals(t, "HAPROXY3_BIN", filepath.Join(cache, "missing"), "scripts/ensure-haproxy3.sh", func(tb testing.TB) { HAProxy3Bin(tb) })

	// The newest 3.0.<n> by number (3.0.11 after 3.0.9), nothing else.
	bin := filepath.Join(cache, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"haproxy-3.0.9", "haproxy-3.0.11", "haproxy-3.0.11.tmp", "haproxy-3.1.2", ".haproxy-3.0.lock"} {
		if err := os.WriteFile(filepath.Join(bin, name), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := HAProxy3Bin(t), filepath.Join(bin, "haproxy-3.0.11"); got != want {
		t.Errorf("HAProxy3Bin = %q, want the newest cached build %q", got, want)
	}
	t.Setenv("HAPROXY3_BIN", "/bin/sh")
	if got := HAProxy3Bin(t); got != "/bin/sh" {
		t.Errorf("HAProxy3Bin = %q, want $HAPROXY3_BIN", got)
	}
}
