package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA signs raft certificates for tests.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
	PEM  []byte // the certificate, for --raft-tls-ca
}

// NewCA makes a self-signed CA named cn, valid from an hour ago for a year.
func NewCA(t testing.TB, cn string) *CA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: serial(t), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(365 * 24 * time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &CA{Cert: c, Key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// Leaf signs a raft certificate as the chart's Certificates ask for one:
// server and client auth, names as SANs (an IP as an IP SAN), subject cn,
// valid until notAfter. It returns the certificate and key PEM and the
// serial.
func (ca *CA) Leaf(t testing.TB, cn string, notAfter time.Time, names ...string) (certPEM, keyPEM []byte, sn *big.Int) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: serial(t), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: notAfter,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	kd, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd}), tmpl.SerialNumber
}

func serial(t testing.TB) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// WriteRaftTLS writes a new CA and one raft certificate signed by it (SANs
// 127.0.0.1 and localhost, valid for a day) into dir and returns the paths
// of the certificate, its key and the CA, for --raft-tls-cert,
// --raft-tls-key and --raft-tls-ca.
func WriteRaftTLS(t testing.TB, dir string) (cert, key, ca string) {
	t.Helper()
	c := NewCA(t, "hastate test raft CA")
	certPEM, keyPEM, _ := c.Leaf(t, "hastate test replica", time.Now().Add(24*time.Hour), "127.0.0.1", "localhost")
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	return write("raft.crt", certPEM), write("raft.key", keyPEM), write("raft-ca.crt", c.PEM)
}

// TLSDir is one replica's three raft TLS files (NewTLSDir): its
// certificate, its key and the CA bundle it trusts.
type TLSDir struct{ Cert, Key, CA string }

// NewTLSDir names the three files in a new temporary directory; none is
// written yet.
func NewTLSDir(t testing.TB) TLSDir {
	d := t.TempDir()
	return TLSDir{filepath.Join(d, "tls.crt"), filepath.Join(d, "tls.key"), filepath.Join(d, "ca.crt")}
}

// Write writes what is not nil, each file by rename (as a file on disk
// changes at once, like a Secret's volume); nil leaves a file as it is.
func (d TLSDir) Write(t testing.TB, cert, key, ca []byte) {
	t.Helper()
	for _, f := range []struct {
		path string
		b    []byte
	}{{d.Cert, cert}, {d.Key, key}, {d.CA, ca}} {
		if f.b == nil {
			continue
		}
		tmp := f.path + ".tmp"
		if err := os.WriteFile(tmp, f.b, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, f.path); err != nil {
			t.Fatal(err)
		}
	}
}
