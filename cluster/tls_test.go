package cluster

import (
	"crypto/tls"
	"math/big"
	"net"
	"testing"
	"time"

	"github.com/hastate/hastate/cluster/raftport"
	"github.com/hastate/hastate/internal/testenv"
)

// A cluster of nodes with Options.TLSFiles: pinned to the hosts of --peers
// by default, each node re-reads its files on its own (TLSReloadInterval)
// and exports the expiry; rotating every node's certificate refuses no
// handshake and keeps replication going.
func TestClusterReloadsRotatedCertificates(t *testing.T) {
	ca := testenv.NewCA(t, "raft CA")
	dirs := make([]testenv.TLSDir, 3)
	rts := make([]*raftport.RaftTLS, 3)
	for i := range dirs {
		dirs[i] = testenv.NewTLSDir(t)
		c, k, _ := ca.Leaf(t, "127.0.0.1", time.Now().Add(24*time.Hour).Truncate(time.Second), "127.0.0.1")
		dirs[i].Write(t, c, k, ca.PEM)
		r, err := raftport.LoadRaftTLS(raftport.TLSFiles{Cert: dirs[i].Cert, Key: dirs[i].Key, CA: dirs[i].CA})
		if err != nil {
			t.Fatal(err)
		}
		rts[i] = r
	}
	nodes := startCluster(t, func(i int, o *Options) {
		o.TLSFiles = rts[i]
		o.TLSReloadInterval = 50 * time.Millisecond
	})
	testenv.Eventually(t, 10*time.Second, func() error { return testenv.Expect(leaderOf(nodes) != nil, "no leader over TLS") })
	if got := rts[0].PeerNames(); len(got) != 1 || got[0] != "127.0.0.1" {
		t.Errorf("default pins = %v, want the peers' host [127.0.0.1]", got)
	}
	serials := make([]*big.Int, 3)
	for i := range dirs {
		c, k, s := ca.Leaf(t, "127.0.0.1", time.Now().Add(60*24*time.Hour).Truncate(time.Second), "127.0.0.1")
		serials[i] = s
		dirs[i].Write(t, c, k, nil)
	}
	for i, n := range nodes {
		testenv.Eventually(t, 5*time.Second, func() error {
			return testenv.Expect(rts[i].Leaf().SerialNumber.Cmp(serials[i]) == 0, "%s did not reload its renewed certificate", n.opts.ID)
		})
	}
	applyOnLeader(t, nodes, 1, map[string]string{"state/a/b": "drain"})
	for _, n := range nodes {
		testenv.Eventually(t, 5*time.Second, func() error {
			return testenv.Expect(answer(n.Node, "a/b") == "drain\n", "%s did not replicate after the rotation", n.opts.ID)
		})
	}
	// A new connection to each node is served with its renewed
	// certificate, and accepted with another node's renewed one.
	for i, n := range nodes {
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", n.opts.BindAddr, rts[(i+1)%len(rts)].Config())
		if err != nil {
			t.Fatalf("handshake with %s after the rotation: %v", n.opts.ID, err)
		}
		if got := c.ConnectionState().PeerCertificates[0].SerialNumber; got.Cmp(serials[i]) != 0 {
			t.Errorf("%s presents serial %v after the rotation, want the renewed %v", n.opts.ID, got, serials[i])
		}
		c.Close()
	}
	// No handshake between the nodes failed: each trusted the others'
	// renewed certificates from its first new connection on. (Whether the
	// rotation causes an election is the e2e test's to show, with the
	// production timeouts: these unit tests' 300ms ones elect under load.)
	for _, n := range nodes {
		if got := rejected(n, "tls"); got != 0 {
			t.Errorf("%s refused %d raft TLS handshakes during the rotation", n.opts.ID, got)
		}
	}
}
