package raftport

import (
	"crypto/tls"
	"math/big"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/hastate/hastate/internal/testenv"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// leaf signs a certificate for names valid for life (testenv.CA.Leaf).
func leaf(t *testing.T, ca *testenv.CA, life time.Duration, names ...string) (certPEM, keyPEM []byte, serial *big.Int) {
	t.Helper()
	return ca.Leaf(t, names[0], time.Now().Add(life).Truncate(time.Second), names...)
}

// files are d's files as LoadRaftTLS reads them.
func files(d testenv.TLSDir, peerNames ...string) TLSFiles {
	return TLSFiles{Cert: d.Cert, Key: d.Key, CA: d.CA, PeerNames: peerNames}
}

// tlsServer accepts TLS connections with conf on 127.0.0.1 and completes
// each handshake; it returns the address.
func tlsServer(t *testing.T, conf *tls.Config) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", conf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				if c.(*tls.Conn).Handshake() == nil {
					_, _ = c.Write([]byte{1}) // served: the client reads it
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// handshake dials addr with conf and returns the server's certificate
// serial once the server served the connection.
func handshake(addr string, conf *tls.Config) (*big.Int, error) {
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, conf)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err != nil {
		return nil, err // the server refused us after the handshake
	}
	return c.ConnectionState().PeerCertificates[0].SerialNumber, nil
}

func expiry(t *testing.T, r *RaftTLS, kind string) []float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(tlsExpiry{r}); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []float64
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "kind" && l.GetValue() == kind {
					out = append(out, m.GetGauge().GetValue())
				}
			}
		}
	}
	return out
}

// A renewed certificate and key on disk are what the next handshake
// presents, on both sides, without a restart; a change that does not load
// keeps the old material, is counted and reported as failing until fixed;
// a CA bundle re-read lets a new CA in and, once the old one is dropped,
// keeps the old one's certificates out.
func TestRaftTLSReloadsChangedFiles(t *testing.T) {
	ca := testenv.NewCA(t, "raft CA 1")
	srv, cli := testenv.NewTLSDir(t), testenv.NewTLSDir(t)
	c1, k1, s1 := leaf(t, ca, 48*time.Hour, "127.0.0.1")
	srv.Write(t, c1, k1, ca.PEM)
	cc, ck, _ := leaf(t, ca, 48*time.Hour, "127.0.0.1")
	cli.Write(t, cc, ck, ca.PEM)

	r, err := LoadRaftTLS(files(srv, "127.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	client, err := LoadRaftTLS(files(cli, "127.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	addr := tlsServer(t, r.Config())
	if got, err := handshake(addr, client.Config()); err != nil || got.Cmp(s1) != 0 {
		t.Fatalf("first handshake: serial %v, %v; want %v", got, err, s1)
	}
	if changed, err := r.Reload(); changed || err != nil {
		t.Fatalf("Reload of unchanged files = %v, %v; want false, nil", changed, err)
	}
	if got := expiry(t, r, "node"); len(got) != 1 || int64(got[0]) != r.Leaf().NotAfter.Unix() {
		t.Fatalf("node expiry series %v, want one at %d", got, r.Leaf().NotAfter.Unix())
	}

	// Renewal: a new key and certificate, same CA.
	c2, k2, s2 := leaf(t, ca, 90*24*time.Hour, "127.0.0.1")
	srv.Write(t, c2, k2, nil)
	if changed, err := r.Reload(); !changed || err != nil {
		t.Fatalf("Reload after renewal = %v, %v; want true, nil", changed, err)
	}
	if got, err := handshake(addr, client.Config()); err != nil || got.Cmp(s2) != 0 {
		t.Fatalf("handshake after renewal: serial %v, %v; want the renewed %v", got, err, s2)
	}
	if got := expiry(t, r, "node"); len(got) != 1 || int64(got[0]) != r.Leaf().NotAfter.Unix() || r.Leaf().SerialNumber.Cmp(s2) != 0 {
		t.Fatalf("node expiry after renewal %v, want the renewed certificate's %d", got, r.Leaf().NotAfter.Unix())
	}
	if got := testutil.ToFloat64(r.reloads.WithLabelValues("loaded")); got != 1 {
		t.Errorf("reloads{result=loaded} = %v, want 1", got)
	}

	// A half-written renewal (new certificate, old key) does not load: the
	// renewed certificate stays in use, counted once, failing until fixed.
	c3, k3, s3 := leaf(t, ca, 90*24*time.Hour, "127.0.0.1")
	srv.Write(t, c3, nil, nil)
	if changed, err := r.Reload(); changed || err == nil || !strings.Contains(err.Error(), "key pair") {
		t.Fatalf("Reload of a mismatched pair = %v, %v; want false and a key pair error", changed, err)
	}
	if changed, err := r.Reload(); changed || err != nil {
		t.Fatalf("second Reload of the same mismatched pair = %v, %v; want no change and no new error", changed, err)
	}
	if got := testutil.ToFloat64(r.reloads.WithLabelValues("failed")); got != 1 {
		t.Errorf("reloads{result=failed} = %v, want 1 (one per distinct bad content)", got)
	}
	if got := testutil.ToFloat64(r.failG); got != 1 {
		t.Errorf("reload_failing = %v, want 1", got)
	}
	if got, err := handshake(addr, client.Config()); err != nil || got.Cmp(s2) != 0 {
		t.Fatalf("handshake with a bad pair on disk: serial %v, %v; want the last good %v", got, err, s2)
	}
	srv.Write(t, nil, k3, nil)
	if changed, err := r.Reload(); !changed || err != nil {
		t.Fatalf("Reload once the key matches = %v, %v", changed, err)
	}
	if got := testutil.ToFloat64(r.failG); got != 0 {
		t.Errorf("reload_failing = %v after a good reload, want 0", got)
	}
	if got, _ := handshake(addr, client.Config()); got.Cmp(s3) != 0 {
		t.Fatalf("handshake: serial %v, want %v", got, s3)
	}

	// CA rotation: both CAs in the bundle, then leaves of the new CA, then
	// the old CA dropped. The server trusts a client of the new CA from
	// the first step on, and refuses one of the old CA at the end.
	ca2 := testenv.NewCA(t, "raft CA 2")
	srv.Write(t, nil, nil, append(append([]byte{}, ca.PEM...), ca2.PEM...))
	if _, err := r.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := expiry(t, r, "ca"); len(got) != 2 {
		t.Errorf("ca expiry series %v, want one per CA of the bundle (2)", got)
	}
	newClient := testenv.NewTLSDir(t)
	nc, nk, _ := leaf(t, ca2, 48*time.Hour, "127.0.0.1")
	newClient.Write(t, nc, nk, append(append([]byte{}, ca.PEM...), ca2.PEM...))
	nr, err := LoadRaftTLS(files(newClient, "127.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := handshake(addr, nr.Config()); err != nil {
		t.Fatalf("a client of the new CA refused while the bundle holds both: %v", err)
	}
	c4, k4, s4 := leaf(t, ca2, 48*time.Hour, "127.0.0.1")
	srv.Write(t, c4, k4, ca2.PEM)
	if _, err := r.Reload(); err != nil {
		t.Fatal(err)
	}
	if got, err := handshake(addr, nr.Config()); err != nil || got.Cmp(s4) != 0 {
		t.Fatalf("handshake after the CA rotation: serial %v, %v; want %v", got, err, s4)
	}
	if _, err := handshake(addr, client.Config()); err == nil {
		t.Fatal("a client of the dropped CA was served after the bundle lost it")
	}
}

// Peers are pinned by name: a certificate from the very same CA for another
// name is refused on both sides of a connection, with a message naming
// what it carries and what was expected.
func TestRaftTLSPinsPeersByName(t *testing.T) {
	ca := testenv.NewCA(t, "shared issuer")
	member, stranger := testenv.NewTLSDir(t), testenv.NewTLSDir(t)
	mc, mk, _ := leaf(t, ca, time.Hour, "hastate-0.hastate.ops.svc", "127.0.0.1")
	member.Write(t, mc, mk, ca.PEM)
	sc, sk, _ := leaf(t, ca, time.Hour, "grafana-0.grafana.ops.svc", "127.0.0.1")
	stranger.Write(t, sc, sk, ca.PEM)

	pinned := []string{"*.hastate.ops.svc"}
	m, err := LoadRaftTLS(files(member, pinned...))
	if err != nil {
		t.Fatal(err)
	}
	s, err := LoadRaftTLS(files(stranger, pinned...))
	if err != nil {
		t.Fatal(err)
	}
	addr := tlsServer(t, m.Config())
	if _, err := handshake(addr, m.Config()); err != nil {
		t.Fatalf("a member refused: %v", err)
	}
	// The stranger dials the member: the member refuses it after the
	// handshake's chain check, by name.
	if _, err := handshake(addr, s.Config()); err == nil {
		t.Fatal("a certificate of another workload from the same CA was served")
	}
	// The member dials a stranger's server: refused by the dialling side.
	strangerAddr := tlsServer(t, s.Config())
	_, err = handshake(strangerAddr, m.Config())
	if err == nil || !strings.Contains(err.Error(), "grafana-0.grafana.ops.svc") || !strings.Contains(err.Error(), "*.hastate.ops.svc") {
		t.Fatalf("dialling a stranger: err %v, want a refusal naming its names and the pinned ones", err)
	}

	for _, tc := range []struct {
		want string
		ok   bool
	}{
		{"hastate-0.hastate.ops.svc", true}, {"HASTATE-0.hastate.ops.svc.", true}, {"*.hastate.ops.svc", true},
		{"*.ops.svc", false}, {"hastate-1.hastate.ops.svc", false}, {"127.0.0.1", true}, {"127.0.0.2", false},
	} {
		if got := certHasName(m.Leaf(), tc.want); got != tc.ok {
			t.Errorf("certHasName(%v, %q) = %v, want %v", m.Leaf().DNSNames, tc.want, got, tc.ok)
		}
	}
	if _, err := LoadRaftTLS(files(member, "hastate-*.ops.svc")); err == nil {
		t.Error("a wildcard inside a label accepted as a peer name")
	}
	if _, err := LoadRaftTLS(TLSFiles{PeerNames: []string{"x"}}); err == nil {
		t.Error("peer names without TLS files accepted")
	}
}
