package test

import (
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// faultNet is an in-process toxiproxy: TCP proxies on 127.0.0.1 that a test
// puts between two processes and then cuts (every open connection closed,
// new ones refused) and heals. It is the real network fault of the cluster
// tests: raft and Consul traffic really stops, both processes keep running.
type faultNet struct {
	srv *toxiproxy.ApiServer
}

func newFaultNet() *faultNet {
	return &faultNet{srv: toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())}
}

// link is one proxy: clients dial Addr, the proxy dials upstream.
type link struct {
	Name string
	Addr string // host:port clients dial; the same across Cut and Heal
	p    *toxiproxy.Proxy
}

// Link starts a proxy on a free port of 127.0.0.1 in front of upstream. It
// is stopped when the test ends.
func (f *faultNet) Link(t testing.TB, name, upstream string) *link {
	t.Helper()
	p := toxiproxy.NewProxy(f.srv, name, "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		t.Fatalf("toxiproxy %s -> %s: %v", name, upstream, err)
	}
	t.Cleanup(p.Stop)
	// Start has set Listen to the bound address; Heal listens there again.
	return &link{Name: name, Addr: p.Listen, p: p}
}

// Cut closes every connection through the link and refuses new ones.
func (l *link) Cut() { l.p.Stop() }

// Heal listens again on the link's address. The port was free a moment ago
// and nothing of ours binds there, but the kernel may have lent it to an
// outgoing connection meanwhile; then Heal retries for a few seconds.
func (l *link) Heal(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := l.p.Start()
		switch {
		case err == nil || errors.Is(err, toxiproxy.ErrProxyAlreadyStarted):
			if l.p.Listen != l.Addr {
				t.Fatalf("toxiproxy %s re-listened on %s, not %s", l.Name, l.p.Listen, l.Addr)
			}
			return
		case errors.Is(err, syscall.EADDRINUSE) && time.Now().Before(deadline):
			time.Sleep(50 * time.Millisecond)
		default:
			t.Fatalf("toxiproxy %s: listen again on %s: %v", l.Name, l.Addr, err)
		}
	}
}

// raftMesh routes each replica's raft traffic to each peer through its own
// directed link, so that any pair of replicas can be cut apart.
type raftMesh struct {
	hs    []*Hastate
	links map[[2]int]*link // [from, to] -> the link from dials to reach to
}

// newRaftMesh puts a link between every ordered pair of replicas (prepared,
// not started) and points each replica's --raft-dial at its own links. The
// raft configuration keeps the real addresses: only dialling goes through
// the proxies, as with a sidecar.
func newRaftMesh(t testing.TB, f *faultNet, hs []*Hastate) *raftMesh {
	t.Helper()
	m := &raftMesh{hs: hs, links: map[[2]int]*link{}}
	for i, from := range hs {
		var dial []string
		for j, to := range hs {
			if i == j {
				continue
			}
			l := f.Link(t, fmt.Sprintf("raft-%s-%s", from.NodeID, to.NodeID), to.RaftAddr)
			m.links[[2]int{i, j}] = l
			dial = append(dial, to.NodeID+"="+l.Addr)
		}
		from.AddArgs("--raft-dial", strings.Join(dial, ","))
	}
	return m
}

func (m *raftMesh) index(h *Hastate) int {
	for i, x := range m.hs {
		if x == h {
			return i
		}
	}
	panic("raftMesh: replica " + h.NodeID + " is not in the mesh")
}

// Isolate cuts every link from and to h: h can neither reach nor be reached
// by any peer over raft. It returns the links it cut.
func (m *raftMesh) Isolate(h *Hastate) []*link {
	i := m.index(h)
	var cut []*link
	for k, l := range m.links {
		if k[0] == i || k[1] == i {
			l.Cut()
			cut = append(cut, l)
		}
	}
	return cut
}
