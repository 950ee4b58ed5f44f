package test

// A check of issue 22 that compiles against the harness before and after
// it (Operator{ConsulAddr, Env} only): run in a tree of 6bab943 it must
// fail, in the branch it must pass.

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hastate/hastate/internal/testenv"
)

func TestIssue22Check(t *testing.T) {
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	h := StartHastate(t, HastateOptions{ConsulAddr: consul.Addr()})
	StartHAProxy(t, h.AgentAddr, Backend{Name: "gw", Servers: []string{"s1", "s2"}})
	testenv.Eventually(t, 30*time.Second, func() error {
		var v stateView
		h.GetJSON(t, "/v1/state?scope=cluster", &v)
		n := 0
		for _, r := range v.Servers {
			if r.Polled > 0 {
				n++
			}
		}
		return testenv.Expect(n == 2, "not polled yet")
	})
	op := Operator{ConsulAddr: consul.Addr(), Env: []string{"HASTATE_ADDR=" + h.HTTPAddr}}
	get := func(k string) string {
		p, _, _ := consul.Client(t).KV().Get("hastate/state/"+k, nil)
		if p == nil {
			return ""
		}
		return string(p.Value)
	}
	t.Run("1 wrong prefix", func(t *testing.T) {
		wrong := Operator{ConsulAddr: consul.Addr(), Env: []string{"HASTATE_ADDR=" + h.HTTPAddr, "HASTATE_KV_PREFIX=gitlab-haproxy-agent/"}}
		out, code := wrong.RunCode(t, "weight", "50%", "gw/s2", "--force")
		keys, _, _ := consul.Client(t).KV().Keys("gitlab-haproxy-agent/", "", nil)
		if code == 0 || len(keys) > 0 || !strings.Contains(out, "hastate/") || !strings.Contains(out, "gitlab-haproxy-agent/") {
			t.Errorf("a write to a prefix no replica reads: exit %d, keys %v:\n%s", code, keys, out)
		}
	})
	t.Run("2 stale views", func(t *testing.T) {
		bad := 0
		for i := range 5 {
			op.Run(t, "weight", "50%", "gw/s2", "--force")
			out, code := op.RunCode(t, "drain", "gw/*", "--force")
			if code == 0 || get("gw/*") != "" {
				bad++
				t.Errorf("round %d: weight 50%% gw/s2 then drain gw/* --force: exit %d, gw/*=%q (s2 escapes it):\n%s", i, code, get("gw/*"), out)
			}
			op.Run(t, "clear", "gw/*", "gw/s2", "--force")
			op.Run(t, "weight", "50%", "gw/s1", "--force")
			h.WaitAnswer(t, "gw/s1", "ready 50%")
			op.Run(t, "drain", "gw/*", "--keep-own", "--force")
			op.Run(t, "ready", "gw/s1", "--force")
			if got := get("gw/s1"); got != "ready" {
				bad++
				t.Errorf("round %d: ready gw/s1 at once after drain gw/*: Consul holds %q for gw/s1 (want ready: a delete leaves it drained)", i, got)
			}
			op.Run(t, "clear", "gw/*", "gw/s1", "--force")
		}
		t.Logf("stale-view rounds gone wrong: %d of 10", bad)
	})
	t.Run("3 the Operator adds no flag", func(t *testing.T) {
		if out, code := op.RunCode(t, "drain", "gw/typo"); code == 0 {
			t.Errorf("a write for a server no HAProxy polls went through:\n%s", out)
		}
		// Nothing was written, and clear of a name no key and no
		// server has is a typo (exit 3), --force or not.
		op.RunExit(t, 3, "clear", "gw/typo", "--force")
	})
	t.Run("5 --force names each lifted guard", func(t *testing.T) {
		op.Run(t, "drain", "gw/s2", "--force")
		out := op.Run(t, "drain", "gw/s1", "--force", "--dry-run")
		if !strings.Contains(out, "capacity") || !strings.Contains(out, "gw would have 0 ready") {
			t.Errorf("drain gw/s1 --force --dry-run with s2 drained passed silently:\n%s", out)
		}
	})
	t.Run("7 exit 4 = cannot confirm", func(t *testing.T) {
		_, drained := op.RunCode(t, "precheck", "gw/s2")
		dead := Operator{ConsulAddr: consul.Addr(), Env: []string{"HASTATE_ADDR=127.0.0.1:1"}}
		_, unreachable := dead.RunCode(t, "precheck", "gw/s2")
		noConsul := Operator{ConsulAddr: "127.0.0.1:1", Env: []string{"HASTATE_ADDR=" + h.HTTPAddr}}
		_, consulDown := noConsul.RunCode(t, "precheck", "gw/s2")
		if got := fmt.Sprint(drained, unreachable, consulDown); got != "1 4 4" {
			t.Errorf("precheck exit codes drained, replica unreachable, Consul unreachable: %s, want 1 4 4", got)
		}
	})
}
