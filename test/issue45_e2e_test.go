package test

import (
	"strings"
	"testing"
	"time"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/internal/testenv"
)

// Issue 45: `consul kv put hastate/state/canary_web/web-2 300%` (the
// runbook's own write path), then `hastate wait canary_web/web-2` exited 0
// ("every HAProxy polling canary_web/web-2 was told the current answer")
// while every replica withheld the answer, and precheck said "cannot
// confirm" with exit 1. Both now fail at once with exit 1, in the same
// words, naming the key and the fix; once the key is fixed both pass.
func TestE2EWaitAndPrecheckOnAWithheldAnswer(t *testing.T) {
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	hs := StartCluster(t, 1, HastateOptions{ConsulAddr: consul.Addr()})
	StartHAProxyLB(t, hs, Backend{Name: "canary_web", Servers: []string{"web-1", "web-2"}})
	op := hs[0].Operator()
	waitRow(t, hs[0], "canary_web", "web-2", func(r api.ServerState) bool { return r.Polled > 0 })

	consul.Put(t, stateKey("canary_web/web-2"), "300%")
	waitRow(t, hs[0], "canary_web", "web-2", func(r api.ServerState) bool { return r.Kind == api.KindWithheld })
	why := `canary_web/web-2: not told: every replica withholds its answer (HAProxy keeps its last state), because key ` +
		stateKey("canary_web/web-2") + ` holds "300%", which is invalid`
	fix := "fix the key: hastate ready|drain|maint canary_web/web-2, hastate weight <N>% canary_web/web-2, or hastate clear canary_web/web-2"
	start := time.Now()
	out := op.RunExit(t, 1, "wait", "canary_web/web-2", "--timeout", "20s")
	if took := time.Since(start); !strings.Contains(out, why) || !strings.Contains(out, fix) || strings.Contains(out, "was told") || took > 10*time.Second {
		t.Errorf("wait for a withheld answer (%s):\n%s\nwant exit 1 at once with %q and %q", took.Round(time.Millisecond), out, why, fix)
	}
	out = op.RunExit(t, 1, "precheck", "canary_web/web-2")
	if !strings.Contains(out, why) || !strings.Contains(out, fix) || strings.Contains(out, "cannot confirm") {
		t.Errorf("precheck of a withheld answer:\n%s\nwant exit 1 with %q and %q, not \"cannot confirm\"", out, why, fix)
	}
	t.Logf("wait and precheck of a withheld answer:\n%s", out)

	consul.Put(t, stateKey("canary_web/web-2"), "drain")
	op.Run(t, "wait", "canary_web/web-2")
	op.RunExit(t, 1, "precheck", "canary_web/web-2") // drained: blocked, no longer withheld
}

// Issue 45: two replicas of three killed. Through the load balancer,
// status printed HAProxy's "HTTP 503: <html>..."; straight to the survivor
// it exited 0 with a normal table, a Consul warning and "the replicas that
// are up decide"; precheck waited its whole --timeout and blamed Consul.
// Now: through the load balancer "no replica is ready" (exit 4); straight
// to the survivor status says first that there is no raft leader, what
// HAProxy does and the runbook section; precheck says so too, at once.
func TestE2EQuorumLostIsSaidByTheCLI(t *testing.T) {
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	hs := StartCluster(t, 3, HastateOptions{ConsulAddr: consul.Addr()})
	lb := startHTTPLBMode(t, hs, "http")
	tcpLB := startHTTPLB(t, hs) // mode tcp: it closes the connection instead
	survivor := hs[0]
	survivor.Operator("--allow-unknown").Run(t, "drain", "canary_web/web-1")
	waitRow(t, survivor, "canary_web", "web-1", func(r api.ServerState) bool { return r.Kind == api.KindDrain })
	for _, h := range hs[1:] {
		h.Kill()
	}
	testenv.Eventually(t, 30*time.Second, func() error {
		code, rd := survivor.Readiness(t)
		return testenv.Expect(code == 503, "the survivor without quorum: /-/readiness %d %q, want 503", code, rd.Detail)
	})

	throughLB := survivor.Operator()
	throughLB.Addr = lb
	var lbOut string
	testenv.Eventually(t, 10*time.Second, func() error {
		out, code := throughLB.RunCode(t, "status")
		lbOut = out
		return testenv.Expect(code == 4 && strings.HasPrefix(out, "hastate: no replica is ready: http://"+lb+" answered HTTP 503") && !strings.Contains(out, "<html>"),
			"status through the load balancer: exit %d:\n%q", code, out)
	})

	throughTCP := survivor.Operator()
	throughTCP.Addr = tcpLB
	testenv.Eventually(t, 10*time.Second, func() error {
		out, code := throughTCP.RunCode(t, "status")
		return testenv.Expect(code == 4 && strings.HasPrefix(out, "hastate: http://"+tcpLB+" closed the connection without an answer: if it is a load balancer, no replica behind it may be ready"),
			"status through a TCP load balancer: exit %d:\n%q", code, out)
	})

	op := survivor.Operator()
	out, code := op.RunCode(t, "status")
	first, _, _ := strings.Cut(out, "\n")
	if code != 0 || !strings.HasPrefix(first, "warning: no raft leader: replica "+survivor.NodeID+" has known no leader for") ||
		!strings.Contains(first, "HAProxy keeps each server's last state") || !strings.Contains(first, `docs/runbook.md, "HastateNoLeader"`) ||
		strings.Contains(out, "the replicas that are up decide") || !strings.Contains(out, "web-1") {
		t.Errorf("status straight to the survivor: exit %d:\n%s\nwant the table after a first line saying there is no raft leader", code, out)
	}
	start := time.Now()
	out, code = op.RunCode(t, "precheck", "canary_web/web-1", "--timeout", "20s")
	if took := time.Since(start); code != 4 || !strings.HasPrefix(out, "hastate: no raft leader:") || strings.Contains(out, "Consul") || took > 10*time.Second {
		t.Errorf("precheck without a leader: exit %d after %s:\n%s\nwant exit 4 at once, saying there is no raft leader", code, took.Round(time.Millisecond), out)
	}
	t.Logf("through the load balancer, status says:\n%s\nstraight to the survivor, precheck says:\n%s", lbOut, out)
}
