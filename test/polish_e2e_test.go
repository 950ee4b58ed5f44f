package test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/internal/testenv"
)

// Issue 27.4: an invalid <prefix>config/ramp is visible on every replica,
// not only on the one that leads: hastate_ramp_policy_invalid is 1
// through each of them, and `hastate status` and the status page, asked
// of a follower, name the key and why it is ignored.
func TestE2EInvalidRampPolicyIsVisibleOnEveryReplica(t *testing.T) {
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	hs := StartCluster(t, 3, HastateOptions{ConsulAddr: consul.Addr()})
	leader := WaitLeader(t, 10*time.Second, hs...)
	follower := others(hs, leader)[0]
	consul.Put(t, kvPrefix+"config/ramp", `{"interval":"0"}`)
	for _, h := range hs {
		testenv.Eventually(t, 10*time.Second, func() error {
			got := h.Metric(t, "hastate_ramp_policy_invalid")
			return testenv.Expect(got == 1, "%s: hastate_ramp_policy_invalid = %v, want 1", h.NodeID, got)
		})
	}
	op := Operator{ConsulAddr: consul.Addr(), Env: []string{"HASTATE_ADDR=" + follower.HTTPAddr}}
	out := op.Run(t, "status")
	if !strings.Contains(out, "invalid key config/ramp: invalid ramp policy") || !strings.Contains(out, "the --ramp-* flags apply") {
		t.Errorf("hastate status through follower %s does not show the invalid ramp policy:\n%s", follower.NodeID, out)
	}
	code, page, err := follower.get("/")
	if err != nil || code != 200 {
		t.Fatalf("GET / on %s: %d %v", follower.NodeID, code, err)
	}
	for _, want := range []string{"config/ramp", "ignored: the --ramp-* flags apply", "1 invalid key"} {
		if !strings.Contains(string(page), want) {
			t.Errorf("the status page of follower %s lacks %q", follower.NodeID, want)
		}
	}
	consul.Put(t, kvPrefix+"config/ramp", `{"interval":"5s"}`)
	for _, h := range hs {
		testenv.Eventually(t, 10*time.Second, func() error {
			got := h.Metric(t, "hastate_ramp_policy_invalid")
			return testenv.Expect(got == 0, "%s: hastate_ramp_policy_invalid = %v after the fix, want 0", h.NodeID, got)
		})
	}
	if out := op.Run(t, "status"); strings.Contains(out, "config/ramp") {
		t.Errorf("a valid ramp policy still shows in status:\n%s", out)
	}
}

// polishRun runs `hastate args...` as an operator would, pointed at the
// replica h and at consul, with no flag added, and returns its combined
// output and exit code.
func polishRun(t *testing.T, h *Hastate, consulAddr string, args ...string) (string, int) {
	t.Helper()
	op := Operator{ConsulAddr: consulAddr, Addr: h.HTTPAddr, Env: []string{"HASTATE_KV_PREFIX=" + kvPrefix}}
	return op.RunCode(t, args...)
}

// waitRow waits until the replica's row of backend/server satisfies ok.
func waitRow(t *testing.T, h *Hastate, backend, server string, ok func(api.ServerState) bool) api.ServerState {
	t.Helper()
	var row api.ServerState
	testenv.Eventually(t, 10*time.Second, func() error {
		var v api.StateView
		h.GetJSON(t, "/v1/state", &v)
		for _, r := range v.Servers {
			if r.Backend == backend && r.Server == server {
				row = r
				return testenv.Expect(ok(r), "%s/%s: %+v", backend, server, r)
			}
		}
		return fmt.Errorf("no row %s/%s", backend, server)
	})
	return row
}

// Issue 27.2: `ready canary_web --ramp 90s` must end as no key, or say
// plainly what it left; and the ready key it leaves pins no server that
// is readied under it.
func TestE2EBackendWideReadyWithARamp(t *testing.T) {
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	h := StartHastate(t, HastateOptions{ConsulAddr: consul.Addr()})
	consul.Put(t, stateKey("canary_web/web-1"), "100%") // known servers
	consul.Put(t, stateKey("canary_web/web-2"), "100%")
	if out, code := polishRun(t, h, consul.Addr(), "drain", "canary_web", "--override", "--force"); code != 0 {
		t.Fatalf("drain canary_web: exit %d\n%s", code, out)
	}
	waitRow(t, h, "canary_web", "*", func(r api.ServerState) bool { return r.Kind == api.KindDrain })
	out, code := polishRun(t, h, consul.Addr(), "ready", "canary_web", "--ramp", "90s", "--force")
	if code != 0 {
		t.Fatalf("ready canary_web --ramp 90s: exit %d\n%s", code, out)
	}
	t.Logf("ready canary_web --ramp 90s:\n%s", out)
	if !strings.Contains(out, "stays after the ramp") || !strings.Contains(out, "`hastate clear --ramped` deletes it once it has ramped") {
		t.Errorf("ready --ramp of a whole backend does not say what it leaves:\n%s", out)
	}
	waitRow(t, h, "canary_web", "*", func(r api.ServerState) bool { return r.Kind == api.KindRamping })
	out, code = polishRun(t, h, consul.Addr(), "ready", "canary_web/web-2", "--force")
	if code != 0 {
		t.Fatalf("ready canary_web/web-2: exit %d\n%s", code, out)
	}
	if v := kvGet(t, consul, stateKey("canary_web/web-2")); v != "" {
		t.Errorf("ready canary_web/web-2 under the ramping ready key wrote %q, pinning it out of backend-wide drains:\n%s", v, out)
	}
}

// Issue 27.14: a backend-wide drain that leaves no server of the backend
// in rotation says so, in the output and in its meta key.
func TestE2EBackendWideDrainThatEmptiesTheBackendSaysSo(t *testing.T) {
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	h := StartHastate(t, HastateOptions{ConsulAddr: consul.Addr()})
	consul.Put(t, stateKey("shop/s1"), "50%")
	consul.Put(t, stateKey("shop/s2"), "drain")
	waitRow(t, h, "shop", "s2", func(r api.ServerState) bool { return r.Kind == api.KindDrain })
	out, code := polishRun(t, h, consul.Addr(), "drain", "shop", "--override", "--reason", "move", "--force")
	if code != 0 {
		t.Fatalf("drain shop: exit %d\n%s", code, out)
	}
	t.Logf("drain shop --override:\n%s", out)
	if !strings.Contains(out, "no server of shop in rotation") || !strings.Contains(out, "no server available") {
		t.Errorf("a drain that leaves shop no server in rotation does not say so:\n%s", out)
	}
	if meta := kvGet(t, consul, kvPrefix+"meta/shop/*"); !strings.Contains(meta, `"effect":"no server of shop in rotation"`) {
		t.Errorf("meta key of shop/*: %s; want its effect recorded", meta)
	}
}

// Issue 27.7: the demo's `drain 'canary_*/*' --dry-run` is refused when a
// server's own key would escape it, and the dry run shows the transaction
// it refused.
func TestE2EDryRunShowsTheTransactionItRefused(t *testing.T) {
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	h := StartHastate(t, HastateOptions{ConsulAddr: consul.Addr()})
	consul.Put(t, stateKey("canary_web/web-2"), "drain")
	consul.Put(t, stateKey("canary_api/api-1"), "50%")
	waitRow(t, h, "canary_api", "api-1", func(r api.ServerState) bool { return r.Kind == api.KindWeight })
	out, code := polishRun(t, h, consul.Addr(), "drain", "canary_*/*", "--dry-run", "--force")
	t.Logf("drain 'canary_*/*' --dry-run: exit %d\n%s", code, out)
	if code != 1 || !strings.Contains(out, "api-1 keeps 50%") {
		t.Fatalf("want the refusal (exit 1) naming api-1's own 50%%")
	}
	for _, want := range []string{"the transaction it refused", "set    " + kvPrefix + "state/canary_api/* = drain", "set    " + kvPrefix + "state/canary_web/* = drain"} {
		if !strings.Contains(out, want) {
			t.Errorf("the refused dry run does not show %q", want)
		}
	}
	if out, code := polishRun(t, h, consul.Addr(), "drain", "canary_*/*", "--dry-run", "--keep-own", "--force"); code != 0 {
		t.Errorf("with --keep-own the dry run goes through: exit %d\n%s", code, out)
	}
}

// kvGet is key's value in Consul ("" when absent).
func kvGet(t *testing.T, consul *testenv.Consul, key string) string {
	t.Helper()
	p, _, err := consul.Client(t).KV().Get(key, nil)
	if err != nil {
		t.Fatalf("consul get %s: %v", key, err)
	}
	if p == nil {
		return ""
	}
	return string(p.Value)
}
