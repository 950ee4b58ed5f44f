package test

import (
	"bytes"
	"cmp"
	"encoding/csv"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hastate/hastate/internal/testenv"
)

// Backend is one HAProxy backend of the test configuration.
type Backend struct {
	Name    string
	Servers []string
}

// HAProxy is a real HAProxy process run in the foreground by a test, with
// an admin stats socket and servers whose agent-check points at a hastate.
type HAProxy struct {
	Frontend string // host:port of the frontend
	dir      string
	sock     string
	proc     testenv.Process
}

// serverWeight is the weight configured on every server line, so that the
// `show stat` weight column reads as the percentage hastate answered.
const serverWeight = 100

// agentInter is the agent-inter of every server line.
const agentInter = 500 * time.Millisecond

// haproxyBin finds HAProxy: $HAPROXY_BIN, else `haproxy` on PATH, else
// /usr/sbin/haproxy. Without one the test fails; it is never skipped.
func haproxyBin(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("HAPROXY_BIN"); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("HAPROXY_BIN=%s: %v; unset it, run `make test` (it installs HAProxy) or `apt-get install haproxy`", p, err)
		}
		return p
	}
	if p, err := exec.LookPath("haproxy"); err == nil {
		return p
	}
	const deb = "/usr/sbin/haproxy"
	if _, err := os.Stat(deb); err == nil {
		return deb
	}
	t.Fatalf("no HAProxy: HAPROXY_BIN is unset, `haproxy` is not on PATH and %s does not exist; "+
		"run `make test` (it installs HAProxy) or `apt-get install haproxy`", deb)
	return ""
}

// StartHAProxy writes a haproxy.cfg with the backends, every server pointing
// at a TCP listener of its own on 127.0.0.1 (so its health check passes)
// and carrying an agent-check to agentAddr that sends "<backend>/<server>\n".
// It returns once `show stat` lists every server UP.
func StartHAProxy(t *testing.T, agentAddr string, backends ...Backend) *HAProxy {
	t.Helper()
	return startHAProxy(t, agentAddr, nil, "", backends, hapExtras{})
}

// StartHAProxyLB is StartHAProxy with the production layout: the agent
// checks go to one load-balancer address (a `listen` section of the same
// HAProxy) in front of every replica's agent port.
func StartHAProxyLB(t *testing.T, replicas []*Hastate, backends ...Backend) *HAProxy {
	t.Helper()
	return startHAProxy(t, freeAddr(t), replicas, "", backends, hapExtras{})
}

// StartHAProxyLBFrom is StartHAProxyLB with its agent checks reaching the
// replicas from source (e.g. 127.0.0.2), so that several HAProxy processes
// on this machine look like several HAProxy nodes to hastate.
func StartHAProxyLBFrom(t *testing.T, replicas []*Hastate, source string, backends ...Backend) *HAProxy {
	t.Helper()
	return startHAProxy(t, freeAddr(t), replicas, source, backends, hapExtras{})
}

// hapExtras change the test configuration (the Prometheus test adds the
// exporter's frontend and servers that hold sessions open).
type hapExtras struct {
	sections string                              // appended to haproxy.cfg
	server   func(backend, server string) string // a server's address; nil: a tcpSink of its own
	timeout  time.Duration                       // client and server inactivity timeout; 0: 10s
}

func startHAProxy(t *testing.T, agentAddr string, lbReplicas []*Hastate, lbSource string, backends []Backend, x hapExtras) *HAProxy {
	t.Helper()
	agentHost, agentPort, err := net.SplitHostPort(agentAddr)
	if err != nil {
		t.Fatalf("agent address %q: %v", agentAddr, err)
	}
	h := newHAProxy(t)
	var cfg strings.Builder
	cfg.WriteString(h.global(x.timeout))
	fmt.Fprintf(&cfg, `
frontend fe
    bind %s
    default_backend %s
`, h.Frontend, backends[0].Name)
	if len(lbReplicas) > 0 {
		// The "internal load balancer" of the replicas' agent ports. Its
		// health check asks each replica's /-/readiness, as a cloud load
		// balancer would; a dead replica leaves the rotation after one
		// failed check.
		writeAgentLB(&cfg, agentAddr, lbReplicas, LBOptions{Inter: 200 * time.Millisecond, Fall: 1, Rise: 2, Source: lbSource})
	}
	for _, b := range backends {
		fmt.Fprintf(&cfg, "\nbackend %s\n    balance roundrobin\n", b.Name)
		for _, s := range b.Servers {
			addr := ""
			if x.server != nil {
				addr = x.server(b.Name, s)
			} else {
				addr = tcpSink(t)
			}
			fmt.Fprintf(&cfg, "    server %s %s weight %d check inter 1s agent-check agent-addr %s agent-port %s agent-inter %s agent-send \"%s/%s\\n\"\n",
				s, addr, serverWeight, agentHost, agentPort, agentInter, b.Name, s)
		}
	}
	cfg.WriteString(x.sections)
	h.run(t, cfg.String(), func(st map[string]Row) string {
		for _, b := range backends {
			for _, s := range b.Servers {
				if r, ok := st[b.Name+"/"+s]; !ok || r.Status != "UP" {
					return fmt.Sprintf("%s/%s: %+v", b.Name, s, r)
				}
			}
		}
		return ""
	})
	return h
}

// LBOptions shape the agent load balancer's health check of the replicas'
// /-/readiness.
type LBOptions struct {
	Inter      time.Duration // check interval
	Fall, Rise int
	Source     string // source address of the checks and the forwarded connections ("": any)
	// Addrs, when set, gives replica i's agent and HTTP addresses as the
	// load balancer reaches them (e.g. through fault links on 127.0.0.1;
	// the health check goes to the HTTP address's port on the agent
	// address's host). Nil: the replica's own.
	Addrs func(i int) (agent, http string)
}

// writeAgentLB writes the `listen` section of the load balancer in front of
// the replicas' agent ports (TCP mode, roundrobin), health-checking each
// replica's /-/readiness on its HTTP port, as the internal load balancer of
// production does.
func writeAgentLB(cfg *strings.Builder, addr string, replicas []*Hastate, o LBOptions) {
	fmt.Fprintf(cfg, "\nlisten %s\n    bind %s\n    mode tcp\n    balance roundrobin\n    option httpchk GET /-/readiness\n", agentLBName, addr)
	for i, r := range replicas {
		agent, httpAddr := r.AgentAddr, r.HTTPAddr
		if o.Addrs != nil {
			agent, httpAddr = o.Addrs(i)
		}
		_, httpPort, _ := net.SplitHostPort(httpAddr)
		src := ""
		if o.Source != "" {
			src = " source " + o.Source
		}
		fmt.Fprintf(cfg, "    server %s %s check port %s inter %dms fall %d rise %d%s\n", lbServerName(i), agent, httpPort, o.Inter.Milliseconds(), o.Fall, o.Rise, src)
	}
}

// agentLBName is the proxy name of the agent load balancer; lbServerName
// the name of replica i (0-based) in it.
const agentLBName = "agent_lb"

func lbServerName(i int) string { return fmt.Sprintf("replica%d", i+1) }

// StartAgentLB starts an HAProxy that is only the agent load balancer of
// the replicas, on its own address (Frontend), and returns once every
// replica is UP in it. Its `show stat` rows are "agent_lb/replicaN".
func StartAgentLB(t *testing.T, replicas []*Hastate, o LBOptions) *HAProxy {
	t.Helper()
	h := newHAProxy(t)
	var cfg strings.Builder
	cfg.WriteString(h.global(0))
	writeAgentLB(&cfg, h.Frontend, replicas, o)
	h.run(t, cfg.String(), func(st map[string]Row) string {
		for i := range replicas {
			if r := st[agentLBName+"/"+lbServerName(i)]; r.Status != "UP" {
				return fmt.Sprintf("%s: %+v", lbServerName(i), r)
			}
		}
		return ""
	})
	return h
}

// StartConsulProxy404 starts a real HAProxy in HTTP mode in front of the
// Consul at upstream that answers 404 with no Consul headers to every
// request whose path begins with path (a load balancer or ingress without
// that route) and passes everything else to Consul: what a replica whose
// --consul-addr points at such a proxy reads. Its Frontend is the address
// to give the replica.
func StartConsulProxy404(t *testing.T, upstream, path string) *HAProxy {
	t.Helper()
	h := newHAProxy(t)
	var cfg strings.Builder
	// Blocking queries wait up to --kv-wait (10s): the timeouts are above it.
	cfg.WriteString(h.global(30 * time.Second))
	fmt.Fprintf(&cfg, `
frontend consul_proxy
    mode http
    bind %s
    http-request return status 404 content-type text/plain string "no route" if { path_beg %s }
    default_backend consul

backend consul
    mode http
    server consul %s
`, h.Frontend, path, upstream)
	h.run(t, cfg.String(), func(map[string]Row) string { return "" })
	return h
}

// newHAProxy prepares an HAProxy's directory, admin socket and frontend
// address.
func newHAProxy(t *testing.T) *HAProxy {
	t.Helper()
	bin := haproxyBin(t)
	// A unix socket path must fit in 108 bytes; t.TempDir() paths can be
	// long, so keep the socket in a short directory of its own.
	dir, err := os.MkdirTemp("", "hap-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return &HAProxy{
		Frontend: freeAddr(t),
		dir:      dir,
		sock:     filepath.Join(dir, "admin.sock"),
		proc:     testenv.Process{Bin: bin, LogPath: filepath.Join(dir, "haproxy.log")},
	}
}

// global is the global and defaults sections of every test HAProxy;
// timeout is the client and server inactivity timeout (0: 10s).
func (h *HAProxy) global(timeout time.Duration) string {
	return fmt.Sprintf(`global
    stats socket %[1]s mode 600 level admin
    nbthread 1
    log stderr format short local0 info

defaults
    mode tcp
    log global
    timeout connect 2s
    timeout client %[2]dms
    timeout server %[2]dms
    timeout check 2s
`, h.sock, cmp.Or(timeout, 10*time.Second).Milliseconds())
}

// run checks and starts the configuration and waits until notReady (given
// `show stat`) returns "".
func (h *HAProxy) run(t *testing.T, cfg string, notReady func(map[string]Row) string) {
	t.Helper()
	cfgPath := filepath.Join(h.dir, "haproxy.cfg")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(h.proc.Bin, "-c", "-f", cfgPath).CombinedOutput(); err != nil {
		t.Fatalf("haproxy -c rejected the test configuration: %v\n%s\n%s", err, out, cfg)
	}
	h.proc.Start(t, "-db", "-f", cfgPath)
	t.Cleanup(func() {
		h.proc.Kill()
		if t.Failed() {
			b, _ := os.ReadFile(h.proc.LogPath)
			t.Logf("haproxy.cfg:\n%s\nhaproxy log (%s):\n%s", cfg, h.proc.LogPath, b)
		}
	})
	var last string
	testenv.Eventually(t, 15*time.Second, func() error {
		if h.proc.Exited() {
			t.Fatalf("haproxy exited at start")
		}
		st, err := h.stat()
		if err != nil {
			last = err.Error()
			return fmt.Errorf("haproxy never showed every server UP; last: %s", last)
		}
		if last = notReady(st); last != "" {
			return fmt.Errorf("haproxy never showed every server UP; last: %s", last)
		}
		return nil
	})
}

// tcpSink opens a TCP listener on 127.0.0.1 that accepts and closes every
// connection: a backend server whose health check passes. It is closed
// when the test ends.
func tcpSink(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // owned by the cleanup below
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	return ln.Addr().String()
}

// Row is one server line of `show stat`.
type Row struct {
	Status      string // e.g. UP, DRAIN (agent), MAINT
	Weight      int    // effective weight
	AgentStatus string // result of the last agent check, e.g. L7OK, L4CON
	LastAgent   string // last agent check contents (what the agent said)
	CheckStatus string
	Sessions    int // current sessions (scur)
}

func (r Row) String() string {
	return fmt.Sprintf("status=%q weight=%d agent_status=%q last_agt=%q check_status=%q",
		r.Status, r.Weight, r.AgentStatus, r.LastAgent, r.CheckStatus)
}

// Stat returns `show stat` from the admin socket as "backend/server" -> Row.
func (h *HAProxy) Stat(t *testing.T) map[string]Row {
	t.Helper()
	st, err := h.stat()
	if err != nil {
		t.Fatalf("haproxy show stat: %v", err)
	}
	return st
}

// Server returns the `show stat` row of one "backend/server".
func (h *HAProxy) Server(t *testing.T, name string) Row {
	t.Helper()
	r, ok := h.Stat(t)[name]
	if !ok {
		t.Fatalf("haproxy show stat has no server %s", name)
	}
	return r
}

func (h *HAProxy) stat() (map[string]Row, error) {
	out, err := h.command("show stat")
	if err != nil {
		return nil, err
	}
	// The header line is "# pxname,svname,...".
	out = bytes.TrimPrefix(out, []byte("# "))
	recs, err := csv.NewReader(bytes.NewReader(out)).ReadAll()
	if err != nil {
		return nil, fmt.Errorf("parse show stat CSV: %w\n%s", err, out)
	}
	if len(recs) < 1 {
		return nil, fmt.Errorf("show stat: empty answer")
	}
	col := map[string]int{}
	for i, name := range recs[0] {
		col[name] = i
	}
	for _, name := range []string{"pxname", "svname", "status", "weight", "agent_status", "last_agt", "check_status", "scur"} {
		if _, ok := col[name]; !ok {
			return nil, fmt.Errorf("show stat: no column %q in %v", name, recs[0])
		}
	}
	rows := map[string]Row{}
	for _, r := range recs[1:] {
		if len(r) != len(recs[0]) {
			continue
		}
		sv := r[col["svname"]]
		if sv == "FRONTEND" || sv == "BACKEND" {
			continue
		}
		w, _ := strconv.Atoi(r[col["weight"]])
		scur, _ := strconv.Atoi(r[col["scur"]])
		rows[r[col["pxname"]]+"/"+sv] = Row{
			Status:      r[col["status"]],
			Weight:      w,
			AgentStatus: r[col["agent_status"]],
			LastAgent:   r[col["last_agt"]],
			CheckStatus: r[col["check_status"]],
			Sessions:    scur,
		}
	}
	return rows, nil
}

// command sends one command to the admin socket and returns the answer.
func (h *HAProxy) command(cmd string) ([]byte, error) {
	c, err := net.DialTimeout("unix", h.sock, 2*time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, cmd+"\n"); err != nil {
		return nil, err
	}
	return io.ReadAll(c)
}

// WaitServer waits until `show stat` shows server (backend/server) with
// status and, when weight >= 0, that weight.
func (h *HAProxy) WaitServer(t *testing.T, server, status string, weight int) Row {
	t.Helper()
	var last Row
	start := time.Now()
	testenv.Eventually(t, 15*time.Second, func() error {
		last = h.Server(t, server)
		return testenv.Expect(last.Status == status && (weight < 0 || last.Weight == weight), "haproxy %s: %s; want status=%q weight=%d", server, last, status, weight)
	})
	t.Logf("haproxy %s: %s (after %s)", server, last, time.Since(start).Round(time.Millisecond))
	return last
}

// Hold checks `show stat` every 50ms for d and fails the test as soon as a
// server in want shows another status, or another weight when the wanted
// Weight is not -1.
func (h *HAProxy) Hold(t *testing.T, d time.Duration, want map[string]Row) {
	t.Helper()
	var bad string
	consistently(t, d, func() bool {
		st := h.Stat(t)
		for s, w := range want {
			r := st[s]
			if r.Status != w.Status || (w.Weight >= 0 && r.Weight != w.Weight) {
				bad = fmt.Sprintf("%s: %s; want status=%q weight=%d", s, r, w.Status, w.Weight)
				return false
			}
		}
		return true
	}, func() string { return "haproxy " + bad })
}

// Signal sends sig to HAProxy (SIGSTOP freezes it: its agent checks stop).
func (h *HAProxy) Signal(t *testing.T, sig os.Signal) { h.proc.Signal(t, sig) }

// Stop kills HAProxy and waits for it to exit.
func (h *HAProxy) Stop(t *testing.T) {
	t.Helper()
	h.proc.Kill()
}
