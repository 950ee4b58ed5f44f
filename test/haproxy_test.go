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
	"regexp"
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
	Release  haproxyRelease
	dir      string
	sock     string
	cfg      string           // the configuration it runs (haproxy.cfg in dir)
	proc     *testenv.Process // the process serving now (Reload replaces it)
}

// serverWeight is the weight configured on every server line, so that the
// `show stat` weight column reads as the percentage hastate answered.
const serverWeight = 100

// agentInter is the agent-inter of every server line.
const agentInter = 500 * time.Millisecond

// haproxyBin finds HAProxy: $HAPROXY_BIN, else `haproxy` on PATH, else
// /usr/sbin/haproxy (Debian bookworm's 2.6). Without one the test fails; it
// is never skipped.
func haproxyBin(t testing.TB) string {
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

// haproxyRelease is one HAProxy binary the end-to-end tests run: Debian's
// (2.6 on bookworm) or the 3.0 LTS scripts/ensure-haproxy3.sh builds.
type haproxyRelease struct {
	Series  string // "2.6", "3.0"
	Version string // "3.0.11-...": what `haproxy -v` says
	Bin     string
}

// String names the release in subtest names and logs: "haproxy-3.0".
func (r haproxyRelease) String() string { return "haproxy-" + r.Series }

// versionRE reads the version of `haproxy -v`'s first line, "HAProxy version
// 2.6.12-1+deb12u4 2026/10/17 - https://haproxy.org/" (1.x: "HA-Proxy").
var versionRE = regexp.MustCompile(`^HA-?Proxy version ((\d+\.\d+)\S*)`)

// releaseOf asks bin for its version.
func releaseOf(t testing.TB, bin string) haproxyRelease {
	t.Helper()
	out, err := exec.Command(bin, "-v").Output()
	if err != nil {
		t.Fatalf("%s -v: %v; set HAPROXY_BIN or HAPROXY3_BIN to a working HAProxy (`make test` installs Debian's and builds 3.0)", bin, err)
	}
	m := versionRE.FindStringSubmatch(string(out))
	if m == nil {
		t.Fatalf("%s -v printed no HAProxy version:\n%s", bin, out)
	}
	return haproxyRelease{Series: m[2], Version: m[1], Bin: bin}
}

// haproxyReleases returns the HAProxy releases the end-to-end tests run
// against: Debian's (haproxyBin) and the 3.0 LTS (testenv.HAProxy3Bin).
// Without either the test fails; it is never skipped.
func haproxyReleases(t testing.TB) []haproxyRelease {
	t.Helper()
	deb, lts := releaseOf(t, haproxyBin(t)), releaseOf(t, testenv.HAProxy3Bin(t))
	if lts.Series != "3.0" {
		t.Fatalf("HAPROXY3_BIN (%s) is HAProxy %s, not 3.0; unset it to use scripts/ensure-haproxy3.sh's build", lts.Bin, lts.Version)
	}
	if deb.Series == lts.Series {
		t.Fatalf("the default HAProxy (%s) is %s too: the tests compare two releases; set HAPROXY_BIN to Debian bookworm's /usr/sbin/haproxy (2.6)", deb.Bin, deb.Version)
	}
	return []haproxyRelease{deb, lts}
}

// forEachRelease runs f as one subtest per HAProxy release, named after it
// ("haproxy-2.6", "haproxy-3.0"), one after the other.
func forEachRelease(t *testing.T, f func(t *testing.T, r haproxyRelease)) {
	t.Helper()
	for _, r := range haproxyReleases(t) {
		t.Run(r.String(), func(t *testing.T) {
			t.Logf("%s: %s", r, r.Version)
			f(t, r)
		})
	}
}

// HAProxies is one HAProxy per release, all polling the same hastate: a
// fleet halfway through an HAProxy upgrade. Each check on it must hold on
// every one of them; its log lines name each one's release.
type HAProxies []*HAProxy

// StartHAProxies is StartHAProxy once per release.
func StartHAProxies(t testing.TB, agentAddr string, backends ...Backend) HAProxies {
	t.Helper()
	var f HAProxies
	for _, r := range haproxyReleases(t) {
		f = append(f, startHAProxy(t, agentAddr, nil, "", backends, hapExtras{release: r}))
	}
	return f
}

// StartHAProxiesLB is StartHAProxyLB once per release.
func StartHAProxiesLB(t testing.TB, replicas []*Hastate, backends ...Backend) HAProxies {
	t.Helper()
	var f HAProxies
	for _, r := range haproxyReleases(t) {
		f = append(f, startHAProxy(t, freeAddr(t), replicas, "", backends, hapExtras{release: r}))
	}
	return f
}

// WaitServer waits until every HAProxy shows server with status (and
// weight, when >= 0), and returns the last one's row.
func (f HAProxies) WaitServer(t testing.TB, server, status string, weight int) Row {
	t.Helper()
	var r Row
	for _, h := range f {
		r = h.WaitServer(t, server, status, weight)
	}
	return r
}

// Hold is HAProxy.Hold over every HAProxy at once.
func (f HAProxies) Hold(t testing.TB, d time.Duration, want map[string]Row) {
	t.Helper()
	var bad string
	consistently(t, d, func() bool {
		for _, h := range f {
			if bad = h.unlike(h.Stat(t), want); bad != "" {
				return false
			}
		}
		return true
	}, func() string { return bad })
}

// Expect fails the test unless ok holds for server's row on every HAProxy;
// what says what was wanted.
func (f HAProxies) Expect(t testing.TB, server, what string, ok func(Row) bool) {
	t.Helper()
	for _, h := range f {
		if r := h.Server(t, server); !ok(r) {
			t.Errorf("%s %s: %s; want %s", h.Release, server, r, what)
		}
	}
}

// StartHAProxy writes a haproxy.cfg with the backends, every server pointing
// at a TCP listener of its own on 127.0.0.1 (so its health check passes)
// and carrying an agent-check to agentAddr that sends "<backend>/<server>\n".
// It returns once `show stat` lists every server UP.
func StartHAProxy(t testing.TB, agentAddr string, backends ...Backend) *HAProxy {
	t.Helper()
	return startHAProxy(t, agentAddr, nil, "", backends, hapExtras{})
}

// StartHAProxyLB is StartHAProxy with the production layout: the agent
// checks go to one load-balancer address (a `listen` section of the same
// HAProxy) in front of every replica's agent port.
func StartHAProxyLB(t testing.TB, replicas []*Hastate, backends ...Backend) *HAProxy {
	t.Helper()
	return startHAProxy(t, freeAddr(t), replicas, "", backends, hapExtras{})
}

// StartHAProxyLBFrom is StartHAProxyLB with its agent checks reaching the
// replicas from source (e.g. 127.0.0.2), so that several HAProxy processes
// on this machine look like several HAProxy nodes to hastate.
func StartHAProxyLBFrom(t testing.TB, replicas []*Hastate, source string, backends ...Backend) *HAProxy {
	t.Helper()
	return startHAProxy(t, freeAddr(t), replicas, source, backends, hapExtras{})
}

// hapExtras change the test configuration (the Prometheus test adds the
// exporter's frontend and servers that hold sessions open; the reload tests
// a server state file and production's check intervals).
type hapExtras struct {
	release  haproxyRelease                      // zero: Debian's (haproxyBin)
	global   string                              // lines appended to the global section
	defaults string                              // lines appended to the defaults section
	sections string                              // appended to haproxy.cfg
	server   func(backend, server string) string // a server's address; nil: a tcpSink of its own
	timeout  time.Duration                       // client and server inactivity timeout; 0: 10s
	// inter and agentInter are each server's check inter and agent-inter
	// (0: 1s and agentInter); serverOpts is appended to each server line.
	inter, agentInter time.Duration
	serverOpts        string
	// listed makes the start wait only until `show stat` lists every
	// server, not until each is UP (an agent may already have set it
	// otherwise).
	listed bool
}

func startHAProxy(t testing.TB, agentAddr string, lbReplicas []*Hastate, lbSource string, backends []Backend, x hapExtras) *HAProxy {
	t.Helper()
	agentHost, agentPort, err := net.SplitHostPort(agentAddr)
	if err != nil {
		t.Fatalf("agent address %q: %v", agentAddr, err)
	}
	h := newHAProxy(t, x.release)
	var cfg strings.Builder
	cfg.WriteString(h.global(x.timeout, x.global, x.defaults))
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
			fmt.Fprintf(&cfg, "    server %s %s weight %d check inter %dms agent-check agent-addr %s agent-port %s agent-inter %dms agent-send \"%s/%s\\n\"%s\n",
				s, addr, serverWeight, cmp.Or(x.inter, time.Second).Milliseconds(), agentHost, agentPort,
				cmp.Or(x.agentInter, agentInter).Milliseconds(), b.Name, s, x.serverOpts)
		}
	}
	cfg.WriteString(x.sections)
	h.run(t, cfg.String(), func(st map[string]Row) string {
		for _, b := range backends {
			for _, s := range b.Servers {
				if r, ok := st[b.Name+"/"+s]; !ok || (r.Status != "UP" && !x.listed) {
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
func StartAgentLB(t testing.TB, replicas []*Hastate, o LBOptions) *HAProxy {
	t.Helper()
	h := newHAProxy(t, haproxyRelease{})
	var cfg strings.Builder
	cfg.WriteString(h.global(0, "", ""))
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
func StartConsulProxy404(t testing.TB, upstream, path string) *HAProxy {
	t.Helper()
	h := newHAProxy(t, haproxyRelease{})
	var cfg strings.Builder
	// Blocking queries wait up to --kv-wait (10s): the timeouts are above it.
	cfg.WriteString(h.global(30*time.Second, "", ""))
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
// address; rel is the release to run (zero: Debian's).
func newHAProxy(t testing.TB, rel haproxyRelease) *HAProxy {
	t.Helper()
	if rel.Bin == "" {
		rel = releaseOf(t, haproxyBin(t))
	}
	// A unix socket path must fit in 108 bytes; t.TempDir() paths can be
	// long, so keep the socket in a short directory of its own.
	dir, err := os.MkdirTemp("", "hap-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return &HAProxy{
		Frontend: freeAddr(t),
		Release:  rel,
		dir:      dir,
		sock:     filepath.Join(dir, "admin.sock"),
		proc:     &testenv.Process{Bin: rel.Bin, LogPath: filepath.Join(dir, "haproxy.log")},
	}
}

// global is the global and defaults sections of every test HAProxy;
// timeout is the client and server inactivity timeout (0: 10s); global and
// defaults are appended to their sections. The admin socket hands its
// listeners to the next process on a reload (expose-fd listeners).
func (h *HAProxy) global(timeout time.Duration, global, defaults string) string {
	return fmt.Sprintf(`global
    stats socket %[1]s mode 600 level admin expose-fd listeners
    nbthread 1
    log stderr format short local0 info
%[3]s
defaults
    mode tcp
    log global
    timeout connect 2s
    timeout client %[2]dms
    timeout server %[2]dms
    timeout check 2s
%[4]s`, h.sock, cmp.Or(timeout, 10*time.Second).Milliseconds(), global, defaults)
}

// run checks and starts the configuration and waits until notReady (given
// `show stat`) returns "".
func (h *HAProxy) run(t testing.TB, cfg string, notReady func(map[string]Row) string) {
	t.Helper()
	h.cfg = cfg
	cfgPath := filepath.Join(h.dir, "haproxy.cfg")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(h.proc.Bin, "-c", "-f", cfgPath).CombinedOutput(); err != nil {
		t.Fatalf("%s -c rejected the test configuration: %v\n%s\n%s", h.Release, err, out, cfg)
	}
	h.proc.Start(t, "-db", "-f", cfgPath)
	t.Cleanup(func() {
		h.proc.Kill() // the one serving now: Reload waits for the one before to exit
		if t.Failed() {
			b, _ := os.ReadFile(h.proc.LogPath)
			t.Logf("%s haproxy.cfg:\n%s\nhaproxy log (%s):\n%s", h.Release, h.cfg, h.proc.LogPath, b)
		}
	})
	var last string
	testenv.Eventually(t, 15*time.Second, func() error {
		if h.proc.Exited() {
			t.Fatalf("%s exited at start", h.Release)
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
func tcpSink(t testing.TB) string {
	t.Helper()
	return startSink(t).Addr()
}

// sink is a backend server on 127.0.0.1 that accepts every connection and
// closes it once it has read a byte or the peer closed: a health check
// passes, and a client connection that sends something (loadClient's) is
// noted with the time it was accepted. Down closes its listener (HAProxy's
// health checks of it fail) and Up listens again on the same address. It
// is closed when the test ends.
type sink struct {
	addr    string
	wg      sync.WaitGroup // the accept loops
	mu      sync.Mutex
	ln      net.Listener // nil while down
	accepts []time.Time
}

func startSink(t testing.TB) *sink {
	t.Helper()
	s := &sink{addr: "127.0.0.1:0"}
	s.Up(t)
	t.Cleanup(s.down)
	return s
}

// Addr is the sink's host:port.
func (s *sink) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

// Up listens (again) on the sink's address.
func (s *sink) Up(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln != nil {
		return
	}
	ln, err := net.Listen("tcp", s.addr)
	if err != nil {
		t.Fatalf("sink: listen on %s: %v", s.addr, err)
	}
	s.ln, s.addr = ln, ln.Addr().String()
	s.wg.Add(1)
	go func() { // owned by s: down closes ln and waits
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			now := time.Now()
			// A health check connects and closes: Read returns EOF at
			// once. The deadline bounds a peer that does neither.
			_ = c.SetReadDeadline(now.Add(2 * time.Second))
			n, _ := c.Read(make([]byte, 1))
			c.Close()
			if n > 0 {
				s.mu.Lock()
				s.accepts = append(s.accepts, now)
				s.mu.Unlock()
			}
		}
	}()
}

// Down closes the listener: connections to the sink are refused.
func (s *sink) Down(t testing.TB) {
	t.Helper()
	s.down()
}

func (s *sink) down() {
	s.mu.Lock()
	ln := s.ln
	s.ln = nil
	s.mu.Unlock()
	if ln != nil {
		ln.Close()
	}
	s.wg.Wait()
}

// AcceptedSince returns when the sink accepted each client connection
// (one that sent data) from since on.
func (s *sink) AcceptedSince(since time.Time) []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []time.Time
	for _, a := range s.accepts {
		if !a.Before(since) {
			out = append(out, a)
		}
	}
	return out
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
func (h *HAProxy) Stat(t testing.TB) map[string]Row {
	t.Helper()
	st, err := h.stat()
	if err != nil {
		t.Fatalf("haproxy show stat: %v", err)
	}
	return st
}

// Server returns the `show stat` row of one "backend/server".
func (h *HAProxy) Server(t testing.TB, name string) Row {
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
func (h *HAProxy) WaitServer(t testing.TB, server, status string, weight int) Row {
	t.Helper()
	var last Row
	start := time.Now()
	testenv.Eventually(t, 15*time.Second, func() error {
		last = h.Server(t, server)
		return testenv.Expect(last.Status == status && (weight < 0 || last.Weight == weight), "%s %s: %s; want status=%q weight=%d", h.Release, server, last, status, weight)
	})
	t.Logf("%s %s: %s (after %s)", h.Release, server, last, time.Since(start).Round(time.Millisecond))
	return last
}

// Hold checks `show stat` every 50ms for d and fails the test as soon as a
// server in want shows another status, or another weight when the wanted
// Weight is not -1.
func (h *HAProxy) Hold(t testing.TB, d time.Duration, want map[string]Row) {
	t.Helper()
	HAProxies{h}.Hold(t, d, want)
}

// unlike says how st differs from want (see Hold), or "".
func (h *HAProxy) unlike(st map[string]Row, want map[string]Row) string {
	for s, w := range want {
		r := st[s]
		if r.Status != w.Status || (w.Weight >= 0 && r.Weight != w.Weight) {
			return fmt.Sprintf("%s %s: %s; want status=%q weight=%d", h.Release, s, r, w.Status, w.Weight)
		}
	}
	return ""
}

// Signal sends sig to HAProxy (SIGSTOP freezes it: its agent checks stop).
func (h *HAProxy) Signal(t testing.TB, sig os.Signal) { h.proc.Signal(t, sig) }

// Stop kills HAProxy and waits for it to exit.
func (h *HAProxy) Stop(t testing.TB) {
	t.Helper()
	h.proc.Kill()
}

// Reload reloads HAProxy as a service manager does without HAProxy's master
// process: a new process takes the listeners over from the old one through
// the admin socket (-x) and tells it to finish (-sf <pid>); the old one
// stops accepting and exits once its connections have closed. It returns
// when it started the new process, after the old one has exited.
func (h *HAProxy) Reload(t testing.TB) time.Time {
	t.Helper()
	old := h.proc
	next := &testenv.Process{Bin: old.Bin, LogPath: old.LogPath}
	started := time.Now()
	next.Start(t, "-db", "-f", filepath.Join(h.dir, "haproxy.cfg"), "-x", h.sock, "-sf", strconv.Itoa(old.Pid()))
	h.proc = next    // what run's cleanup kills
	defer old.Kill() // reaps it (and stops it when the reload failed)
	testenv.Eventually(t, 15*time.Second, func() error {
		if next.Exited() {
			t.Fatalf("%s: the new process exited during the reload (see its log below)", h.Release)
		}
		return testenv.Expect(old.Exited(), "%s: the old process did not exit after the reload (-sf)", h.Release)
	})
	return started
}

// SaveServerState writes `show servers state` to path: what a reload
// script does before the reload when the configuration has
// `server-state-file` and `load-server-state-from-file`.
func (h *HAProxy) SaveServerState(t testing.TB, path string) {
	t.Helper()
	out, err := h.command("show servers state")
	if err != nil {
		t.Fatalf("%s show servers state: %v", h.Release, err)
	}
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
}
