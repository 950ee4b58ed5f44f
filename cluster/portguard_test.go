package cluster

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/hastate/hastate/cluster/raftport"
	"github.com/hastate/hastate/internal/testenv"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

func rejected(n *testNode, reason string) int {
	return int(testutil.ToFloat64(n.metrics.port.Rejected.WithLabelValues(reason)))
}

// dialFrom opens a TCP connection to addr from the loopback address src.
func dialFrom(t *testing.T, src, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 2 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial %s from %s: %v", addr, src, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closedWithin reports whether the server closed c (EOF or reset, nothing
// read) before the deadline.
func closedWithin(c net.Conn, deadline time.Time) bool {
	_ = c.SetReadDeadline(deadline)
	n, err := c.Read(make([]byte, 1))
	var ne net.Error
	return n == 0 && err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

// 300 idle connections from one address take the per-address cap, the rest
// are closed at once, and the cluster elects, applies and answers status
// all the same; the idle ones are closed after the identify deadline. The
// three nodes' own connections all come from 127.0.0.1 and are never
// refused.
func TestRaftPortIdleFloodDoesNotStopTheCluster(t *testing.T) {
	core, logs := observer.New(zapcore.WarnLevel)
	nodes := startCluster(t, func(i int, o *Options) {
		if i == 0 {
			o.Logger = zap.New(core)
		}
	})
	n0 := nodes[0]
	const flood, attacker = 300, "127.0.0.2"
	start := time.Now()
	conns := make([]net.Conn, flood)
	for i := range conns {
		conns[i] = dialFrom(t, attacker, n0.opts.BindAddr)
	}
	testenv.Eventually(t, 5*time.Second, func() error {
		return testenv.Expect(rejected(n0, "per_ip_cap") == flood-raftport.DefaultMaxConnsPerIP, "per-address rejections %d, want %d", rejected(n0, "per_ip_cap"), flood-raftport.DefaultMaxConnsPerIP)
	})
	if got := n0.stream.OpenFrom(attacker); got != raftport.DefaultMaxConnsPerIP {
		t.Fatalf("%d connections held from %s, want the cap %d", got, attacker, raftport.DefaultMaxConnsPerIP)
	}

	// The cluster works while the attacker holds its share. Meanwhile the
	// most connections the members hold on any node from their own address
	// is sampled.
	peak := make(chan int)
	stopSampling := make(chan struct{})
	go func() {
		most := 0
		for {
			for _, n := range nodes {
				most = max(most, n.stream.OpenFrom("127.0.0.1"))
			}
			select {
			case <-stopSampling:
				peak <- most
				return
			case <-time.After(2 * time.Millisecond):
			}
		}
	}()
	testenv.Eventually(t, 10*time.Second, func() error { return testenv.Expect(leaderOf(nodes) != nil, "no leader during the flood") })
	applyOnLeader(t, nodes, 1, map[string]string{"state/web/a": "drain"})
	for _, n := range nodes {
		testenv.Eventually(t, 5*time.Second, func() error {
			return testenv.Expect(n.Snapshot() != nil && answer(n.Node, "web/a") == "drain\n", "%s did not apply during the flood", n.opts.ID)
		})
		if got := n.PeerStatuses(time.Second); len(got) != 3 {
			t.Errorf("%s got statuses from %d members during the flood, want 3", n.opts.ID, len(got))
		}
	}
	close(stopSampling)
	most := <-peak
	if most > raftport.DefaultMaxConnsPerIP/2 {
		t.Errorf("the members held up to %d connections on one node from their address, too close to the cap %d", most, raftport.DefaultMaxConnsPerIP)
	}
	if held := n0.stream.OpenFrom(attacker); held != raftport.DefaultMaxConnsPerIP {
		t.Errorf("the idle connections were gone (%d left) before the cluster checks ended (%s after the flood): they proved nothing", held, time.Since(start))
	}
	t.Logf("cluster elected, applied and answered status %s after the flood; the two other members held at most %d connections on one node",
		time.Since(start).Round(time.Millisecond), most)

	// Every connection is closed by the server: the rejected ones at once,
	// the idle ones at the identify deadline.
	for i, c := range conns {
		if !closedWithin(c, start.Add(raftport.DefaultIdentifyTimeout+3*time.Second)) {
			t.Fatalf("idle connection %d still open %s after it was opened", i, time.Since(start))
		}
	}
	if took := time.Since(start); took < raftport.DefaultIdentifyTimeout {
		t.Errorf("idle connections closed after %s, before the identify deadline %s", took, raftport.DefaultIdentifyTimeout)
	}
	testenv.Eventually(t, 2*time.Second, func() error {
		return testenv.Expect(rejected(n0, "identify") == raftport.DefaultMaxConnsPerIP, "identify rejections %d, want %d", rejected(n0, "identify"), raftport.DefaultMaxConnsPerIP)
	})
	if got := n0.stream.OpenFrom(attacker); got != 0 {
		t.Errorf("%d connections from %s still counted after they were closed", got, attacker)
	}

	for _, n := range nodes {
		for _, r := range []string{"per_ip_cap", "total_cap", "tls", "identify", "unknown_kind"} {
			want := 0
			if n == n0 && r == "per_ip_cap" {
				want = flood - raftport.DefaultMaxConnsPerIP
			} else if n == n0 && r == "identify" {
				want = raftport.DefaultMaxConnsPerIP
			}
			if got := rejected(n, r); got != want {
				t.Errorf("%s: rejected{reason=%q} = %d, want %d (a peer was refused?)", n.opts.ID, r, got, want)
			}
		}
		if got := testutil.ToFloat64(n.metrics.port.TLSEnabled); got != 0 {
			t.Errorf("%s: hastate_raft_tls_enabled = %v without TLS", n.opts.ID, got)
		}
	}

	if got := logs.FilterMessageSnippet("without TLS").Len(); got != 1 {
		t.Errorf("%d warnings about running without TLS, want 1", got)
	}
	if !strings.Contains(logs.FilterMessageSnippet("without TLS").All()[0].Message, "--raft-tls-cert") {
		t.Error("the no-TLS warning does not say which flags turn TLS on")
	}
	perIP := logs.FilterField(zap.String("reason", "per_ip_cap")).All()
	if len(perIP) == 0 || len(perIP) > 5 {
		t.Errorf("%d per-address rejection warnings for %d rejections, want a rate-limited few", len(perIP), flood-raftport.DefaultMaxConnsPerIP)
	}
}

// The caps free their places when connections close, the total cap holds
// across addresses, and an unknown first byte is refused.
func TestRaftPortCaps(t *testing.T) {
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	n := startNode(t, Options{ID: "n1", BindAddr: addr, Advertise: addr, DataDir: t.TempDir(),
		PortLimits: raftport.Limits{MaxConnsPerIP: 2, MaxConns: 3, IdentifyTimeout: time.Minute}})
	a1, a2 := dialFrom(t, "127.0.0.2", addr), dialFrom(t, "127.0.0.2", addr)
	over := dialFrom(t, "127.0.0.2", addr)
	if !closedWithin(over, time.Now().Add(2*time.Second)) {
		t.Fatal("a connection over the per-address cap was not closed at once")
	}
	dialFrom(t, "127.0.0.3", addr)
	testenv.Eventually(t, 2*time.Second, func() error {
		return testenv.Expect(testutil.ToFloat64(n.metrics.port.Open) == 3, "open gauge %v, want 3", testutil.ToFloat64(n.metrics.port.Open))
	})
	if c := dialFrom(t, "127.0.0.4", addr); !closedWithin(c, time.Now().Add(2*time.Second)) {
		t.Fatal("a connection over the total cap was not closed at once")
	}

	// A closed connection frees its place; a stranger's first byte is refused.
	a1.Close()
	testenv.Eventually(t, 2*time.Second, func() error {
		return testenv.Expect(n.stream.OpenFrom("127.0.0.2") == 1, "a closed connection kept its place")
	})
	if _, err := a2.Write([]byte{'X'}); err != nil {
		t.Fatal(err)
	}
	if !closedWithin(a2, time.Now().Add(2*time.Second)) {
		t.Fatal("a connection of unknown kind was not closed")
	}
	testenv.Eventually(t, 2*time.Second, func() error { return testenv.Expect(rejected(n, "unknown_kind") == 1, "unknown kind not counted") })
	if c := dialFrom(t, "127.0.0.2", addr); closedWithin(c, time.Now().Add(200*time.Millisecond)) {
		t.Fatal("a connection within the caps was closed")
	}
	if got := [2]int{rejected(n, "per_ip_cap"), rejected(n, "total_cap")}; got != [2]int{1, 1} {
		t.Errorf("rejected per_ip_cap, total_cap = %v, want [1 1]", got)
	}

	for _, bad := range []Options{{PortLimits: raftport.Limits{MaxConnsPerIP: -1}}, {PortLimits: raftport.Limits{MaxConns: -1}}, {PortLimits: raftport.Limits{IdentifyTimeout: -1}}, {TLS: &tls.Config{}}} {
		bad.ID, bad.BindAddr, bad.Advertise, bad.DataDir = "x", "127.0.0.1:0", "127.0.0.1:1", t.TempDir()
		if _, err := New(bad); err == nil {
			t.Errorf("New accepted %+v", bad)
		}
	}
}

// dialStream is a raft.StreamLayer that only dials, with dial: a raft
// client for sending RPCs as a stranger would.
type dialStream struct {
	dial func() (net.Conn, error)
	once sync.Once
	done chan struct{}
}

func (d *dialStream) Accept() (net.Conn, error) { <-d.done; return nil, net.ErrClosed }
func (d *dialStream) Close() error              { d.once.Do(func() { close(d.done) }); return nil }
func (d *dialStream) Addr() net.Addr            { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 9), Port: 1} }
func (d *dialStream) Dial(raft.ServerAddress, time.Duration) (net.Conn, error) {
	return d.dial()
}

// With mutual TLS, a plain TCP client, a TLS client without a certificate
// and one with a certificate from another CA get no status, no query answer
// and no raft RPC through, and every attempt is counted.
func TestRaftPortRefusesStrangersWithTLS(t *testing.T) {
	cert, key, ca := writeCerts(t, t.TempDir())
	conf, err := raftport.MutualTLS(cert, key, ca)
	if err != nil {
		t.Fatal(err)
	}
	const secret = "pollers-only-for-members"
	nodes := startCluster(t, func(_ int, o *Options) {
		o.TLS = conf
		// Short, because a plain TCP client's one status byte leaves the
		// TLS handshake waiting for a record header until this deadline;
		// not shorter, because a member's own handshake on a loaded
		// machine (-race, two cores) took over 1s and was refused.
		o.PortLimits.IdentifyTimeout = 2 * time.Second
		o.PeerQueries = map[string]func() any{"pollers": func() any { return secret }}
	})
	testenv.Eventually(t, 10*time.Second, func() error { return testenv.Expect(leaderOf(nodes) != nil, "no leader over TLS") })
	n0, addr := nodes[0], nodes[0].opts.BindAddr
	if raw, err := nodes[1].stream.Query(addr, "pollers", 2*time.Second); err != nil || !bytes.Contains(raw, []byte(secret)) {
		t.Fatalf("a member's query: %s, %v", raw, err)
	}

	other, otherKey, _ := writeCerts(t, t.TempDir())
	foreign, err := tls.LoadX509KeyPair(other, otherKey)
	if err != nil {
		t.Fatal(err)
	}
	strangers := []struct {
		name string
		dial func() (net.Conn, error)
	}{
		{"plain TCP", func() (net.Conn, error) { return net.DialTimeout("tcp", addr, 2*time.Second) }},
		{"TLS without a client certificate", func() (net.Conn, error) {
			return tls.DialWithDialer(&net.Dialer{Timeout: 2 * time.Second}, "tcp", addr, &tls.Config{InsecureSkipVerify: true})
		}},
		{"TLS with a certificate from another CA", func() (net.Conn, error) {
			return tls.DialWithDialer(&net.Dialer{Timeout: 2 * time.Second}, "tcp", addr,
				&tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{foreign}})
		}},
	}
	// exchange sends kind and req, and returns what came back before the
	// server closed (or 3s).
	exchange := func(dial func() (net.Conn, error), req []byte) []byte {
		c, err := dial()
		if err != nil {
			return nil
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := c.Write(req); err != nil {
			return nil
		}
		got, _ := io.ReadAll(c)
		return got
	}
	// counted runs one stranger's attempt and waits until n0 counted a TLS
	// rejection for it. The counter is compared with its value just before
	// the attempt, not with a total: a member's own connection that loses
	// its handshake to the identify deadline on a loaded machine (and is
	// dialed again) is counted too, and must not fail this check.
	counted := func(what string, attempt func()) {
		t.Helper()
		before := rejected(n0, "tls")
		attempt()
		testenv.Eventually(t, 5*time.Second, func() error {
			return testenv.Expect(rejected(n0, "tls") > before, "%s: not counted (rejected{reason=tls} stayed %d)", what, before)
		})
	}
	for _, s := range strangers {
		counted(s.name+" status", func() {
			if got := exchange(s.dial, []byte{raftport.KindStatus}); json.Valid(got) || bytes.Contains(got, []byte(`"n0"`)) {
				t.Errorf("%s: status answered: %q", s.name, got)
			}
		})
		counted(s.name+" named query", func() {
			if got := exchange(s.dial, append([]byte{raftport.KindQuery}, "pollers\n"...)); bytes.Contains(got, []byte(secret)) {
				t.Errorf("%s: named query answered: %q", s.name, got)
			}
		})

		// A raft RPC with a higher term would make n0 adopt that term.
		term := n0.raft.CurrentTerm()
		var err error
		counted(s.name+" raft RPC", func() {
			ds := &dialStream{done: make(chan struct{}), dial: func() (net.Conn, error) {
				c, err := s.dial()
				if err == nil {
					_, err = c.Write([]byte{raftport.KindRaft})
				}
				return c, err
			}}
			tr := raft.NewNetworkTransport(ds, 1, 2*time.Second, io.Discard)
			var resp raft.AppendEntriesResponse
			err = tr.AppendEntries("n0", raft.ServerAddress(addr), &raft.AppendEntriesRequest{
				RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("intruder"), Addr: []byte("127.0.0.9:1")},
				Term:      term + 100, LeaderCommitIndex: 1 << 40}, &resp)
			tr.Close()
		})
		if err == nil || n0.raft.CurrentTerm() >= term+100 {
			t.Errorf("%s: raft RPC went through (err %v, term %d -> %d)", s.name, err, term, n0.raft.CurrentTerm())
		}
	}
	if got, want := rejected(n0, "tls"), 3*len(strangers); got < want {
		t.Errorf("rejected{reason=tls} = %d, want at least %d (one per attempt)", got, want)
	}
	for _, n := range nodes {
		if got := testutil.ToFloat64(n.metrics.port.TLSEnabled); got != 1 {
			t.Errorf("%s: hastate_raft_tls_enabled = %v with TLS", n.opts.ID, got)
		}
		if n != n0 && rejected(n, "tls") != 0 {
			t.Errorf("%s refused %d TLS connections: a member was refused", n.opts.ID, rejected(n, "tls"))
		}
	}
}
