package test

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hastate/hastate/internal/testenv"
)

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
// answers, no refused handshake between replicas, and no election: the
// raft term and every replica's leader changes stay as they were. A probe
// may go unanswered only as the replica counted it: a confirmation round
// later than --confirm-timeout (a loaded machine), never for TLS. After the rotation a follower is restarted:
// it can only rejoin over new handshakes, with certificates of the new CA
// that a replica still trusting only the old one would refuse.
func TestE2ERaftCertificateRotation(t *testing.T) {
	const server = "be_tls/web1"
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	ca1 := testenv.NewCA(t, "hastate raft CA 1")
	hs := NewCluster(t, 3, HastateOptions{ConsulAddr: consul.Addr()})
	vols := make([]*secretVolume, len(hs))
	// Each generation's certificates expire on a day of their own, so that
	// the expiry metric tells the generations apart; the SAN is the host
	// of --peers (127.0.0.1), as the chart's are.
	leafs := func(ca *testenv.CA, gen int, bundle []byte) {
		for i, h := range hs {
			c, k, _ := ca.Leaf(t, fmt.Sprintf("%s gen %d", h.NodeID, gen), time.Now().Add(time.Duration(30+gen)*24*time.Hour).Truncate(time.Second), "127.0.0.1")
			vols[i].update(t, map[string][]byte{"tls.crt": c, "tls.key": k, "ca.crt": bundle})
		}
	}
	for i, h := range hs {
		vols[i] = newSecretVolume(t)
		h.AddArgs("--raft-tls-cert", vols[i].path("tls.crt"), "--raft-tls-key", vols[i].path("tls.key"),
			"--raft-tls-ca", vols[i].path("ca.crt"), "--raft-tls-reload-interval", "200ms")
	}
	leafs(ca1, 1, ca1.PEM)
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
	// Per replica: handshakes refused, and checks answered nothing for
	// want of a confirmation round in time (--confirm-timeout: load).
	counters := func(sample string) map[string]float64 {
		m := map[string]float64{}
		for _, h := range hs {
			m[h.NodeID] = h.Metric(t, sample)
		}
		return m
	}
	const tlsRejected, unconfirmed = `hastate_raft_conns_rejected_total{reason="tls"}`, "hastate_agent_unconfirmed_total"
	rejectedBefore, unconfirmedBefore := counters(tlsRejected), counters(unconfirmed)

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
	leafs(ca1, 2, ca1.PEM)
	waitAll("renewed certificates (same CA)", expiresOn(2))

	// 2. CA rotation in three steps.
	ca2 := testenv.NewCA(t, "hastate raft CA 2")
	both := append(append([]byte{}, ca1.PEM...), ca2.PEM...)
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
	leafs(ca2, 4, ca2.PEM)
	waitAll("the new CA alone", func(h *Hastate) bool { return h.caCount(t) == 1 && expiresOn(4)(h) })

	counts := p.Stop()
	rejectedAfter, unconfirmedAfter := counters(tlsRejected), counters(unconfirmed)
	var total, wrong, unanswered int
	for _, h := range hs {
		c := counts[h.NodeID]
		id := h.NodeID
		slow := int(unconfirmedAfter[id] - unconfirmedBefore[id])
		t.Logf("%s: %s; %d checks unconfirmed within --confirm-timeout", id, c, slow)
		total += c.OK + c.bad()
		wrong += c.Wrong
		unanswered += c.bad() - c.Wrong
		if c.Wrong > 0 {
			t.Errorf("%s gave %d wrong answers during the rotation: %v", id, c.Wrong, c.Bad)
		}
		// A check may go unanswered on a loaded machine when its
		// confirmation round with the leader is late (HAProxy keeps the
		// server's state); anything else is the rotation's doing.
		if bad := c.bad() - c.Wrong; bad > slow {
			t.Errorf("%s: %d probes without an answer, %d of them not explained by a late confirmation: %v", id, bad, bad-slow, c.Bad)
		}
		if n := rejectedAfter[id] - rejectedBefore[id]; n != 0 {
			t.Errorf("%s refused %v raft TLS handshakes during the rotation: a peer presented a certificate it did not trust", id, n)
		}
	}
	t.Logf("rotation: %d probes, %d wrong, %d without an answer", total, wrong, unanswered)
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
