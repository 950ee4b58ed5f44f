package test

// Issue 43: adopting a Consul takes a writer's authority over it, proven
// to Consul. Three replicas mirror Consul A (ACLs on, default deny, the
// shipped policies) with servers drained and in maint, then are pointed
// at Consul B, which holds another state: they keep A's state. Without a
// writer's token, nothing adopts B: not a request to the HTTP port (as
// 0.15.0 took it, unauthenticated), not adopt-consul with no token or the
// replicas' read token (exit 5, "permission denied", nothing written).
// With the shipped writer token, adopt-consul writes the marker, the
// leader adopts B, and every replica answers B's state.

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/internal/testenv"
)

func TestE2EAdoptionNeedsAWritersToken(t *testing.T) {
	consulA, readA, writerA := aclConsul(t)
	consulB, readB, writerB := aclConsul(t)
	hs := StartCluster(t, 3, HastateOptions{ConsulAddr: consulA.Addr(),
		Args: []string{"--consul-token-file", tokenFile(t, readA.SecretID)}})
	leader := WaitLeader(t, 30*time.Second, hs...)
	setACLFleet(t, hs, writer(leader, writerA))
	var recorded *api.MirrorSource
	testenv.Eventually(t, 20*time.Second, func() error {
		for _, h := range hs {
			in := h.Cluster(t)
			if in.Source == nil || in.Source.ClusterID == "" {
				return fmt.Errorf("%s: source %v: not recorded yet (or without a cluster ID)", h.NodeID, in.Source)
			}
			recorded = in.Source
		}
		return nil
	})

	// B holds another state (web/s1 in maint, nothing else): adopted, it
	// would undrain web/s1's neighbours and every api server.
	consulB.Put(t, stateKey("web/s1"), "maint")
	fileB := tokenFile(t, readB.SecretID)
	for _, h := range hs {
		h.Stop(t)
		h.AddArgs("--consul-addr", consulB.Addr(), "--consul-token-file", fileB)
		h.Start(t)
		h.WaitReady(t)
	}
	var idB string
	testenv.Eventually(t, 30*time.Second, func() error {
		for _, h := range hs {
			in := h.Cluster(t)
			if m := in.Mirror; m == nil || m.Reason != api.MirrorOtherCluster {
				return fmt.Errorf("%s: mirror %v, want other_cluster (every replica reads B)", h.NodeID, m)
			}
			if in.Consul == nil || in.Consul.ClusterID == "" {
				return fmt.Errorf("%s: consul %+v: B's cluster ID not read yet", h.NodeID, in.Consul)
			}
			idB = in.Consul.ClusterID
		}
		return nil
	})
	leader = WaitLeader(t, 30*time.Second, hs...)
	unchanged := func(when string) {
		t.Helper()
		for _, h := range hs {
			if src := h.Cluster(t).Source; src == nil || *src != *recorded {
				t.Fatalf("%s: %s, %s records %v, want A's %v", when, h.NodeID, h.NodeID, src, recorded)
			}
			for s, want := range aclFleet {
				if got := h.Ask(t, s); got != want {
					t.Fatalf("%s: %s answers %s %q, want A's %q", when, h.NodeID, s, got, want)
				}
			}
		}
		if p, _, err := consulB.Client(t).KV().Get(kvPrefix+"config/adopt", nil); err != nil || p != nil {
			t.Fatalf("%s: B's %sconfig/adopt = %v (err %v), want none written", when, kvPrefix, p, err)
		}
	}
	unchanged("before any adoption")

	// 1. The HTTP port, as 0.15.0 adopted: no credential, B's ID (shown by
	// /v1/cluster). 410, nothing adopted.
	for _, h := range hs {
		resp, err := http.Post("http://"+h.HTTPAddr+"/v1/consul/adopt", "application/json", strings.NewReader(`{"cluster":"`+idB+`"}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusGone {
			t.Errorf("%s: POST /v1/consul/adopt = HTTP %d, want 410", h.NodeID, resp.StatusCode)
		}
	}

	// 2. adopt-consul into B without a writer's token: no token (Consul's
	// anonymous token), then the replicas' own read token.
	op := leader.Operator()
	op.ConsulAddr = consulB.Addr()
	plan := op.RunExit(t, 2, "adopt-consul")
	if !strings.Contains(plan, "--cluster "+idB) || !strings.Contains(plan, "writer") {
		t.Errorf("adopt-consul without --cluster does not show the command with the writer's token:\n%s", plan)
	}
	for _, tc := range []struct{ name, token string }{{"no token", ""}, {"the replicas' read token", readB.SecretID}} {
		o := op
		o.Env = append(o.Env, "CONSUL_HTTP_TOKEN="+tc.token)
		out := o.RunExit(t, 5, "adopt-consul", "--cluster", idB, "--timeout", "10s")
		t.Logf("adopt-consul with %s: %s", tc.name, out)
		if !strings.Contains(out, "permission denied") || !strings.Contains(out, "nothing adopted") || !strings.Contains(out, kvPrefix+"config/") {
			t.Errorf("adopt-consul with %s: exit 5 but the message does not say permission denied, nothing adopted and the rule:\n%s", tc.name, out)
		}
	}
	// A's writer token is no writer of B.
	o := op
	o.Env = append(o.Env, "CONSUL_HTTP_TOKEN="+writerA.SecretID)
	if out := o.RunExit(t, 5, "adopt-consul", "--cluster", idB, "--timeout", "10s"); !strings.Contains(out, "nothing adopted") {
		t.Errorf("adopt-consul with A's writer token into B: %s", out)
	}
	// Long enough for the leader's watch to read B again several times
	// (it retries every 5s at most while refusing B's reads).
	testenv.Consistently(t, 6*time.Second, func() error {
		for _, h := range hs {
			if src := h.Cluster(t).Source; src == nil || *src != *recorded {
				return fmt.Errorf("%s records %v, want A's %v", h.NodeID, src, recorded)
			}
		}
		return nil
	})
	unchanged("after every attempt without a writer's token")

	// 3. With B's writer token (the shipped writer policy): adopted.
	w := op
	w.Env = append(w.Env, "CONSUL_HTTP_TOKEN="+writerB.SecretID)
	out := w.Run(t, "adopt-consul", "--cluster", idB, "--reason", "DR fail-over drill", "--timeout", "30s")
	t.Logf("adopt-consul with B's writer token:\n%s", out)
	if !strings.Contains(out, "adopted: raft records cluster "+idB) {
		t.Errorf("adopt-consul with the writer token does not say it adopted %s:\n%s", idB, out)
	}
	if _, err := waitAllAnswer(hs, "web/s1", "maint", 20*time.Second); err != nil {
		t.Fatalf("after the adoption: %v", err)
	}
	if _, err := waitAllAnswer(hs, "api/a1", "ready 100%", 20*time.Second); err != nil {
		t.Fatalf("after the adoption: %v", err)
	}
	for _, h := range hs {
		if src := h.Cluster(t).Source; src == nil || src.ClusterID != idB {
			t.Errorf("%s records %v after the adoption, want cluster %s", h.NodeID, src, idB)
		}
	}
	// Run again, it has nothing to do.
	if out := w.Run(t, "adopt-consul", "--cluster", idB); !strings.Contains(out, "nothing to adopt") {
		t.Errorf("adopt-consul again: %s", out)
	}
}
