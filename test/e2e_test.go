package test

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/user"
	"strings"
	"testing"
	"time"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/internal/testenv"
)

// The HAProxy of the end-to-end tests: two backends of two servers each.
var (
	beWeb = Backend{Name: "be_web", Servers: []string{"web1", "web2"}}
	beAPI = Backend{Name: "be_api", Servers: []string{"api1", "api2"}}
)

// allServers lists every "backend/server" of the test HAProxy.
func allServers() []string {
	var s []string
	for _, b := range []Backend{beWeb, beAPI} {
		for _, sv := range b.Servers {
			s = append(s, b.Name+"/"+sv)
		}
	}
	return s
}

// Status rows shown by HAProxy 2.6 and 3.0 (DESIGN.md, "HAProxy facts"):
// drain set by the agent shows as "DRAIN (agent)", maint as plain "MAINT".
const (
	statUp         = "UP"
	statDrainAgent = "DRAIN (agent)"
	statMaint      = "MAINT"
)

// TestE2EOperatorStateReachesHAProxy follows the runbook against one
// Consul, one hastate and two HAProxy nodes, one per release (Debian's 2.6
// and 3.0 LTS): an operator command writes KV, and each HAProxy's own
// agent-check applies it.
func TestE2EOperatorStateReachesHAProxy(t *testing.T) {
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	hs := StartHastate(t, HastateOptions{ConsulAddr: consul.Addr()})
	hap := StartHAProxies(t, hs.AgentAddr, beWeb, beAPI)
	op := hs.Operator("--allow-unknown") // writes before HAProxy has polled every server
	// clear of a server nobody polled and no key names exits 3 (a typo):
	// reset clears every server, so HAProxy must have polled each first.
	testenv.Eventually(t, 15*time.Second, func() error {
		var v api.StateView
		hs.GetJSON(t, "/v1/state", &v)
		known := map[string]bool{}
		for _, r := range v.Servers {
			known[r.Backend+"/"+r.Server] = true
		}
		for _, s := range allServers() {
			if !known[s] {
				return fmt.Errorf("HAProxy has not polled %s yet", s)
			}
		}
		return nil
	})

	// Every subtest starts with no keys and every server UP at full weight.
	reset := func(t *testing.T) {
		t.Helper()
		op.Run(t, append([]string{"clear", "be_web/*", "be_api/*"}, allServers()...)...)
		for _, s := range allServers() {
			hap.WaitServer(t, s, statUp, serverWeight)
		}
	}

	t.Run("drain maint weight clear", func(t *testing.T) {
		reset(t)
		op.Run(t, "drain", "be_web/web1")
		hap.WaitServer(t, "be_web/web1", statDrainAgent, -1)

		op.Run(t, "maint", "be_web/web1")
		hap.WaitServer(t, "be_web/web1", statMaint, -1)

		op.Run(t, "weight", "25%", "be_web/web1")
		hap.WaitServer(t, "be_web/web1", statUp, 25)

		op.Run(t, "clear", "be_web/web1")
		hap.WaitServer(t, "be_web/web1", statUp, serverWeight)

		// Nothing else moved.
		for _, s := range []string{"be_web/web2", "be_api/api1", "be_api/api2"} {
			hap.Expect(t, s, fmt.Sprintf("UP at weight %d (it was never named)", serverWeight), func(r Row) bool {
				return r.Status == statUp && r.Weight == serverWeight
			})
		}
	})

	t.Run("backend wildcard drains every server of the backend only", func(t *testing.T) {
		reset(t)
		op.Run(t, "drain", "be_web/*")
		hap.WaitServer(t, "be_web/web1", statDrainAgent, -1)
		hap.WaitServer(t, "be_web/web2", statDrainAgent, -1)
		// be_api is asked as often as be_web: over a few more agent rounds
		// it stays UP at full weight.
		holdWhileAsked(t, hs, hap, map[string]Row{
			"be_api/api1": {Status: statUp, Weight: serverWeight},
			"be_api/api2": {Status: statUp, Weight: serverWeight},
		})
	})

	t.Run("exact key overrides the wildcard", func(t *testing.T) {
		reset(t)
		op.Run(t, "drain", "be_web/*")
		hap.WaitServer(t, "be_web/web1", statDrainAgent, -1)
		hap.WaitServer(t, "be_web/web2", statDrainAgent, -1)

		op.Run(t, "ready", "be_web/web2")
		hap.WaitServer(t, "be_web/web2", statUp, serverWeight)
		holdWhileAsked(t, hs, hap, map[string]Row{"be_web/web1": {Status: statDrainAgent, Weight: -1}})

		// Clearing the exact key hands web2 back to the wildcard.
		op.Run(t, "clear", "be_web/web2")
		hap.WaitServer(t, "be_web/web2", statDrainAgent, -1)
	})

	t.Run("invalid value leaves HAProxy untouched", func(t *testing.T) {
		reset(t)
		// A key with a last valid value keeps serving it.
		op.Run(t, "drain", "be_web/web1")
		hap.WaitServer(t, "be_web/web1", statDrainAgent, -1)
		// A key with no valid value ever withholds the answer: api2 is
		// drained through the wildcard, then gets a bad key of its own.
		op.Run(t, "drain", "be_api/*")
		hap.WaitServer(t, "be_api/api2", statDrainAgent, -1)

		// The operator command refuses the typo and writes nothing...
		if out, code := op.RunCode(t, "weight", "300%", "be_web/web1"); code == 0 {
			t.Errorf("hastate weight 300%% exited 0, want a usage error:\n%s", out)
		}
		// ...so the typo goes straight to Consul, as a script would write it.
		withheld := `hastate_agent_checks_total{result="withheld"}`
		before := hs.Metric(t, withheld)
		consul.Put(t, "hastate/state/be_web/web1", "300%")
		consul.Put(t, "hastate/state/be_api/api2", "300%")

		// Wait until hastate has mirrored both bad values.
		var v stateView
		testenv.Eventually(t, 10*time.Second, func() error {
			hs.GetJSON(t, "/v1/state", &v)
			return testenv.Expect(len(v.InvalidKeys) == 2, "/v1/state never listed 2 invalid keys: %+v", v)
		})

		// Several agent rounds later HAProxy still has what it had: web1's
		// answer stays drain, api2's is withheld (probes closed unanswered).
		testenv.Eventually(t, 10*time.Second, func() error {
			return testenv.Expect(hs.Metric(t, withheld) >= before+3, "no withheld agent answers counted after 300%% on be_api/api2")
		})
		holdWhileAsked(t, hs, hap, map[string]Row{
			"be_web/web1": {Status: statDrainAgent, Weight: -1},
			"be_api/api2": {Status: statDrainAgent, Weight: -1},
		})
		if got := hs.Ask(t, "be_web/web1"); got != "drain" {
			t.Errorf("agent answer for be_web/web1 = %q, want the last valid value \"drain\"", got)
		}
		if got := hs.Ask(t, "be_api/api2"); got != "" {
			t.Errorf("agent answer for be_api/api2 = %q, want none (no valid value ever)", got)
		}

		// The API and the status command say which keys are invalid.
		for _, r := range v.InvalidKeys {
			if r.Value != "300%" || r.Error == "" || r.Valid {
				t.Errorf("/v1/state invalid row %+v: want value 300%%, valid=false and an error", r)
			}
		}
		var one stateRow
		hs.GetJSON(t, "/v1/state/be_web/web1", &one)
		if one.Valid || one.Desired != "drain" || one.Answer != "drain" {
			t.Errorf("/v1/state/be_web/web1 = %+v; want invalid, desired drain, answer drain", one)
		}
		out := op.Run(t, "status", "--addr", "http://"+hs.HTTPAddr, "be_web/web1")
		t.Logf("hastate status be_web/web1:\n%s", out)
		if !strings.Contains(out, "300%") || !strings.Contains(strings.ToLower(out), "invalid") {
			t.Errorf("hastate status does not show be_web/web1's value 300%% as invalid:\n%s", out)
		}
		out = op.Run(t, "status", "--addr", "http://"+hs.HTTPAddr, "be_api/api2")
		if !strings.Contains(out, "(withheld: HAProxy keeps ") {
			t.Errorf("hastate status does not show be_api/api2's answer as withheld:\n%s", out)
		}
	})

	t.Run("killed hastate leaves HAProxy with the last state", func(t *testing.T) {
		reset(t)
		op.Run(t, "drain", "be_web/web1")
		op.Run(t, "weight", "25%", "be_api/api1")
		op.Run(t, "maint", "be_api/api2")
		want := map[string]Row{
			"be_web/web1": hap.WaitServer(t, "be_web/web1", statDrainAgent, -1),
			"be_web/web2": hap.WaitServer(t, "be_web/web2", statUp, serverWeight),
			"be_api/api1": hap.WaitServer(t, "be_api/api1", statUp, 25),
			"be_api/api2": hap.WaitServer(t, "be_api/api2", statMaint, -1),
		}

		hs.Kill()
		// HAProxy's agent checks now fail to connect; once every server
		// has seen that a few times, nothing may have changed.
		for _, h := range hap {
			for s := range want {
				testenv.Eventually(t, 10*time.Second, func() error {
					last := h.Server(t, s)
					return testenv.Expect(last.AgentStatus == "L4CON", "%s %s: agent check never failed to connect: %s", h.Release, s, last)
				})
			}
		}
		// HAProxy counts no agent checks, so the hold is by time: a few
		// agent-inter periods, watched throughout.
		hap.Hold(t, holdRounds*agentInter, want)
	})
}

// holdRounds is how many agent-inter periods a "nothing changes" check lasts.
const holdRounds = 4

// holdWhileAsked checks that every HAProxy keeps the servers in want
// (Weight -1: any weight) over holdRounds agent-inter periods, and that
// hastate was probed for every configured server meanwhile: the check
// proves HAProxy asked and applied nothing new, not merely that time
// passed.
func holdWhileAsked(t *testing.T, hs *Hastate, hap HAProxies, want map[string]Row) {
	t.Helper()
	const probes = `hastate_agent_checks_total{result="answered"}`
	const withheld = `hastate_agent_checks_total{result="withheld"}`
	before := hs.Metric(t, probes) + hs.Metric(t, withheld)
	hap.Hold(t, holdRounds*agentInter, want)
	// Every HAProxy asks for every server once per agent-inter; allow one
	// round of slack.
	min := float64((holdRounds - 1) * len(allServers()) * len(hap))
	if got := hs.Metric(t, probes) + hs.Metric(t, withheld) - before; got < min {
		t.Errorf("hastate got %.0f agent probes during the hold, want at least %.0f: HAProxy was not asking", got, min)
	}
}

// The tests read /v1/state with the API's own types.
type (
	stateRow  = api.ServerState
	stateView = api.StateView
)

// TestE2EConsulOutage: stale is not wrong. With Consul down hastate keeps
// answering the last mirrored state, also across its own restart, and it
// picks up new writes once Consul is back, without a restart.
func TestE2EConsulOutage(t *testing.T) {
	consul := testenv.StartConsul(t, testenv.ConsulOptions{Persistent: true})
	hs := StartHastate(t, HastateOptions{ConsulAddr: consul.Addr()})
	op := hs.Operator("--allow-unknown") // no HAProxy polls

	op.Run(t, "drain", "be_web/web1")
	op.Run(t, "weight", "25%", "be_web/web2")
	op.Run(t, "maint", "be_api/*")
	op.Run(t, "ready", "be_api/api2")
	want := map[string]string{
		"be_web/web1":   "drain",
		"be_web/web2":   "ready 25%",
		"be_api/api1":   "maint",
		"be_api/api2":   "ready 100%",
		"be_other/srv1": "ready 100%", // no key at all
	}
	servers := []string{"be_web/web1", "be_web/web2", "be_api/api1", "be_api/api2", "be_other/srv1"}
	var got map[string]string
	sameAnswers := func() bool {
		got = hs.Answers(t, servers...)
		return fmt.Sprint(got) == fmt.Sprint(want)
	}
	answersMsg := func() string { return fmt.Sprintf("agent answers %v, want %v", got, want) }
	testenv.Eventually(t, 10*time.Second, func() error { return testenv.Expect(sameAnswers(), "%s", answersMsg()) })

	// Consul dies. hastate says so but stays ready and keeps answering.
	consul.Kill()
	down := time.Now()
	var rd Readiness
	var code int
	testenv.Eventually(t, 10*time.Second, func() error {
		code, rd = hs.Readiness(t)
		if code != 200 {
			t.Fatalf("/-/readiness = %d with Consul down (%+v); want 200: stale is not wrong", code, rd)
		}
		return testenv.Expect(!watch(rd).Reachable && watch(rd).ConsecutiveErrors > 0, "readiness never reported Consul unreachable: %+v", rd)
	})
	t.Logf("Consul down: readiness 200, kv status reachable=%v errors=%d last_error=%q",
		watch(rd).Reachable, watch(rd).ConsecutiveErrors, watch(rd).LastError)
	consistently(t, 4*agentInter, sameAnswers, answersMsg)

	// hastate restarts while Consul is still down: it serves from its
	// raft log and snapshots on disk.
	restart := time.Now()
	hs.Restart(t)
	hs.WaitReady(t)
	t.Logf("hastate restarted with Consul down: ready after %s", time.Since(restart).Round(time.Millisecond))
	if !sameAnswers() {
		t.Fatalf("after a restart with Consul down: %s", answersMsg())
	}
	consistently(t, 4*agentInter, sameAnswers, answersMsg)

	// A replica that never read Consul knows nothing: it is not ready and
	// withholds every answer, so it cannot undo a drain.
	fresh := NewHastate(t, HastateOptions{ConsulAddr: consul.Addr(), NodeID: "fresh"})
	fresh.Start(t)
	testenv.Eventually(t, readyTimeout, func() error {
		code, _, err := fresh.get("/-/readiness")
		return testenv.Expect(err == nil && code == 503, "the fresh replica never answered /-/readiness with 503")
	})
	consistently(t, 2*agentInter, func() bool { return fresh.Ask(t, "be_web/web1") == "" },
		func() string { return "the fresh replica answered while it holds no state" })

	// Consul comes back (its KV kept) and a new drain flows through
	// without touching hastate.
	consul.Restart(t)
	back := time.Now()
	t.Logf("Consul was down for %s", back.Sub(down).Round(time.Millisecond))
	// The test's probes count as polls: web2 is be_web's last ready server.
	op.Run(t, "drain", "be_web/web2", "--allow-below-min-ready")
	want["be_web/web2"] = "drain"
	testenv.Eventually(t, 60*time.Second, func() error { return testenv.Expect(sameAnswers(), "%s", answersMsg()) })
	t.Logf("catch-up: the drain written after Consul came back was served %s after Consul was ready again",
		time.Since(back).Round(time.Millisecond))
	t.Logf("hastate: %s", hs.LogLine(t, "consul KV sync recovered"))
	fresh.WaitReady(t)
	t.Logf("the fresh replica was ready %s after Consul was ready again", time.Since(back).Round(time.Millisecond))
	// Ready means it has read Consul once, and that read may be from
	// before the drain above reached Consul's KV after its restart: the
	// drain comes with the next read.
	fresh.WaitAnswer(t, "be_web/web2", "drain")
	code, rd = hs.Readiness(t)
	if code != 200 || !watch(rd).Reachable {
		t.Errorf("readiness after Consul is back: %d %+v; want 200 and Consul reachable", code, rd)
	}
}

// TestE2EDrainReasonInStatus: `hastate drain --reason` writes a JSON value
// whose reason and author show in `hastate status -o json`.
func TestE2EDrainReasonInStatus(t *testing.T) {
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	hs := StartHastate(t, HastateOptions{ConsulAddr: consul.Addr()})
	op := hs.Operator("--allow-unknown") // no HAProxy polls

	op.Run(t, "drain", "be_web/web1", "--reason", "zonal maintenance")
	op.Run(t, "maint", "be_web/web2", "--reason", "kernel upgrade", "--by", "alice")

	me := ""
	if u, err := user.Current(); err == nil {
		me = u.Username
	}
	if me == "" {
		me = os.Getenv("USER")
	}

	// In Consul: the word in the state key (the runbook's contract), and a
	// JSON object with state, reason and by in its meta key.
	pair, _, err := consul.Client(t).KV().Get("hastate/state/be_web/web1", nil)
	if err != nil || pair == nil || string(pair.Value) != "drain" {
		t.Fatalf("read hastate/state/be_web/web1 from Consul: %v (pair %v), want the word drain", err, pair)
	}
	pair, _, err = consul.Client(t).KV().Get("hastate/meta/be_web/web1", nil)
	if err != nil || pair == nil {
		t.Fatalf("read hastate/meta/be_web/web1 from Consul: %v (pair %v)", err, pair)
	}
	var val map[string]string
	if err := json.Unmarshal(pair.Value, &val); err != nil {
		t.Fatalf("meta value %q is not a JSON object: %v", pair.Value, err)
	}
	if val["state"] != "drain" || val["reason"] != "zonal maintenance" || val["by"] != me {
		t.Errorf("KV value %s; want state drain, reason \"zonal maintenance\", by %q", pair.Value, me)
	}

	hs.WaitAnswer(t, "be_web/web1", "drain")
	hs.WaitAnswer(t, "be_web/web2", "maint")
	out := op.Run(t, "status", "--addr", "http://"+hs.HTTPAddr, "-o", "json")
	t.Logf("hastate status -o json:\n%s", out)
	var rows []stateRow
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("hastate status -o json: %v:\n%s", err, out)
	}
	find := func(b, s string) stateRow {
		for _, r := range rows {
			if r.Backend == b && r.Server == s {
				return r
			}
		}
		t.Fatalf("hastate status -o json has no %s/%s:\n%s", b, s, out)
		return stateRow{}
	}
	if r := find("be_web", "web1"); r.Reason != "zonal maintenance" || r.By != me || r.Answer != "drain" {
		t.Errorf("be_web/web1: %+v; want reason \"zonal maintenance\", by %q, answer drain", r, me)
	}
	if r := find("be_web", "web2"); r.Reason != "kernel upgrade" || r.By != "alice" || r.Answer != "maint" {
		t.Errorf("be_web/web2: %+v; want reason \"kernel upgrade\", by alice, answer maint", r)
	}
}

// TestE2ECustomKVPrefix: the existing runbook's prefix works for both the
// replica and the operator commands, and keys under another prefix are not
// this replica's. Issue 22.1: a write with a prefix the replica does not
// read is refused, naming both prefixes, and writes nothing; the same write
// with the replica's prefix succeeds.
func TestE2ECustomKVPrefix(t *testing.T) {
	const prefix = "gitlab-haproxy-agent/"
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	hs := StartHastate(t, HastateOptions{ConsulAddr: consul.Addr(), KVPrefix: prefix})
	// The replica reads gitlab-haproxy-agent/; op writes hastate/ (the
	// default) to it. No HAProxy polls: --allow-unknown.
	op := Operator{ConsulAddr: consul.Addr(), Addr: hs.HTTPAddr, WriteFlags: []string{"--allow-unknown"}}
	envOp := hs.Operator("--allow-unknown")

	for _, f := range [][]string{nil, {"--force"}, {"--allow-no-replica"}} {
		out := op.RunExit(t, 1, append([]string{"maint", "be_api/api2"}, f...)...)
		if !strings.Contains(out, `reads KV prefix "`+prefix+`"`) || !strings.Contains(out, `this command uses "hastate/"`) || !strings.Contains(out, "nothing was written") {
			t.Errorf("a write to a prefix the replica does not read (%v): %s; want a refusal naming both prefixes", f, out)
		}
		if keys, _, err := consul.Client(t).KV().Keys("hastate/", "", nil); err != nil || len(keys) != 0 {
			t.Fatalf("the refused write wrote %v (err %v)", keys, err)
		}
	}
	// wait and precheck say so too, instead of waiting for an index.
	for _, cmd := range []string{"wait", "precheck"} {
		if out := op.RunExit(t, 1, cmd, "be_api/api2"); !strings.Contains(out, `reads KV prefix "`+prefix+`"`) {
			t.Errorf("%s with the wrong prefix: %s", cmd, out)
		}
	}
	op.Run(t, "maint", "be_api/api2", "--kv-prefix", prefix) // the same write, the replica's prefix
	op.Run(t, "drain", "be_web/web1", "--kv-prefix", prefix) // the flag
	envOp.Run(t, "maint", "be_web/web2")                     // the environment
	consul.Put(t, "hastate/state/be_api/api3", "maint")      // another prefix: not ours
	consul.Put(t, prefix+"state/be_api/api1", " Drain\n")    // the runbook's plain value, untidy

	for _, k := range []string{prefix + "state/be_web/web1", prefix + "state/be_web/web2", prefix + "state/be_api/api2"} {
		if p, _, err := consul.Client(t).KV().Get(k, nil); err != nil || p == nil {
			t.Errorf("Consul key %s missing after the operator command (err %v)", k, err)
		}
	}
	hs.WaitAnswer(t, "be_web/web1", "drain")
	hs.WaitAnswer(t, "be_web/web2", "maint")
	hs.WaitAnswer(t, "be_api/api1", "drain")
	hs.WaitAnswer(t, "be_api/api2", "maint")
	// api1's key was written after api3's, so hastate has read past it.
	if got := hs.Ask(t, "be_api/api3"); got != "ready 100%" {
		t.Errorf("be_api/api3 (key under hastate/, not %s) answers %q, want \"ready 100%%\"", prefix, got)
	}
	envOp.Run(t, "clear", "be_web/web2")
	hs.WaitAnswer(t, "be_web/web2", "ready 100%")
}

// TestE2EMalformedProbes: what HAProxy never sends gets no answer and a
// closed connection; an agent-send without LF (as set through the runtime
// API) is answered once the peer has been quiet a moment.
func TestE2EMalformedProbes(t *testing.T) {
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	hs := StartHastate(t, HastateOptions{ConsulAddr: consul.Addr()})
	op := hs.Operator("--allow-unknown") // no HAProxy polls
	op.Run(t, "drain", "be_web/web1")
	hs.WaitAnswer(t, "be_web/web1", "drain")

	const readTimeout = 2 * time.Second // hastate's default agent read timeout
	malformed := `hastate_agent_checks_total{result="malformed"}`
	timeouts := `hastate_agent_checks_total{result="timeout"}`
	before := hs.Metric(t, malformed)

	for _, tc := range []struct {
		name    string
		payload string
	}{
		{"no slash", "be_web-web1\n"},
		{"two slashes", "be_web/web1/x\n"},
		{"empty line", "\n"},
		{"300 bytes with LF", "be_web/" + strings.Repeat("w", 292) + "\n"},
		{"300 bytes without LF", "be_web/" + strings.Repeat("w", 293)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := hs.Probe(t, []byte(tc.payload), false)
			if p.Err != nil || !p.Closed || len(p.Answer) > 0 {
				t.Errorf("probe %q: answer %q closed=%v err=%v after %s; want no answer and a close",
					tc.payload, p.Answer, p.Closed, p.Err, p.Took)
			}
		})
	}
	if got := hs.Metric(t, malformed) - before; got != 5 {
		t.Errorf("hastate counted %.0f malformed probes, want 5", got)
	}

	t.Run("silence", func(t *testing.T) {
		before := hs.Metric(t, timeouts)
		p := hs.Probe(t, nil, false)
		if p.Err != nil || !p.Closed || len(p.Answer) > 0 {
			t.Fatalf("silent probe: answer %q closed=%v err=%v after %s; want a close without answer", p.Answer, p.Closed, p.Err, p.Took)
		}
		if p.Took < readTimeout-100*time.Millisecond || p.Took > readTimeout+time.Second {
			t.Errorf("silent probe closed after %s; want about the read timeout (%s)", p.Took, readTimeout)
		}
		if got := hs.Metric(t, timeouts) - before; got != 1 {
			t.Errorf("hastate counted %.0f timed-out probes, want 1", got)
		}
		t.Logf("silent probe closed after %s", p.Took.Round(time.Millisecond))
	})

	t.Run("no LF answered after the quiet period", func(t *testing.T) {
		p := hs.Probe(t, []byte("be_web/web1"), false)
		if p.Err != nil || p.Line(t) != "drain" {
			t.Fatalf("probe without LF: answer %q err=%v; want \"drain\\n\"", p.Answer, p.Err)
		}
		if p.Took >= readTimeout {
			t.Errorf("probe without LF answered after %s, not within the read timeout %s", p.Took, readTimeout)
		}
		t.Logf("probe without LF answered after %s", p.Took.Round(time.Millisecond))
	})

	t.Run("CRLF and half-close", func(t *testing.T) {
		if p := hs.Probe(t, []byte("be_web/web1\r\n"), false); p.Err != nil || p.Line(t) != "drain" {
			t.Errorf("CRLF probe: answer %q err=%v; want \"drain\\n\"", p.Answer, p.Err)
		}
		if p := hs.Probe(t, []byte("be_web/web1"), true); p.Err != nil || p.Line(t) != "drain" {
			t.Errorf("half-closed probe without LF: answer %q err=%v; want \"drain\\n\"", p.Answer, p.Err)
		}
	})
}

// TestE2ESigterm: SIGTERM on the single replica ends it within a bounded
// time with exit code 0, with a blocking Consul query and an idle agent
// connection in flight, and also while Consul is down.
func TestE2ESigterm(t *testing.T) {
	const bound = 10 * time.Second
	for _, consulDown := range []bool{false, true} {
		t.Run(fmt.Sprintf("consul down %v", consulDown), func(t *testing.T) {
			consul := testenv.StartConsul(t, testenv.ConsulOptions{})
			hs := StartHastate(t, HastateOptions{ConsulAddr: consul.Addr()})
			op := hs.Operator("--allow-unknown") // no HAProxy polls
			op.Run(t, "drain", "be_web/web1")
			hs.WaitAnswer(t, "be_web/web1", "drain")
			if consulDown {
				consul.Kill()
				var rd Readiness
				testenv.Eventually(t, 10*time.Second, func() error {
					_, rd = hs.Readiness(t)
					return testenv.Expect(watch(rd).ConsecutiveErrors > 0, "hastate never noticed Consul was down: %+v", rd)
				})
			}
			// An agent connection that never sends its request.
			idle, err := net.Dial("tcp", hs.AgentAddr)
			if err != nil {
				t.Fatal(err)
			}
			defer idle.Close()

			code, took := hs.Stop(t)
			t.Logf("SIGTERM: exit code %d after %s", code, took.Round(time.Millisecond))
			if code != 0 {
				t.Errorf("exit code %d after SIGTERM, want 0", code)
			}
			if took > bound {
				t.Errorf("exit took %s after SIGTERM, want at most %s", took, bound)
			}
			if !hs.LogContains(t, `"hastate stopped"`) {
				t.Errorf("log has no \"hastate stopped\" line")
			}
		})
	}
}

// TestE2EFailover: three replicas. Killing the leader does not interrupt
// the followers' answers, a new leader takes over the Consul watch, and the
// old leader rejoins and catches up. A leader stopped with SIGTERM hands
// over leadership first.
func TestE2EFailover(t *testing.T) {
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	hs := StartCluster(t, 3, HastateOptions{ConsulAddr: consul.Addr()})
	op := hs[0].Operator("--allow-unknown") // no HAProxy polls

	op.Run(t, "drain", "be_web/web1")
	for _, h := range hs {
		h.WaitAnswer(t, "be_web/web1", "drain")
	}
	leader := WaitLeader(t, 10*time.Second, hs...)
	var rest []*Hastate
	for _, h := range hs {
		if h != leader {
			rest = append(rest, h)
		}
	}

	// SIGKILL the leader: during the election the followers answer drain
	// or nothing (no leader confirms an answer: HAProxy keeps its state),
	// never another state.
	leader.Kill()
	killed := time.Now()
	for _, h := range rest {
		if got := h.Ask(t, "be_web/web1"); got != "drain" && got != "" {
			t.Errorf("%s right after the leader was killed answers %q, want drain or nothing", h.NodeID, got)
		}
	}
	next := WaitLeader(t, 20*time.Second, rest...)
	elected := time.Since(killed)
	// The killed leader cannot be asked: the write says so and goes on.
	rest[0].Operator("--allow-unknown", "--allow-no-replica").Run(t, "drain", "be_web/web2")
	for _, h := range rest {
		h.WaitAnswer(t, "be_web/web2", "drain")
	}
	t.Logf("failover after SIGKILL of leader %s: %s elected after %s; a new drain served by both survivors %s after the kill",
		leader.NodeID, next.NodeID, elected.Round(time.Millisecond), time.Since(killed).Round(time.Millisecond))

	// The old leader comes back with its data dir and catches up.
	leader.Start(t)
	leader.WaitReady(t)
	leader.WaitAnswer(t, "be_web/web2", "drain")
	WaitLeader(t, 10*time.Second, hs...)

	// SIGTERM the current leader: it hands over before it exits.
	cur := WaitLeader(t, 10*time.Second, hs...)
	rest = rest[:0]
	for _, h := range hs {
		if h != cur {
			rest = append(rest, h)
		}
	}
	code, took := cur.Stop(t)
	if code != 0 {
		t.Errorf("leader %s exited with code %d after SIGTERM, want 0", cur.NodeID, code)
	}
	if !cur.LogContains(t, "leadership transferred before shutdown") {
		t.Errorf("leader %s did not log a leadership transfer before shutdown", cur.NodeID)
	}
	stopped := time.Now()
	next = WaitLeader(t, 10*time.Second, rest...)
	t.Logf("SIGTERM of leader %s: exited (code %d) in %s; %s leads %s after the exit",
		cur.NodeID, code, took.Round(time.Millisecond), next.NodeID, time.Since(stopped).Round(time.Millisecond))
	// The stopped leader cannot be asked: the write says so and goes on.
	rest[0].Operator("--allow-unknown", "--allow-no-replica").Run(t, "maint", "be_api/api1")
	for _, h := range rest {
		h.WaitAnswer(t, "be_api/api1", "maint")
		h.WaitAnswer(t, "be_web/web1", "drain")
	}
}
