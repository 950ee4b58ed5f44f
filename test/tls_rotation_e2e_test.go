package test

import (
	"bufio"
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hastate/hastate/internal/testenv"
)

// e2eCA signs the raft certificates of an e2e test.
type e2eCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newE2ECA(t testing.TB, cn string, serial int64) *e2eCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(365 * 24 * time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return &e2eCA{cert: c, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// leaf signs a raft certificate as cert-manager's Certificate of the chart
// asks for: server and client auth, the replica's address as SAN, here
// 127.0.0.1 (the host of --peers). notAfter is distinct per generation so
// that the expiry metric tells them apart.
func (ca *e2eCA) leaf(t testing.TB, cn string, serial int64, notAfter time.Time) (certPEM, keyPEM []byte) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: notAfter, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kd, _ := x509.MarshalECPrivateKey(key)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd})
}

// secretVolume is a directory laid out as the kubelet lays out a mounted
// Secret: the files are symlinks through ..data to a timestamped directory,
// and an update writes a new directory and swaps ..data in one rename
// (Kubernetes' AtomicWriter). That is what a replica sees when cert-manager
// renews its Certificate.
type secretVolume struct {
	dir string
	gen int
}

func newSecretVolume(t testing.TB) *secretVolume { return &secretVolume{dir: t.TempDir()} }

func (v *secretVolume) path(name string) string { return filepath.Join(v.dir, name) }

// update replaces the volume's content with files, all at once.
func (v *secretVolume) update(t testing.TB, files map[string][]byte) {
	t.Helper()
	v.gen++
	gen := fmt.Sprintf("..%s.%d", time.Now().UTC().Format("2006_01_02_15_04_05"), v.gen)
	if err := os.Mkdir(filepath.Join(v.dir, gen), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(v.dir, gen, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
		link := filepath.Join(v.dir, name)
		if _, err := os.Lstat(link); os.IsNotExist(err) {
			if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
				t.Fatal(err)
			}
		}
	}
	tmp := filepath.Join(v.dir, "..data_tmp")
	_ = os.Remove(tmp)
	if err := os.Symlink(gen, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(v.dir, "..data")); err != nil {
		t.Fatal(err)
	}
}

// metricSamples returns the samples of /-/metrics whose name (with labels)
// starts with prefix.
func (h *Hastate) metricSamples(t testing.TB, prefix string) map[string]float64 {
	t.Helper()
	code, body, err := h.get("/-/metrics")
	if err != nil || code != 200 {
		t.Fatalf("GET /-/metrics: HTTP %d: %v", code, err)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		// The value follows the last space: label values may hold spaces.
		line := sc.Text()
		i := strings.LastIndexByte(line, ' ')
		name, val := line[:max(i, 0)], line[i+1:]
		if i > 0 && !strings.HasPrefix(line, "#") && strings.HasPrefix(name, prefix) {
			f, err := strconv.ParseFloat(val, 64)
			if err != nil {
				t.Fatalf("metric %s: %q: %v", name, val, err)
			}
			out[name] = f
		}
	}
	return out
}

const tlsExpiryMetric = "hastate_raft_tls_cert_expiry_timestamp_seconds"

// nodeCertExpiry is the replica's own certificate's expiry as exported.
func (h *Hastate) nodeCertExpiry(t testing.TB) (time.Time, bool) {
	t.Helper()
	for _, v := range h.metricSamples(t, tlsExpiryMetric+`{kind="node"`) {
		return time.Unix(int64(v), 0), true
	}
	return time.Time{}, false
}

// caCount is how many CAs the replica trusts now.
func (h *Hastate) caCount(t testing.TB) int {
	t.Helper()
	return len(h.metricSamples(t, tlsExpiryMetric+`{kind="ca"`))
}

// TestE2ERaftCertificateRotation rotates the raft certificates of a running
// three-replica cluster with mutual TLS the two ways production does, with
// the files laid out and swapped as the kubelet does for a Secret volume,
// while HAProxy-like probers ask every replica for a drained server the
// whole time:
//
//  1. renewal (cert-manager's, every renewBefore): new key and certificate
//     from the same CA on every replica;
//  2. CA rotation: the bundle gets the new CA beside the old on every
//     replica, then every replica gets a certificate of the new CA, then
//     the old CA leaves the bundles.
//
// Each step waits until every replica exports the new expiry (or CA count)
// and so uses the new files for new handshakes. It must give 0 wrong
// answers and no election: the raft term and every replica's leader
// changes stay as they were. After the rotation a follower is restarted:
// it can only rejoin over new handshakes, with certificates of the new CA
// that a replica still trusting only the old one would refuse.
func TestE2ERaftCertificateRotation(t *testing.T) {
	const server = "be_tls/web1"
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	ca1 := newE2ECA(t, "hastate raft CA 1", 1)
	hs := NewCluster(t, 3, HastateOptions{ConsulAddr: consul.Addr()})
	vols := make([]*secretVolume, len(hs))
	serial := int64(100)
	leafs := func(ca *e2eCA, gen int, bundle []byte) {
		for i, h := range hs {
			serial++
			c, k := ca.leaf(t, fmt.Sprintf("%s gen %d", h.NodeID, gen), serial, time.Now().Add(time.Duration(30+gen)*24*time.Hour).Truncate(time.Second))
			vols[i].update(t, map[string][]byte{"tls.crt": c, "tls.key": k, "ca.crt": bundle})
		}
	}
	for i, h := range hs {
		vols[i] = newSecretVolume(t)
		h.AddArgs("--raft-tls-cert", vols[i].path("tls.crt"), "--raft-tls-key", vols[i].path("tls.key"),
			"--raft-tls-ca", vols[i].path("ca.crt"), "--raft-tls-reload-interval", "200ms")
	}
	leafs(ca1, 1, ca1.pem)
	StartAll(t, hs...)
	leader := WaitLeader(t, 15*time.Second, hs...)

	hs[0].Operator("--allow-unknown").Run(t, "drain", server)
	for _, h := range hs {
		h.WaitAnswer(t, server, "drain")
	}
	changes := func() []float64 {
		var out []float64
		for _, h := range hs {
			out = append(out, h.Metric(t, "hastate_raft_leader_changes_total"))
		}
		return out
	}
	termBefore, changesBefore := leader.Cluster(t).Term, changes()

	p := startProbers(hs, 2, server, "drain")
	p.waitProbes(t, 300)

	// waitAll waits until every replica passes check.
	waitAll := func(what string, check func(h *Hastate) bool) {
		t.Helper()
		start := time.Now()
		for _, h := range hs {
			testenv.Eventually(t, 15*time.Second, func() error {
				return testenv.Expect(check(h), "%s: %s not in use", h.NodeID, what)
			})
		}
		t.Logf("%s: in use on every replica %s after the files changed", what, time.Since(start).Round(time.Millisecond))
		p.waitProbes(t, 200)
	}
	expiresOn := func(gen int) func(h *Hastate) bool {
		return func(h *Hastate) bool {
			e, ok := h.nodeCertExpiry(t)
			return ok && e.Sub(time.Now()) > time.Duration(30+gen)*24*time.Hour-time.Hour
		}
	}

	// 1. Renewal from the same CA.
	leafs(ca1, 2, ca1.pem)
	waitAll("renewed certificates (same CA)", expiresOn(2))

	// 2. CA rotation in three steps.
	ca2 := newE2ECA(t, "hastate raft CA 2", 2)
	both := append(append([]byte{}, ca1.pem...), ca2.pem...)
	for i := range hs {
		// The same certificates, a bundle of both CAs.
		files := map[string][]byte{"ca.crt": both}
		for _, f := range []string{"tls.crt", "tls.key"} {
			b, err := os.ReadFile(vols[i].path(f))
			if err != nil {
				t.Fatal(err)
			}
			files[f] = b
		}
		vols[i].update(t, files)
	}
	waitAll("a bundle of the old and the new CA", func(h *Hastate) bool { return h.caCount(t) == 2 })
	leafs(ca2, 3, both)
	waitAll("certificates of the new CA", expiresOn(3))
	leafs(ca2, 4, ca2.pem)
	waitAll("the new CA alone", func(h *Hastate) bool { return h.caCount(t) == 1 && expiresOn(4)(h) })

	counts := p.Stop()
	var total, wrong, unanswered int
	for _, h := range hs {
		c := counts[h.NodeID]
		t.Logf("%s: %s", h.NodeID, c)
		total += c.OK + c.bad()
		wrong += c.Wrong
		unanswered += c.Unanswered + c.Refused + c.Failed
		if c.Wrong > 0 {
			t.Errorf("%s gave %d wrong answers during the rotation: %v", h.NodeID, c.Wrong, c.Bad)
		}
	}
	t.Logf("rotation: %d probes, %d wrong, %d without an answer", total, wrong, unanswered)
	if unanswered > 0 {
		t.Errorf("%d probes got no answer during the rotation (a rotation must not make a replica withhold): %v", unanswered, counts)
	}
	if term, after := leader.Cluster(t).Term, changes(); term != termBefore || fmt.Sprint(after) != fmt.Sprint(changesBefore) {
		t.Errorf("the rotation caused an election: term %d -> %d, leader changes per replica %v -> %v", termBefore, term, changesBefore, after)
	}
	for _, h := range hs {
		if got := h.Metric(t, `hastate_raft_tls_reloads_total{result="failed"}`); got != 0 {
			t.Errorf("%s: %v reloads failed (the kubelet's swap is atomic)", h.NodeID, got)
		}
		if got := h.Metric(t, `hastate_raft_tls_reloads_total{result="loaded"}`); got != 4 {
			t.Errorf("%s: %v reloads, want 4 (renewal, bundle, new CA's certificate, bundle)", h.NodeID, got)
		}
		if !h.LogContains(t, "raft TLS files reloaded") {
			t.Errorf("%s logged no reload", h.NodeID)
		}
	}

	// New handshakes work with the rotated material only: a restarted
	// follower rejoins, catches up and answers.
	f := others(hs, leader)[0]
	f.Restart(t)
	f.WaitReady(t)
	f.WaitAnswer(t, server, "drain")
	hs[0].Operator("--allow-unknown").Run(t, "maint", server)
	for _, h := range hs {
		h.WaitAnswer(t, server, "maint")
	}
}
