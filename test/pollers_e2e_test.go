package test

import (
	"strings"
	"testing"
	"time"

	"github.com/hastate/hastate/internal/testenv"
)

// The runbook of a deploy: precheck, drain, wait until every HAProxy saw
// it, deploy, clear, precheck again.
func TestE2EPollersWaitPrecheck(t *testing.T) {
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	hs := StartCluster(t, 3, HastateOptions{ConsulAddr: consul.Addr()})
	hap := StartHAProxyLB(t, hs, beWeb, beAPI)
	addr := "http://" + hs[0].HTTPAddr
	op := Operator{ConsulAddr: consul.Addr(), Addr: addr}

	// Every replica sees HAProxy's polls through the load balancer, and the
	// cluster scope merges them.
	type pollers struct {
		Scope   string `json:"scope"`
		Pollers []struct {
			HAProxy, Backend, Server, Answer, Replica string
		} `json:"pollers"`
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		var p pollers
		hs[0].GetJSON(t, "/v1/pollers?scope=cluster", &p)
		replicas := map[string]bool{}
		for _, x := range p.Pollers {
			if x.Backend+"/"+x.Server == "be_web/web1" && x.HAProxy == "127.0.0.1" && x.Answer == "ready 100%" {
				replicas[x.Replica] = true
			}
		}
		return testenv.Expect(p.Scope == "cluster" && len(replicas) == 3, "be_web/web1 not polled on all three replicas")
	})

	if out, code := op.RunCode(t, "precheck", "be_web/*"); code != 0 || !strings.Contains(out, "ok: 2 selected servers") {
		t.Fatalf("precheck before the drain: exit %d\n%s", code, out)
	}
	op.Run(t, "drain", "be_web/*", "--reason", "deploy")
	start := time.Now()
	out := op.Run(t, "wait", "be_web/*", "--timeout", "30s")
	t.Logf("hastate wait returned after %s: %s", time.Since(start).Round(time.Millisecond), strings.TrimSpace(out))
	// wait returned: HAProxy has already applied the drain.
	for _, s := range []string{"be_web/web1", "be_web/web2"} {
		if r := hap.Server(t, s); r.Status != statDrainAgent {
			t.Fatalf("hastate wait returned but HAProxy shows %s: %s", s, r)
		}
	}
	if out, code := op.RunCode(t, "precheck", "be_web/*"); code != 1 || !strings.Contains(out, "be_web/web1 is drained") || !strings.Contains(out, "deploy") {
		t.Fatalf("precheck during the drain: exit %d\n%s", code, out)
	}
	if out, code := op.RunCode(t, "precheck", "be_api/*"); code != 0 {
		t.Fatalf("precheck of an untouched backend: exit %d\n%s", code, out)
	}
	// A server nobody drained but HAProxy polls is known to status.
	if out := op.Run(t, "status", "be_api/api2"); !strings.Contains(out, "api2") {
		t.Fatalf("status does not list a polled server without a key:\n%s", out)
	}

	op.Run(t, "clear", "be_web/*")
	op.Run(t, "wait", "be_web/*", "--timeout", "30s")
	if out, code := op.RunCode(t, "precheck", "be_web/*"); code != 0 {
		t.Fatalf("precheck after the clear: exit %d\n%s", code, out)
	}

	// wait gives up, exit 1, naming the laggard, when an HAProxy cannot be
	// served: stop the replicas' answers by stopping HAProxy's view.
	hap.Stop(t)
	op.Run(t, "drain", "be_api/api1")
	out, code := op.RunCode(t, "wait", "be_api/api1", "--timeout", "3s")
	if code != 1 || !strings.Contains(out, "HAProxy 127.0.0.1 for be_api/api1") {
		t.Fatalf("wait with HAProxy gone: exit %d\n%s", code, out)
	}
}
