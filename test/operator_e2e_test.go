package test

import (
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hastate/hastate/internal/testenv"
)

// The fleet of the operator tests: two canary backends, and a server
// (gke-cny-web) in two main backends, one of them zonal.
var (
	opCanaryWeb = Backend{Name: "canary_web", Servers: []string{"web-1", "web-2"}}
	opCanaryAPI = Backend{Name: "canary_api", Servers: []string{"api-1", "api-2"}}
	opMainWeb   = Backend{Name: "main_web", Servers: []string{"web-1", "gke-cny-web"}}
	opMainAPI   = Backend{Name: "main_api", Servers: []string{"gke-cny-web", "api-us-east1-b", "api-us-east1-c"}}
)

// stateKeys lists the keys under <prefix>state/ in Consul, relative to it.
func stateKeys(t *testing.T, consul *testenv.Consul) []string {
	t.Helper()
	keys, _, err := consul.Client(t).KV().Keys(kvPrefix+"state/", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range keys {
		keys[i] = strings.TrimPrefix(keys[i], kvPrefix+"state/")
	}
	slices.Sort(keys)
	return keys
}

// TestE2EOperatorWorkflowsAndGates runs the operators' workflows against
// three replicas and two HAProxy nodes: the canary drain, one server across
// backends, a zonal drain; the refusals that write nothing; the gates
// (precheck, wait) with the deploy contract, an HAProxy that stops
// answering, and a replica that is down.
func TestE2EOperatorWorkflowsAndGates(t *testing.T) {
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	hs := StartCluster(t, 3, HastateOptions{ConsulAddr: consul.Addr()})
	backends := []Backend{opCanaryWeb, opCanaryAPI, opMainWeb, opMainAPI}
	hapA := StartHAProxyLBFrom(t, hs, "127.0.0.2", backends...)
	hapB := StartHAProxyLBFrom(t, hs, "127.0.0.3", backends...)
	op := Operator{ConsulAddr: consul.Addr(), Env: []string{"HASTATE_ADDR=" + hs[1].HTTPAddr}, Checks: true}
	run := func(want int, args ...string) string { t.Helper(); return op.RunExit(t, want, args...) }
	keysAre := func(step string, want ...string) {
		t.Helper()
		slices.Sort(want)
		if got := stateKeys(t, consul); !slices.Equal(got, want) {
			t.Fatalf("%s: keys in Consul %q, want %q", step, got, want)
		}
	}
	// Both HAProxy nodes poll every server, seen through any replica.
	testenv.Eventually(t, 20*time.Second, func() error {
		var v stateView
		hs[2].GetJSON(t, "/v1/state?scope=cluster", &v)
		n := 0
		for _, r := range v.Servers {
			if r.Polled == 2 {
				n++
			}
		}
		return testenv.Expect(n == 9, "the nine servers are not each polled by both HAProxy nodes")
	})

	// A typo is a usage of its own: no server matches, exit 3, nothing
	// written; a precheck of it does not pass.
	out := run(3, "precheck", "canary_wbe/web-1")
	if !strings.Contains(out, "no server matches 'canary_wbe/web-1'; known backends: canary_api, canary_web, main_api, main_web") {
		t.Errorf("precheck of a typo: %s", out)
	}
	run(3, "drain", "canary_wbe*/*")
	out = run(1, "drain", "canary_web/web1")
	if !strings.Contains(out, "no HAProxy has polled canary_web/web1") || !strings.Contains(out, "web-1, web-2") {
		t.Errorf("drain of a server nobody polls: %s", out)
	}
	keysAre("after the refusals")
	run(0, "precheck", "canary_*/*")

	// The release managers' canary drain: one backend-wide key per canary
	// backend, in one transaction, after a dry run that writes nothing.
	out = run(0, "drain", "canary_*/*", "--reason", "release 16.4", "--dry-run")
	if !strings.Contains(out, "dry run, nothing written") || !strings.Contains(out, kvPrefix+"state/canary_api/*") {
		t.Errorf("dry run: %s", out)
	}
	keysAre("after the dry run")
	start := time.Now()
	run(0, "drain", "canary_*/*", "--reason", "release 16.4")
	keysAre("after the canary drain", "canary_api/*", "canary_web/*")
	out = run(0, "wait", "canary_*/*", "--timeout", "30s")
	t.Logf("canary drain: wait returned %s after the write: %s", time.Since(start).Round(time.Millisecond), strings.TrimSpace(out))
	// wait returned: both HAProxy nodes have applied it.
	for _, hap := range []*HAProxy{hapA, hapB} {
		for _, b := range []Backend{opCanaryWeb, opCanaryAPI} {
			for _, s := range b.Servers {
				if r := hap.Server(t, b.Name+"/"+s); r.Status != statDrainAgent {
					t.Fatalf("wait returned but an HAProxy shows %s/%s: %s", b.Name, s, r)
				}
			}
		}
	}
	out = run(1, "precheck", "canary_*/*")
	if !strings.Contains(out, "canary_web/web-1 is drained") || !strings.Contains(out, "release 16.4") {
		t.Errorf("precheck during the canary drain: %s", out)
	}
	// The same answers whichever replica the gates reach.
	for _, h := range hs {
		at := Operator{ConsulAddr: consul.Addr(), Env: []string{"HASTATE_ADDR=" + h.HTTPAddr}}
		for args, want := range map[string]int{"precheck canary_*/*": 1, "precheck main_*/*": 0, "precheck canary_wbe/web-1": 3,
			"wait canary_*/* --timeout 10s": 0, "wait canary_wbe/* --timeout 10s": 3} {
			if out, code := at.RunCode(t, strings.Fields(args)...); code != want {
				t.Errorf("through %s: hastate %s: exit %d, want %d:\n%s", h.NodeID, args, code, want, out)
			}
		}
	}

	// The SRE's server drain across every backend that has it.
	run(0, "drain", "*/gke-cny-web", "--reason", "node upgrade")
	keysAre("after the server drain", "canary_api/*", "canary_web/*", "main_api/gke-cny-web", "main_web/gke-cny-web")
	// main_web's last ready server is not taken out by mistake; maint
	// passes the deploy contract, drain does not.
	if out := run(1, "maint", "main_web/web-1"); !strings.Contains(out, "main_web would have 0 ready") {
		t.Errorf("maint of the last ready server: %s", out)
	}
	run(0, "maint", "main_web/web-1", "--force")
	run(0, "precheck", "main_web/web-1")
	run(1, "precheck", "main_web/*")

	// A zonal drain that would leave main_api with no ready server is
	// refused whole; --force takes it.
	out = run(1, "drain", "*/*-us-east1-*")
	if !strings.Contains(out, "main_api would have 0 ready") {
		t.Errorf("zonal drain leaving no ready server: %s", out)
	}
	keysAre("after the min-ready refusal", "canary_api/*", "canary_web/*", "main_api/gke-cny-web", "main_web/gke-cny-web", "main_web/web-1")
	run(0, "drain", "*/*-us-east1-b")
	keysAre("after the zonal drain", "canary_api/*", "canary_web/*", "main_api/api-us-east1-b", "main_api/gke-cny-web", "main_web/gke-cny-web", "main_web/web-1")

	// A state for 3 seconds comes back by itself on every replica, with no
	// KV write.
	run(0, "weight", "50%", "main_api/api-us-east1-c", "--for", "3s")
	wrote := time.Now()
	if _, err := waitAllAnswer(hs, "main_api/api-us-east1-c", "ready 50%", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	back, err := waitAllAnswer(hs, "main_api/api-us-east1-c", "ready 100%", 15*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if took := back.Sub(wrote); took < 2*time.Second {
		t.Errorf("--for 3s ended after %s", took)
	}
	t.Logf("--for 3s: every replica answered ready 100%% again %s after the write", back.Sub(wrote).Round(time.Millisecond))
	keysAre("after the expiry", "canary_api/*", "canary_web/*", "main_api/api-us-east1-b", "main_api/api-us-east1-c", "main_api/gke-cny-web", "main_web/gke-cny-web", "main_web/web-1")
	if out := run(0, "status", "main_api/api-us-east1-c"); !strings.Contains(out, "expired: state/main_api/api-us-east1-c") {
		t.Errorf("status of an expired key:\n%s", out)
	}

	// clear of what does not exist says so and writes nothing.
	if out := run(0, "clear", "canary_web/web-2"); !strings.Contains(out, "nothing to clear") {
		t.Errorf("clear of an absent key: %s", out)
	}

	// One HAProxy stops answering (SIGSTOP): wait names it.
	hapB.Signal(t, syscall.SIGSTOP)
	run(0, "clear", "main_web/web-1")
	out = run(1, "wait", "main_web/web-1", "--timeout", "4s")
	if _, last, _ := strings.Cut(out, "still waiting for:"); !strings.Contains(last, "HAProxy 127.0.0.3 for main_web/web-1") || strings.Contains(last, "HAProxy 127.0.0.2") {
		t.Errorf("wait with one HAProxy frozen: %s", out)
	}
	hapB.Signal(t, syscall.SIGCONT)
	run(0, "wait", "main_web/web-1", "--timeout", "30s")

	// A replica is down: the gates cannot confirm and name it.
	hs[2].Kill()
	out = run(1, "precheck", "main_web/web-1")
	if !strings.Contains(out, fmt.Sprintf("cannot confirm: replica %s unreachable", hs[2].NodeID)) {
		t.Errorf("precheck with a replica down: %s", out)
	}
	out = run(1, "wait", "main_web/web-1", "--timeout", "3s")
	if !strings.Contains(out, fmt.Sprintf("replica %s unreachable", hs[2].NodeID)) {
		t.Errorf("wait with a replica down: %s", out)
	}
}
