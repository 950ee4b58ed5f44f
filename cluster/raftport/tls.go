package raftport

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// DefaultTLSReloadInterval is how often a node re-reads its raft TLS files
// (RaftTLS). cert-manager writes a renewed certificate into the Secret and
// the kubelet swaps the mounted files within about a minute; 10s more is
// nothing against a renew window of days, and reading three small files is
// free.
const DefaultTLSReloadInterval = 10 * time.Second

// TLSFiles name the raft port's mutual TLS material: this replica's
// certificate and key, and the CA bundle that signed every replica's
// certificate (PEM; several CAs while a CA is rotated).
type TLSFiles struct {
	Cert, Key, CA string
	// PeerNames pin the peers: a peer's certificate (either side of a
	// connection) must carry one of them as a subject alternative name,
	// besides being signed by the CA. "*.example" matches one label, as in
	// a certificate. Empty: the hosts of the node's --peers and
	// --raft-advertise (Options.Peers, Options.Advertise), which are the
	// names the chart puts in the replicas' certificates.
	PeerNames []string
}

// RaftTLS is mutual TLS for the raft port from files that are re-read while
// the node runs (Reload; a Node with Options.TLSFiles does it every
// TLSReloadInterval), so that a certificate renewed on disk is the one the
// next handshake presents and accepts, without a restart. A change that
// does not load (a key that does not match its certificate, a CA file
// without a certificate) keeps the material in use, is logged once and is
// counted; connections already open are not touched by a reload.
type RaftTLS struct {
	files TLSFiles
	cur   atomic.Pointer[tlsMaterial]
	pins  atomic.Pointer[[]string]

	mu   sync.Mutex // serialises Reload
	read [3][]byte  // the files' bytes last read, loaded or not

	reloads *prometheus.CounterVec
	expiry  *prometheus.Desc
	failG   prometheus.Gauge
}

// tlsMaterial is what one successful load of the files gave.
type tlsMaterial struct {
	cert *tls.Certificate
	leaf *x509.Certificate
	pool *x509.CertPool
	cas  []*x509.Certificate
}

// MutualTLS builds the raft port's TLS configuration from PEM files: this
// node's certificate and key, and the CA that signed every replica's
// certificate. Both sides verify each other: the raft port is the one way to
// change what the fleet is told. All three files or none. The files are
// read once: a node that should follow renewals takes LoadRaftTLS's
// RaftTLS as Options.TLSFiles instead.
func MutualTLS(certFile, keyFile, caFile string) (*tls.Config, error) {
	r, err := LoadRaftTLS(TLSFiles{Cert: certFile, Key: keyFile, CA: caFile})
	if r == nil || err != nil {
		return nil, err
	}
	return r.Config(), nil
}

// LoadRaftTLS reads the files once and returns their RaftTLS; nil and no
// error when no file is named (TLS off). All three files or none; a file
// that does not load is an error naming it.
func LoadRaftTLS(f TLSFiles) (*RaftTLS, error) {
	if f.Cert == "" && f.Key == "" && f.CA == "" {
		if len(f.PeerNames) > 0 {
			return nil, errors.New("--raft-tls-peer-names given without raft TLS: set --raft-tls-cert, --raft-tls-key and --raft-tls-ca too")
		}
		return nil, nil
	}
	if f.Cert == "" || f.Key == "" || f.CA == "" {
		return nil, errors.New("raft TLS needs all of --raft-tls-cert, --raft-tls-key and --raft-tls-ca")
	}
	for _, p := range f.PeerNames {
		if err := checkPeerName(p); err != nil {
			return nil, err
		}
	}
	r := &RaftTLS{
		files: f,
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hastate_raft_tls_reloads_total",
			Help: "Per replica: changes of the raft TLS files (--raft-tls-cert, --raft-tls-key, --raft-tls-ca) seen while running, by result: loaded (the next handshakes use them), failed (kept the material in use; the log says why)."},
			[]string{"result"}),
		expiry: prometheus.NewDesc("hastate_raft_tls_cert_expiry_timestamp_seconds",
			"Per replica: when each raft TLS certificate in use expires (Unix seconds): kind=\"node\" is this replica's own (--raft-tls-cert), kind=\"ca\" each CA of --raft-tls-ca. A renewed certificate replaces it within --raft-tls-reload-interval of the kubelet updating the files; one that stays near its expiry was not renewed or not reloaded.",
			[]string{"kind", "subject"}, nil),
		failG: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "hastate_raft_tls_reload_failing",
			Help: "Per replica: 1 while the raft TLS files on disk differ from those in use and do not load (e.g. a key that does not match its certificate); the replica keeps presenting and trusting the material it had."}),
	}
	r.reloads.WithLabelValues("loaded")
	r.reloads.WithLabelValues("failed")
	m, read, err := r.load()
	if err != nil {
		return nil, err
	}
	r.cur.Store(m)
	r.read = read
	if len(f.PeerNames) > 0 {
		pins := slices.Clone(f.PeerNames)
		r.pins.Store(&pins)
	}
	return r, nil
}

// checkPeerName refuses a pattern no certificate name could match.
func checkPeerName(p string) error {
	rest, _ := strings.CutPrefix(p, "*.")
	if p == "" || strings.Contains(rest, "*") {
		return fmt.Errorf("--raft-tls-peer-names: %q: want a DNS name, an IP, or *.domain (a wildcard for one label only)", p)
	}
	return nil
}

// PinDefault pins the peers to the hosts of addrs (host:port, or a bare
// host) unless names were given; the node calls it with its peers'
// addresses and its own advertised one.
func (r *RaftTLS) PinDefault(addrs []string) {
	if r.pins.Load() != nil {
		return
	}
	var pins []string
	for _, a := range addrs {
		if h := hostOf(a); h != "" && !slices.Contains(pins, h) {
			pins = append(pins, h)
		}
	}
	r.pins.CompareAndSwap(nil, &pins)
}

// PeerNames returns the names a peer's certificate must carry one of (nil:
// not pinned yet).
func (r *RaftTLS) PeerNames() []string {
	if p := r.pins.Load(); p != nil {
		return slices.Clone(*p)
	}
	return nil
}

// load reads and parses the three files.
func (r *RaftTLS) load() (*tlsMaterial, [3][]byte, error) {
	var read [3][]byte
	for i, name := range []string{r.files.Cert, r.files.Key, r.files.CA} {
		b, err := os.ReadFile(name)
		if err != nil {
			return nil, read, fmt.Errorf("raft TLS: read %s: %w", name, err)
		}
		read[i] = b
	}
	m, err := parseMaterial(read, r.files)
	return m, read, err
}

func parseMaterial(read [3][]byte, f TLSFiles) (*tlsMaterial, error) {
	cert, err := tls.X509KeyPair(read[0], read[1])
	if err != nil {
		return nil, fmt.Errorf("raft TLS key pair %s / %s: %w", f.Cert, f.Key, err)
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("raft TLS certificate %s: %w", f.Cert, err)
	}
	cert.Leaf = leaf
	m := &tlsMaterial{cert: &cert, leaf: leaf, pool: x509.NewCertPool()}
	rest := read[2]
	for len(rest) > 0 {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		ca, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("raft TLS CA %s: %w", f.CA, err)
		}
		m.pool.AddCert(ca)
		m.cas = append(m.cas, ca)
	}
	if len(m.cas) == 0 {
		return nil, fmt.Errorf("raft TLS CA %s: no PEM certificate found", f.CA)
	}
	return m, nil
}

// Reload re-reads the files. Unchanged files do nothing; changed files
// that load replace the material for the next handshakes (changed true);
// changed files that do not load keep it and return why. Safe to call
// concurrently with handshakes.
func (r *RaftTLS) Reload() (changed bool, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m, read, err := r.load()
	if err != nil {
		// The kubelet swaps the files of a Secret volume at once, but a
		// swap between two of our reads pairs an old certificate with a
		// new key: read once more before calling it a failure.
		m, read, err = r.load()
	}
	if bytes.Equal(read[0], r.read[0]) && bytes.Equal(read[1], r.read[1]) && bytes.Equal(read[2], r.read[2]) {
		// Nothing changed since the last read (a file that cannot be
		// read is nil both times): counted and logged once already.
		return false, nil
	}
	r.read = read
	if err != nil {
		r.reloads.WithLabelValues("failed").Inc()
		r.failG.Set(1)
		return false, err
	}
	r.cur.Store(m)
	r.reloads.WithLabelValues("loaded").Inc()
	r.failG.Set(0)
	return true, nil
}

// Leaf returns the certificate this replica presents now.
func (r *RaftTLS) Leaf() *x509.Certificate { return r.cur.Load().leaf }

// Config is the raft port's tls.Config. Its server side requires and
// verifies a client certificate against the CA bundle in use at each
// handshake (GetConfigForClient); its client side presents the current
// certificate (GetClientCertificate) and verifies the server itself in
// VerifyConnection against the current bundle and the dialled name, since
// RootCAs would be fixed at build time: that is why InsecureSkipVerify is
// set, and why the verification below is not optional. Both sides then
// check the peer's certificate names against PeerNames.
func (r *RaftTLS) Config() *tls.Config {
	base := &tls.Config{
		MinVersion: tls.VersionTLS12,
		ClientAuth: tls.RequireAndVerifyClientCert,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return r.cur.Load().cert, nil
		},
		InsecureSkipVerify: true, // verified by VerifyConnection, against the current CA bundle
		VerifyConnection:   r.verifyServer,
	}
	base.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		m := r.cur.Load()
		return &tls.Config{
			MinVersion:       tls.VersionTLS12,
			Certificates:     []tls.Certificate{*m.cert},
			ClientCAs:        m.pool,
			ClientAuth:       tls.RequireAndVerifyClientCert,
			VerifyConnection: r.verifyClient,
		}, nil
	}
	return base
}

// verifyServer is the dialling side's verification of the server: chain to
// the current CA bundle for server auth, valid for the dialled name, and
// pinned.
func (r *RaftTLS) verifyServer(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("raft TLS: the peer presented no certificate")
	}
	inter := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	leaf := cs.PeerCertificates[0]
	if _, err := leaf.Verify(x509.VerifyOptions{
		Roots: r.cur.Load().pool, Intermediates: inter, DNSName: cs.ServerName,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}); err != nil {
		return fmt.Errorf("raft TLS: peer %s: %w (is it signed by a CA of --raft-tls-ca?)", cs.ServerName, err)
	}
	return r.checkPinned(leaf)
}

// verifyClient runs after the server side verified the client's chain
// (ClientCAs, RequireAndVerifyClientCert): only the names are left.
func (r *RaftTLS) verifyClient(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("raft TLS: the peer presented no certificate")
	}
	return r.checkPinned(cs.PeerCertificates[0])
}

// checkPinned accepts a certificate carrying one of the pinned names.
func (r *RaftTLS) checkPinned(c *x509.Certificate) error {
	p := r.pins.Load()
	if p == nil {
		return nil // not pinned (a RaftTLS used outside a Node)
	}
	for _, want := range *p {
		if certHasName(c, want) {
			return nil
		}
	}
	var have []string
	have = append(have, c.DNSNames...)
	for _, ip := range c.IPAddresses {
		have = append(have, ip.String())
	}
	return fmt.Errorf("raft TLS: peer certificate %q names %v, none of the raft peers' names %v: another workload's certificate from the same CA is not a member (set --raft-tls-peer-names if the replicas' names differ)",
		c.Subject.CommonName, have, *p)
}

// certHasName: an IP matches an IP SAN; a name matches a DNS SAN exactly
// or, as "*.domain", a SAN of one more label under domain; a SAN that is
// itself a wildcard matches only the same pattern.
func certHasName(c *x509.Certificate, want string) bool {
	if ip := net.ParseIP(want); ip != nil {
		return slices.ContainsFunc(c.IPAddresses, ip.Equal)
	}
	want = strings.ToLower(strings.TrimSuffix(want, "."))
	for _, n := range c.DNSNames {
		n = strings.ToLower(strings.TrimSuffix(n, "."))
		if n == want {
			return true
		}
		if domain, ok := strings.CutPrefix(want, "*."); ok && !strings.HasPrefix(n, "*.") {
			if label, rest, ok := strings.Cut(n, "."); ok && label != "" && rest == domain {
				return true
			}
		}
	}
	return false
}

// hostOf is the host of host:port (the whole string if it has no port).
func hostOf(addr string) string {
	if h, _, err := net.SplitHostPort(addr); err == nil {
		return h
	}
	return addr
}

// Collectors are the certificate expiry metrics, registered with the node's.
func (r *RaftTLS) Collectors() []prometheus.Collector {
	return []prometheus.Collector{r.reloads, r.failG, tlsExpiry{r}}
}

// tlsExpiry computes the expiry series from the material in use.
type tlsExpiry struct{ r *RaftTLS }

func (e tlsExpiry) Describe(ch chan<- *prometheus.Desc) { ch <- e.r.expiry }

func (e tlsExpiry) Collect(ch chan<- prometheus.Metric) {
	m := e.r.cur.Load()
	ch <- prometheus.MustNewConstMetric(e.r.expiry, prometheus.GaugeValue, float64(m.leaf.NotAfter.Unix()), "node", m.leaf.Subject.String())
	seen := map[string]bool{}
	for _, ca := range m.cas {
		s := ca.Subject.String()
		if seen[s] {
			// Two CAs of one name (a CA re-issued with a new key while
			// the old one is still trusted): keep the series apart.
			s += " #" + ca.SerialNumber.Text(16)
		}
		seen[s] = true
		ch <- prometheus.MustNewConstMetric(e.r.expiry, prometheus.GaugeValue, float64(ca.NotAfter.Unix()), "ca", s)
	}
}

// ReloadLoop re-reads the files every interval until stop is closed, and
// logs each change once.
func (r *RaftTLS) ReloadLoop(stop <-chan struct{}, every time.Duration, log *zap.Logger) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	var lastErr string
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		changed, err := r.Reload()
		switch {
		case err != nil && err.Error() != lastErr:
			lastErr = err.Error()
			log.Error("raft TLS files changed but do not load: this replica keeps presenting and trusting its previous certificate and CA; fix the files (cert-manager's Secret, or the mounted volume) before the certificate in use expires",
				zap.Error(err), zap.Time("in_use_not_after", r.Leaf().NotAfter))
		case changed:
			lastErr = ""
			leaf := r.Leaf()
			log.Info("raft TLS files reloaded: new handshakes use them; open connections keep theirs",
				zap.String("subject", leaf.Subject.String()), zap.String("serial", leaf.SerialNumber.Text(16)),
				zap.Time("not_after", leaf.NotAfter), zap.Int("cas", len(r.cur.Load().cas)))
		}
	}
}
