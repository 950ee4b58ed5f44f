package testenv

import (
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// ConsulCluster is several Consul servers on 127.0.0.1 forming one
// cluster (-bootstrap-expect), each with its data on disk, for tests that
// kill Consul's leader.
type ConsulCluster struct {
	Servers []*Consul
	// raftAddrs[i] is server i's server (raft RPC) address, as
	// /v1/status/leader names the leader.
	raftAddrs []string
}

// StartConsulCluster starts n Consul servers that join each other and
// returns once every one answers a consistent KV read. They are killed when
// the test ends; their logs are printed if it failed.
func StartConsulCluster(t testing.TB, n int) *ConsulCluster {
	t.Helper()
	type ports struct{ http, serf, wan, server int }
	ps := make([]ports, n)
	for i := range ps {
		ps[i] = ports{FreePort(t), FreePort(t), FreePort(t), FreePort(t)}
	}
	cc := &ConsulCluster{}
	for i, p := range ps {
		dir := t.TempDir()
		args := []string{
			"agent", "-server", "-bootstrap-expect", strconv.Itoa(n),
			"-node", fmt.Sprintf("consul-%d", i),
			"-bind", "127.0.0.1", "-client", "127.0.0.1", "-advertise", "127.0.0.1",
			"-http-port", strconv.Itoa(p.http), "-serf-lan-port", strconv.Itoa(p.serf),
			"-serf-wan-port", strconv.Itoa(p.wan), "-server-port", strconv.Itoa(p.server),
			"-dns-port", "-1", "-grpc-port", "-1", "-ui=false",
			"-data-dir", filepath.Join(dir, "data"), "-log-level", "info",
			"-hcl", "disable_update_check = true",
			"-hcl", "performance { raft_multiplier = 1 }",
		}
		for j, q := range ps {
			if j != i {
				args = append(args, "-retry-join", net.JoinHostPort("127.0.0.1", strconv.Itoa(q.serf)))
			}
		}
		c := &Consul{
			proc: Process{Bin: ConsulBin(t), LogPath: filepath.Join(dir, "consul.log")},
			args: args,
			addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(p.http)),
		}
		t.Cleanup(func() {
			c.Kill()
			if t.Failed() {
				b, err := c.proc.Log(16 << 10)
				t.Logf("testenv: consul-%d log %s (last %d bytes, %v):\n%s", i, c.proc.LogPath, len(b), err, b)
			}
		})
		cc.Servers = append(cc.Servers, c)
		cc.raftAddrs = append(cc.raftAddrs, net.JoinHostPort("127.0.0.1", strconv.Itoa(p.server)))
	}
	// All at once: none has a leader before a quorum has joined.
	for _, c := range cc.Servers {
		c.proc.Start(t, c.args...)
	}
	for i, c := range cc.Servers {
		if err := c.waitReady(c.proc.Done()); err != nil {
			t.Fatalf("testenv: consul-%d at %s: %v", i, c.addr, err)
		}
	}
	return cc
}

// Leader returns the index of the server that leads, as a running server
// reports it, waiting up to timeout for one.
func (cc *ConsulCluster) Leader(t testing.TB, timeout time.Duration) int {
	t.Helper()
	leader := -1
	Eventually(t, timeout, func() error {
		for _, c := range cc.Servers {
			if !c.proc.Running() {
				continue
			}
			addr, err := c.Client(t).Status().Leader()
			if err != nil || addr == "" {
				continue
			}
			for i, a := range cc.raftAddrs {
				if a == addr && cc.Servers[i].proc.Running() {
					leader = i
					return nil
				}
			}
		}
		return fmt.Errorf("no Consul server reports a running leader")
	})
	return leader
}
