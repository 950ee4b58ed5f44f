package test

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"
	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/internal/testenv"
	"github.com/hastate/hastate/state"
)

// word is every value the runbook's contract allows in a state key.
var word = regexp.MustCompile(`^(ready|drain|maint|[0-9]{1,3}%)$`)

// stateValues returns every value under <prefix>state/ in Consul.
func stateValues(t *testing.T, c *testenv.Consul, prefix string) map[string]string {
	t.Helper()
	pairs, _, err := c.Client(t).KV().List(prefix+"state/", nil)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, p := range pairs {
		out[p.Key] = string(p.Value)
	}
	return out
}

// TestE2EKVContract: with the runbook's prefix, every value any write
// command of the CLI leaves under a state key is one of ready, drain, maint
// and N%; what hastate adds is in the meta key, and status, expiry and the
// key's own ramp work from it. Then JSON state keys, as 0.13.0's CLI wrote
// them, are rewritten by migrate-kv while replicas are probed: no answer
// changes.
func TestE2EKVContract(t *testing.T) {
	const prefix = "gitlab-haproxy-agent/"
	c := testenv.StartConsul(t, testenv.ConsulOptions{})
	hs := StartCluster(t, 3, HastateOptions{ConsulAddr: c.Addr(), KVPrefix: prefix,
		Args: []string{"--ramp-duration", "4s", "--ramp-interval", "1s", "--ramp-start", "10%"}})
	op := hs[0].Operator("--allow-unknown") // no HAProxy polls
	checkWords := func(step string) {
		t.Helper()
		for k, v := range stateValues(t, c, prefix) {
			if !word.MatchString(v) {
				t.Fatalf("after %s: %s = %q, not one of ready | drain | maint | N%%", step, k, v)
			}
		}
	}
	writes := [][]string{
		{"drain", "web/a", "--reason", "contract", "--for", "3s", "--ramp", "0"},
		{"weight", "30%", "web/b", "--reason", "canary"},
		{"maint", "web/c", "--reason", "disk"},
		{"maint", "zone/s1"},
		{"drain", "zone/*", "--reason", "zone", "--override"},
		{"ready", "zone/s2", "--ramp", "2s"},
		{"drain", "api/x", "--ramp", "6s"},
		// --keep-own: api/x's own drain escapes a backend-wide maint, which
		// is refused without it (the write reads api/x from Consul).
		{"maint", "api/*", "--dry-run", "--keep-own"},
		{"clear", "zone/*"},
	}
	for _, w := range writes {
		op.Run(t, w...)
		checkWords(strings.Join(w, " "))
		if w[1] == "web/a" {
			// Now, not after the writes below: on a loaded machine they
			// can outlast --for 3s, and an expired key shows no until.
			testenv.Eventually(t, 3*time.Second, holds(func() bool {
				r := serverRow(t, hs[0], "web", "a")
				return r.Until != nil && r.Reason == "contract"
			}, func() string {
				return fmt.Sprintf("status of web/a shows no until or reason: %+v", serverRow(t, hs[0], "web", "a"))
			}))
		}
		if w[1] == "zone/s1" { // --override reads the keys the replica holds
			testenv.Eventually(t, 10*time.Second, holds(func() bool { return serverRow(t, hs[0], "zone", "s1").Desired == "maint" },
				func() string { return "zone/s1 not mirrored" }))
		}
	}
	metaOf := func(key string) map[string]any {
		t.Helper()
		p, _, err := c.Client(t).KV().Get(prefix+"meta/"+key, nil)
		if err != nil || p == nil {
			t.Fatalf("meta/%s: %v %v", key, p, err)
		}
		var m map[string]any
		if err := json.Unmarshal(p.Value, &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	if m := metaOf("web/b"); m["state"] != "30%" || m["reason"] != "canary" || m["by"] == "" || m["at"] == nil {
		t.Errorf("meta/web/b = %v", m)
	}
	for _, k := range []string{"meta/zone/*", "meta/zone/s1", "state/zone/s1"} {
		if p, _, _ := c.Client(t).KV().Get(prefix+k, nil); p != nil {
			t.Errorf("clear zone/* (and --override before it) left %s: %s", k, p.Value)
		}
	}
	if m := metaOf("zone/s2"); m["state"] != "ready" || m["ramp"] != "2s" {
		t.Errorf("meta/zone/s2 = %v", m)
	}

	// Status from the meta key, on every replica; expiry (3s, with the
	// key's ramp 0) and the per-key ramp of api/x (6s, not the policy's
	// 4s) from it too.
	for _, h := range hs {
		testenv.Eventually(t, 10*time.Second, holds(func() bool {
			r := serverRow(t, h, "web", "b")
			return r.Reason == "canary" && r.Desired == "30%" && r.By != ""
		}, func() string { return fmt.Sprintf("%s: status of web/b: %+v", h.NodeID, serverRow(t, h, "web", "b")) }))
	}
	for _, h := range hs {
		h.WaitAnswer(t, "web/a", "ready 100%") // expired, straight to 100%
	}
	if r := serverRow(t, hs[2], "web", "a"); r.Expired == "" {
		t.Errorf("web/a expired but status does not say so: %+v", r)
	}
	op.Run(t, "clear", "api/x")
	testenv.Eventually(t, 10*time.Second, holds(func() bool {
		r := serverRow(t, hs[0], "api", "x")
		return r.Ramping != nil && r.Ramping.Duration == "6s"
	}, func() string {
		return fmt.Sprintf("api/x after clear: %+v, want a 6s ramp", serverRow(t, hs[0], "api", "x"))
	}))

	// A state key changed outside hastate: its meta key no longer counts.
	if _, err := c.Client(t).KV().Put(&consul.KVPair{Key: prefix + "state/web/c", Value: []byte("drain")}, nil); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, holds(func() bool {
		r := serverRow(t, hs[0], "web", "c")
		return r.Desired == "drain" && r.Note == state.NoteOutside && r.Reason == ""
	}, func() string { return fmt.Sprintf("web/c after consul kv put: %+v", serverRow(t, hs[0], "web", "c")) }))

	// JSON state keys, as 0.13.0's CLI wrote them.
	until := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	old := map[string]string{
		"state/mig/a": `{"at":"2026-11-30T10:00:00Z","by":"root","reason":"contract","state":"drain"}`,
		"state/mig/b": `{"at":"2026-11-30T10:00:00Z","by":"root","state":"30%"}`,
		"state/mig/c": `{"state":"maint","until":"` + until + `","ramp":"1m"}`,
		"state/mig/*": `{"state":"drain","reason":"zone"}`,
		"state/mig/d": `{"state":"ready","ramp":"0"}`,
	}
	for k, v := range old {
		if _, err := c.Client(t).KV().Put(&consul.KVPair{Key: prefix + k, Value: []byte(v)}, nil); err != nil {
			t.Fatal(err)
		}
	}
	servers := []string{"mig/a", "mig/b", "mig/c", "mig/d", "mig/e", "web/a", "web/b", "web/c"}
	want := map[string]string{"mig/a": "drain", "mig/b": "ready 30%", "mig/c": "maint", "mig/d": "ready 100%", "mig/e": "drain",
		"web/a": "ready 100%", "web/b": "ready 30%", "web/c": "drain"}
	for _, h := range hs {
		testenv.Eventually(t, 10*time.Second, holds(func() bool { return maps.Equal(h.Answers(t, servers...), want) },
			func() string { return fmt.Sprintf("%s answers %v, want %v", h.NodeID, h.Answers(t, servers...), want) }))
	}
	if r := serverRow(t, hs[0], "mig", "a"); r.Note != state.NoteJSONState {
		t.Errorf("a JSON state key is not flagged: %+v", r)
	}
	// Probe every replica for every server while migrate-kv runs. An
	// empty reply for want of a confirmation with the leader (a loaded
	// machine; hastate_agent_unconfirmed_total counts it) keeps HAProxy's
	// state; any other empty reply or a wrong answer is a change.
	unconfirmed := func() (n float64) {
		for _, h := range hs {
			v, err := unconfirmedChecks(h)
			if err != nil {
				t.Fatal(err)
			}
			n += v
		}
		return n
	}
	unconfirmedBefore := unconfirmed()
	var (
		mu         sync.Mutex
		checked    int
		bad        []string
		unanswered []string
		stop       = make(chan struct{})
		wg         sync.WaitGroup
	)
	for _, h := range hs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				for _, s := range servers {
					kind, ans, err := probeAgent(h.AgentAddr, s)
					mu.Lock()
					checked++
					switch {
					case kind == probeUnanswered:
						unanswered = append(unanswered, fmt.Sprintf("%s %s: %q %v", h.NodeID, s, ans, err))
					case kind != probeAnswered || ans != want[s]:
						bad = append(bad, fmt.Sprintf("%s %s: %q %v", h.NodeID, s, ans, err))
					}
					mu.Unlock()
				}
				time.Sleep(2 * time.Millisecond)
			}
		}()
	}
	out := op.Run(t, "migrate-kv", "--dry-run")
	if !strings.Contains(out, "5 JSON state keys to rewrite (dry run") || !strings.HasPrefix(stateValues(t, c, prefix)[prefix+"state/mig/a"], "{") {
		t.Errorf("dry run: %s", out)
	}
	out = op.Run(t, "migrate-kv")
	if !strings.Contains(out, "5 JSON state keys rewritten") {
		t.Errorf("migrate-kv: %s", out)
	}
	checkWords("migrate-kv")
	for _, h := range hs {
		testenv.Eventually(t, 10*time.Second, holds(func() bool {
			r := serverRow(t, h, "mig", "a")
			return r.Note == "" && r.Reason == "contract" && r.Value == "drain"
		}, func() string {
			return fmt.Sprintf("%s: mig/a after migrate-kv: %+v", h.NodeID, serverRow(t, h, "mig", "a"))
		}))
	}
	if r := serverRow(t, hs[1], "mig", "c"); r.Until == nil || r.Until.UTC().Format(time.RFC3339) != until || r.Ramp != "1m0s" {
		t.Errorf("mig/c lost its until or ramp: %+v", r)
	}
	// A few more rounds of probes after the last replica applied it, each
	// answer as before.
	testenv.Consistently(t, 100*time.Millisecond, func() error {
		mu.Lock()
		defer mu.Unlock()
		return testenv.Expect(len(bad) == 0, "answers changed after migrate-kv: %v", bad[:min(len(bad), 10)])
	})
	close(stop)
	wg.Wait()
	rose := unconfirmed() - unconfirmedBefore
	t.Logf("migrate-kv: %d answers checked across 3 replicas, %d wrong, %d empty (unconfirmed checks rose by %.0f)", checked, len(bad), len(unanswered), rose)
	if float64(len(unanswered)) > rose {
		bad = append(bad, unanswered...) // more empty replies than unconfirmed checks: some were withheld
	}
	if len(bad) > 0 || checked < 3*len(servers) {
		t.Fatalf("answers changed while migrate-kv ran (%d of %d): %v", len(bad), checked, bad[:min(len(bad), 10)])
	}
}

// serverRow is the replica's status row of backend/server.
func serverRow(t *testing.T, h *Hastate, backend, server string) api.ServerState {
	t.Helper()
	var r api.ServerState
	h.GetJSON(t, "/v1/state/"+backend+"/"+server, &r)
	return r
}

// holds turns a condition and its failure message into an Eventually
// condition.
func holds(cond func() bool, msg func() string) func() error {
	return func() error {
		if cond() {
			return nil
		}
		return errors.New(msg())
	}
}
