package test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
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
	// Ramps are off unless a key asks for one (--ramp), with steps every
	// second.
	hs := StartCluster(t, 3, HastateOptions{ConsulAddr: consul.Addr(), Args: []string{"--ramp-interval", "1s"}})
	backends := []Backend{opCanaryWeb, opCanaryAPI, opMainWeb, opMainAPI}
	hapA := StartHAProxyLBFrom(t, hs, "127.0.0.2", backends...)
	hapB := StartHAProxyLBFrom(t, hs, "127.0.0.3", backends...)
	op := hs[1].Operator()
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
	if !strings.Contains(out, "no server matches 'canary_wbe/web-1'; did you mean canary_web/web-1?; known backends: canary_api, canary_web, main_api, main_web") {
		t.Errorf("precheck of a typo: %s", out)
	}
	run(3, "drain", "canary_wbe*/*")
	out = run(3, "drain", "canary_web/web1")
	if !strings.Contains(out, "no HAProxy has polled canary_web/web1") || !strings.Contains(out, "web-1, web-2") {
		t.Errorf("drain of a server nobody polls: %s", out)
	}
	// Issue 15.2: a manual probe does not make a typo a known server.
	if out := run(0, "probe", "canary_web/typo-srv", "--addr", hs[0].AgentAddr); strings.TrimSpace(out) != "ready 100%" {
		t.Errorf("probe of an unknown server: %q", out)
	}
	run(3, "drain", "canary_web/typo-srv")
	// Issue 15.5: every command reads a selector alike; a typo exits 3
	// with the known backends, status included; an unknown command is a
	// usage error.
	for _, args := range [][]string{{"status", "canery_web"}, {"status", "canery_web/*"}, {"drain", "canery_web/web-1"}, {"wait", "canery_web"}, {"precheck", "canery_web"}} {
		if out := run(3, args...); !strings.Contains(out, "known backends: canary_api, canary_web, main_api, main_web") {
			t.Errorf("hastate %s: %s", strings.Join(args, " "), out)
		}
	}
	if out := run(0, "status", "canary_web"); !strings.Contains(out, "web-2") || !strings.Contains(out, "2 of 2 servers in rotation") {
		t.Errorf("status of a backend: %s", out)
	}
	run(2, "stauts")
	// Issue 15.3: weight 0% takes servers out like a drain.
	if out := run(1, "weight", "0%", "canary_web/web-1", "canary_web/web-2"); !strings.Contains(out, "canary_web would have 0 ready") {
		t.Errorf("weight 0%% of a whole backend, server by server: %s", out)
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
		at := h.Operator()
		for args, want := range map[string]int{"precheck canary_*/*": 1, "precheck main_*/*": 0, "precheck canary_wbe/web-1": 3,
			"wait canary_*/* --timeout 10s": 0, "wait canary_wbe/* --timeout 10s": 3} {
			if out, code := at.RunCode(t, strings.Fields(args)...); code != want {
				t.Errorf("through %s: hastate %s: exit %d, want %d:\n%s", h.NodeID, args, code, want, out)
			}
		}
	}

	// Issue 15.4: ready under a backend-wide drain writes ready and says
	// the server now stays out of backend-wide drains; the next canary
	// drain, which it would escape, is refused unless --keep-own (or
	// --override); clear hands it back.
	if out := run(0, "ready", "canary_web/web-1"); !strings.Contains(out, "stays out of backend-wide drains") {
		t.Errorf("ready under a backend-wide drain: %s", out)
	}
	keysAre("after ready under a drain", "canary_api/*", "canary_web/*", "canary_web/web-1")
	if out := run(1, "drain", "canary_*/*", "--reason", "release 16.5"); !strings.Contains(out, "web-1 keeps ready") || !strings.Contains(out, "--keep-own") {
		t.Errorf("a canary drain a canary would escape: %s", out)
	}
	if out := run(0, "drain", "canary_*/*", "--keep-own", "--dry-run"); !strings.Contains(out, "web-1 keeps ready") {
		t.Errorf("a canary drain with --keep-own: %s", out)
	}
	run(0, "clear", "canary_web/web-1")
	keysAre("after the clear", "canary_api/*", "canary_web/*")

	// Issue 15.7: the canary backend comes back over a 4s ramp; wait
	// returns once both HAProxy nodes were told the first step, wait
	// --settled only once the ramp is over.
	run(0, "ready", "canary_web", "--ramp", "4s")
	out = run(0, "wait", "canary_web", "--timeout", "30s")
	if st := run(0, "status", "canary_web"); !strings.Contains(st, "(eta ") {
		t.Errorf("wait returned, and the ramp is over already (it should take 4s):\n%s\n%s", out, st)
	}
	start = time.Now()
	run(0, "wait", "canary_web", "--settled", "--timeout", "30s")
	t.Logf("wait --settled returned %s after the ramp's first step was told", time.Since(start).Round(time.Millisecond))
	if st := run(0, "status", "canary_web"); strings.Contains(st, "(eta ") || !strings.Contains(st, "2 of 2 servers in rotation") {
		t.Errorf("wait --settled returned during the ramp:\n%s", st)
	}

	// The SRE's server drain across every backend that has it.
	run(0, "drain", "*/gke-cny-web", "--reason", "node upgrade")
	keysAre("after the server drain", "canary_api/*", "canary_web/*", "main_api/gke-cny-web", "main_web/gke-cny-web")
	// main_web's last ready server is not taken out by mistake; maint
	// passes the deploy contract, drain does not.
	if out := run(1, "maint", "main_web/web-1"); !strings.Contains(out, "main_web would have 0 ready") {
		t.Errorf("maint of the last ready server: %s", out)
	}
	if out := run(0, "maint", "main_web/web-1", "--allow-below-min-ready"); !strings.Contains(out, "guard lifted: capacity (--allow-below-min-ready); it would have said: main_web would have 0 ready") {
		t.Errorf("a write below --min-ready, allowed, does not name the guard it lifted: %s", out)
	}
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
	// The state's own timestamps (the meta key's at and until), not the
	// test's clock after the CLI returned: under load the CLI may return
	// well after it wrote.
	var meta struct{ At, Until time.Time }
	if p, _, err := consul.Client(t).KV().Get(kvPrefix+"meta/main_api/api-us-east1-c", nil); err != nil || p == nil || json.Unmarshal(p.Value, &meta) != nil || meta.Until.IsZero() {
		t.Fatalf("meta key of the --for write: %+v %v", p, err)
	}
	if _, err := waitAllAnswer(hs, "main_api/api-us-east1-c", "ready 50%", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	back, err := waitAllAnswer(hs, "main_api/api-us-east1-c", "ready 100%", 15*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if back.Before(meta.Until) {
		t.Errorf("--for 3s ended at %s, before its until %s", back.Format(time.RFC3339Nano), meta.Until.Format(time.RFC3339Nano))
	}
	t.Logf("--for 3s: every replica answered ready 100%% again %s after the write's at (%s after its until)", back.Sub(meta.At).Round(time.Millisecond), back.Sub(meta.Until).Round(time.Millisecond))
	keysAre("after the expiry", "canary_api/*", "canary_web/*", "main_api/api-us-east1-b", "main_api/api-us-east1-c", "main_api/gke-cny-web", "main_web/gke-cny-web", "main_web/web-1")
	// Issue 15.12: the expired row shows when, with seconds and zone.
	// Issue 35: not as a problem, but named with the command that removes it.
	if out := run(0, "status", "main_api/api-us-east1-c"); !regexp.MustCompile(`expired \w{3} +\d+ \d\d:\d\d:\d\d \S+`).MatchString(out) ||
		!strings.Contains(out, "1 expired key (--for passed: hastate treats it as absent): state/main_api/api-us-east1-c; `hastate clear --expired` removes it") {
		t.Errorf("status of an expired key:\n%s", out)
	}
	// clear --expired: a typo matches nothing; the dry run names the key;
	// then both keys go in one transaction and the answer stays.
	if out := run(3, "clear", "--expired", "main_apx"); !strings.Contains(out, "did you mean main_api") {
		t.Errorf("clear --expired of a typo:\n%s", out)
	}
	if out := run(0, "clear", "--expired", "main_api", "--dry-run"); !strings.Contains(out, "1 expired key (with their meta keys) would be deleted") ||
		!strings.Contains(out, "delete "+kvPrefix+"state/main_api/api-us-east1-c (50%, expired ") {
		t.Errorf("clear --expired --dry-run:\n%s", out)
	}
	keysAre("after clear --expired --dry-run", "canary_api/*", "canary_web/*", "main_api/api-us-east1-b", "main_api/api-us-east1-c", "main_api/gke-cny-web", "main_web/gke-cny-web", "main_web/web-1")
	out = run(0, "clear", "--expired")
	if !strings.Contains(out, "1 expired key (with their meta keys) deleted in one Consul transaction") {
		t.Errorf("clear --expired:\n%s", out)
	}
	t.Logf("clear --expired:\n%s", out)
	keysAre("after clear --expired", "canary_api/*", "canary_web/*", "main_api/api-us-east1-b", "main_api/gke-cny-web", "main_web/gke-cny-web", "main_web/web-1")
	if p, _, err := consul.Client(t).KV().Get(kvPrefix+"meta/main_api/api-us-east1-c", nil); err != nil || p != nil {
		t.Errorf("the meta key after clear --expired: %+v %v", p, err)
	}
	// status reads the replica's copy, which takes the deletion a moment
	// after Consul (clear --expired does not wait for it).
	testenv.Eventually(t, 10*time.Second, func() error {
		out := run(0, "status", "main_api/api-us-east1-c")
		return testenv.Expect(!strings.Contains(out, "expired"), "status after clear --expired still says expired:\n%s", out)
	})
	for _, h := range hs {
		if got := h.Ask(t, "main_api/api-us-east1-c"); got != "ready 100%" {
			t.Errorf("%s answers %q after clear --expired, want ready 100%% (unchanged)", h.NodeID, got)
		}
	}
	if out := run(0, "clear", "--expired"); !strings.Contains(out, "nothing to clear") {
		t.Errorf("clear --expired with nothing expired:\n%s", out)
	}
	// Issue 15.3: 0% of main_api's last ready server is refused; forced,
	// precheck blocks on it and status counts it as out.
	if out := run(1, "weight", "0%", "main_api/api-us-east1-c"); !strings.Contains(out, "main_api would have 0 ready") {
		t.Errorf("weight 0%% of the last ready server: %s", out)
	}
	run(0, "weight", "0%", "main_api/api-us-east1-c", "--allow-below-min-ready")
	if out := run(1, "precheck", "main_api/api-us-east1-c"); !strings.Contains(out, "is at 0% (HAProxy shows it as DRAIN)") || !strings.Contains(out, "1 of 1 selected server block") {
		t.Errorf("precheck of a server at 0%%: %s", out)
	}
	if out := run(0, "status", "main_api"); !strings.Contains(out, "0 of 3 servers in rotation; out: 2 drain, 1 at 0%") {
		t.Errorf("status with a server at 0%%:\n%s", out)
	}
	run(0, "clear", "main_api/api-us-east1-c")

	// clear of what does not exist says so and writes nothing.
	if out := run(0, "clear", "canary_web/web-2"); !strings.Contains(out, "nothing to clear") {
		t.Errorf("clear of an absent key: %s", out)
	}
	// Issue 15.11: a key with a space is served and can be cleared; a
	// nested one cannot be named, and the error says how to remove it.
	kv := consul.Client(t).KV()
	for _, k := range []string{"canary_api/api 3", "canary_api/a/b"} {
		if _, err := kv.Put(&consulapi.KVPair{Key: kvPrefix + "state/" + k, Value: []byte("drain")}, nil); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		if out, _ := op.RunCode(t, "status", "canary_api/api 3"); !strings.Contains(out, "api 3") {
			return fmt.Errorf("the key with a space is not in status: %s", out)
		}
		return nil
	})
	if out := run(0, "clear", "canary_api/api 3"); !strings.Contains(out, "delete "+kvPrefix+"state/canary_api/api 3") {
		t.Errorf("clear of a key with a space: %s", out)
	}
	if out := run(2, "clear", "canary_api/a/b"); !strings.Contains(out, "consul kv delete '"+kvPrefix+"state/canary_api/a/b'") {
		t.Errorf("clear of a nested key: %s", out)
	}
	if _, err := kv.Delete(kvPrefix+"state/canary_api/a/b", nil); err != nil {
		t.Fatal(err)
	}

	// Issue 15.2: a person probes main_web/web-1 once by hand (as nc
	// would, from an address no HAProxy uses); ready then deletes its key
	// (no backend-wide key covers it), and wait does not wait for the
	// probe: it returns within api.ProbeGrace.
	if ans := rawProbe(t, "127.0.0.9", hs[1].AgentAddr, "main_web/web-1"); ans != "maint\n" {
		t.Fatalf("a manual probe of main_web/web-1: %q", ans)
	}
	if out := run(0, "ready", "main_web/web-1"); !strings.Contains(out, "delete "+kvPrefix+"state/main_web/web-1") {
		t.Errorf("ready of a server no backend-wide key covers: %s", out)
	}
	start = time.Now()
	run(0, "wait", "main_web/web-1", "--timeout", "20s")
	t.Logf("wait after a manual probe returned in %s", time.Since(start).Round(time.Millisecond))

	// One HAProxy stops answering (SIGSTOP): wait names it.
	hapB.Signal(t, syscall.SIGSTOP)
	run(0, "maint", "main_web/web-1", "--allow-below-min-ready")
	out = run(1, "wait", "main_web/web-1", "--timeout", "4s")
	if _, last, _ := strings.Cut(out, "still waiting for:"); !strings.Contains(last, "HAProxy 127.0.0.3 for main_web/web-1") || strings.Contains(last, "HAProxy 127.0.0.2") {
		t.Errorf("wait with one HAProxy frozen: %s", out)
	}
	hapB.Signal(t, syscall.SIGCONT)
	run(0, "wait", "main_web/web-1", "--timeout", "30s")
	run(0, "clear", "main_web/web-1")

	// A replica is down: both HAProxy nodes poll through the load
	// balancer, which drops it, so the live replicas see them and the
	// gates decide from those (issue 34), saying which replica did not
	// answer. (TestE2EOneReplicaDown has the HAProxy only the dead replica
	// saw: exit 4, naming it.)
	hs[2].Kill()
	out = run(0, "precheck", "main_web/web-1")
	if !strings.Contains(out, fmt.Sprintf("replica %s", hs[2].NodeID)) || !strings.Contains(out, "did not answer") {
		t.Errorf("precheck with a replica down: %s", out)
	}
	out = run(0, "wait", "main_web/web-1", "--timeout", "10s")
	if !strings.Contains(out, fmt.Sprintf("replica %s", hs[2].NodeID)) {
		t.Errorf("wait with a replica down: %s", out)
	}
}

// rawProbe is one agent check from the local address from (a loopback
// address no HAProxy of the test uses), as `nc` sends it: the request and
// LF, no marker. It returns the answer line.
func rawProbe(t *testing.T, from, addr, req string) string {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintf(c, "%s\n", req); err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(c).ReadString('\n')
	return line
}
