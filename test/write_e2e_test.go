package test

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hastate/hastate/internal/testenv"
)

// Issue 22: the write path decides from Consul, waits for the replica, and
// names every guard it lifts. These tests run the CLI as an operator does,
// against real Consul, real replicas and real HAProxy, with the test
// Operator pointed at the replica under test and no flag added.

// waitPolled waits until the cluster knows that an HAProxy polls each of
// servers (backend/server).
func waitPolled(t *testing.T, h *Hastate, servers ...string) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, func() error {
		var v stateView
		h.GetJSON(t, "/v1/state?scope=cluster", &v)
		polled := map[string]bool{}
		for _, r := range v.Servers {
			if r.Polled > 0 {
				polled[r.Backend+"/"+r.Server] = true
			}
		}
		for _, s := range servers {
			if !polled[s] {
				return fmt.Errorf("no HAProxy has polled %s yet", s)
			}
		}
		return nil
	})
}

// retriedRE is the note a write prints when a concurrent write made it
// read Consul again.
var retriedRE = regexp.MustCompile(`read Consul and planned again (once|(\d+) times)`)

// TestE2EBackToBackWrites: two CLIs race on one backend, each issuing 50
// writes, every write followed at once by a dependent one: `weight 50%
// b/<own>` then `drain b/*` (refused: the server's own key escapes it),
// `drain b/* --keep-own` then `ready b/<own>` (written as ready: b/* covers
// it). Each write decides from a consistent Consul read in a conditional
// transaction, so neither stale views nor the other CLI's writes make one
// go wrong. Run plain and with --force (which must not skip the wait nor
// lift the partial-backend refusal).
func TestE2EBackToBackWrites(t *testing.T) {
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	h := StartHastate(t, HastateOptions{ConsulAddr: consul.Addr()})
	StartHAProxy(t, h.AgentAddr, Backend{Name: "race", Servers: []string{"a", "b"}})
	waitPolled(t, h, "race/a", "race/b")
	kv := consul.Client(t).KV()
	get := func(k string) string {
		p, _, err := kv.Get("hastate/state/"+k, nil)
		if err != nil {
			t.Errorf("get %s: %v", k, err)
			return "?"
		}
		if p == nil {
			return ""
		}
		return string(p.Value)
	}
	for _, mode := range [][]string{nil, {"--force"}} {
		t.Run(fmt.Sprintf("flags %v", mode), func(t *testing.T) {
			op := h.Operator(mode...)
			const iterations = 10 // of 5 writes: 50 writes per CLI
			type counts struct{ writes, ok, refused, wantRefused, retried, wrong int }
			var mu sync.Mutex
			total := map[string]*counts{}
			var wg sync.WaitGroup
			for _, srv := range []string{"a", "b"} {
				c := &counts{}
				total[srv] = c
				wg.Add(1)
				go func() {
					defer wg.Done()
					run := func(wantCode int, why string, args ...string) string {
						out, code := op.RunCode(t, args...)
						mu.Lock()
						defer mu.Unlock()
						c.writes++
						if m := retriedRE.FindStringSubmatch(out); m != nil {
							n, err := strconv.Atoi(m[2])
							if err != nil {
								n = 1 // "once"
							}
							c.retried += n
						}
						switch {
						case code == 0:
							c.ok++
						case code == 1 && strings.Contains(out, "would not reach servers with their own key"):
							c.refused++
						}
						if wantCode == 1 {
							c.wantRefused++
						}
						if code != wantCode || wantCode == 1 && !strings.Contains(out, "race/* would not reach servers with their own key") {
							c.wrong++
							t.Errorf("CLI %s: hastate %s: exit %d, want %d (%s):\n%s", srv, strings.Join(args, " "), code, wantCode, why, out)
						}
						return out
					}
					own := "race/" + srv
					for range iterations {
						run(0, "weight", "weight", "50%", own)
						run(1, "its own 50% escapes a backend-wide drain", "drain", "race/*")
						run(0, "backend-wide drain, own keys kept", "drain", "race/*", "--keep-own")
						run(0, "ready under race/*", "ready", own)
						// Only this CLI writes own, and race/* is never
						// cleared: ready must have written ready.
						if got := get(own); got != "ready" {
							mu.Lock()
							c.wrong++
							mu.Unlock()
							t.Errorf("CLI %s: after `ready %s` under race/* = drain, Consul holds %q for it, want ready (a delete would leave it drained)", srv, own, got)
						}
						run(0, "clear", "clear", own)
					}
				}()
			}
			wg.Wait()
			for _, srv := range []string{"a", "b"} {
				c := total[srv]
				t.Logf("figures: CLI %s (%v): %d writes, %d written, %d refused of %d that had to be, %d re-reads after a concurrent write, %d wrong",
					srv, mode, c.writes, c.ok, c.refused, c.wantRefused, c.retried, c.wrong)
				if c.writes != 5*iterations || c.refused != c.wantRefused || c.wrong != 0 {
					t.Errorf("CLI %s: %+v", srv, *c)
				}
			}
			// What the last write of each pair meant: race/* drained, each
			// server's own key cleared (it follows race/* again).
			if w, a, b := get("race/*"), get("race/a"), get("race/b"); w != "drain" || a != "" || b != "" {
				t.Errorf("after the race Consul holds race/*=%q race/a=%q race/b=%q; want drain and no own keys", w, a, b)
			}
			h.WaitAnswer(t, "race/a", "drain")
			h.WaitAnswer(t, "race/b", "drain")
			op.Run(t, "clear", "race/*")
		})
	}
}

// TestE2EWriteGuards: each guard has its own override, --force names every
// guard it lifts (in the output and the meta key), and precheck tells
// "blocked" (1) from "cannot confirm" (4).
func TestE2EWriteGuards(t *testing.T) {
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	hs := StartCluster(t, 3, HastateOptions{ConsulAddr: consul.Addr()})
	StartHAProxyLB(t, hs, Backend{Name: "gw", Servers: []string{"s1", "s2"}})
	waitPolled(t, hs[0], "gw/s1", "gw/s2")
	op := hs[0].Operator()
	meta := func(k string) string {
		p, _, err := consul.Client(t).KV().Get("hastate/meta/"+k, nil)
		if err != nil || p == nil {
			return ""
		}
		return string(p.Value)
	}

	// The typo guard: its own flag; --force names it.
	if out := op.RunExit(t, 3, "drain", "gw/s3"); !strings.Contains(out, "--allow-unknown") {
		t.Errorf("a typo: %s", out)
	}
	out := op.Run(t, "drain", "gw/s3", "--allow-unknown")
	if !strings.Contains(out, "guard lifted: unknown server (--allow-unknown); it would have said: no server matches 'gw/s3'") ||
		!strings.Contains(meta("gw/s3"), `"lifted":"unknown server (--allow-unknown)`) {
		t.Errorf("--allow-unknown: %s; meta %s", out, meta("gw/s3"))
	}
	op.Run(t, "clear", "gw/s3")

	// Capacity: --allow-unknown does not lift it; --force does, and says what
	// the guard would have said.
	op.Run(t, "drain", "gw/s2")
	if out := op.RunExit(t, 1, "drain", "gw/s1", "--allow-unknown", "--dry-run"); !strings.Contains(out, "gw would have 0 ready") || !strings.Contains(out, "--allow-below-min-ready") {
		t.Errorf("below --min-ready with --allow-unknown: %s", out)
	}
	out = op.Run(t, "drain", "gw/s1", "--force")
	if !strings.Contains(out, "guard lifted: capacity (--force); it would have said: gw would have 0 ready of the servers HAProxy polls (now 1)") ||
		!strings.Contains(meta("gw/s1"), "capacity (--force)") {
		t.Errorf("--force below --min-ready does not name the guard: %s; meta %s", out, meta("gw/s1"))
	}

	// precheck: drained blocks (1), maint passes (0), and what it cannot
	// confirm is 4: a replica down, Consul down.
	code := func(args ...string) int {
		_, c := op.RunCode(t, args...)
		return c
	}
	op.Run(t, "maint", "gw/s2", "--force")
	figures := map[string]int{"drained": code("precheck", "gw/s1"), "maint": code("precheck", "gw/s2")}
	hs[2].Kill()
	figures["replica unreachable"] = code("precheck", "gw/s2")
	// One replica down is routine during an upgrade (issue 34): a write
	// decides from the replicas that are up, and is refused (exit 4, its
	// own override) only while an HAProxy is seen by none of them.
	switch out, c := op.RunCode(t, "clear", "gw/s2"); {
	case c == 0:
	case c == 4 && strings.Contains(out, "seen by no live replica") && strings.Contains(out, "--allow-no-replica"):
		if out := op.Run(t, "clear", "gw/s2", "--allow-no-replica"); !strings.Contains(out, "guard lifted: no replica to ask (--allow-no-replica)") {
			t.Errorf("--allow-no-replica: %s", out)
		}
	default:
		t.Errorf("a write with a replica down: exit %d, want 0 (or 4 naming an HAProxy seen by no live replica):\n%s", c, out)
	}
	consul.Kill()
	figures["Consul unreachable"] = code("precheck", "gw/s2")
	if out := op.RunExit(t, 4, "drain", "gw/s2", "--force"); !strings.Contains(out, "nothing was written") {
		t.Errorf("a write with Consul down: %s", out)
	}
	t.Logf("figures: precheck exit codes: %v", figures)
	if c := figures["replica unreachable"]; c != 0 && c != 4 {
		t.Errorf("precheck with a replica down: exit %d, want 0 (decided from the replicas that are up) or 4 (an HAProxy seen by none)", c)
	}
	delete(figures, "replica unreachable")
	if want := map[string]int{"drained": 1, "maint": 0, "Consul unreachable": 4}; fmt.Sprint(figures) != fmt.Sprint(want) {
		t.Errorf("precheck exit codes %v, want %v", figures, want)
	}
}

// TestE2EOperatorAddsNoFlags: the harness's Operator runs a write exactly
// as given, against the replica under test: a server no HAProxy polls is
// refused (the typo guard), not forced through.
func TestE2EOperatorAddsNoFlags(t *testing.T) {
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	h := StartHastate(t, HastateOptions{ConsulAddr: consul.Addr()})
	op := Operator{ConsulAddr: consul.Addr(), Env: []string{"HASTATE_ADDR=" + h.HTTPAddr}}
	out, code := op.RunCode(t, "drain", "nobody/polls")
	if code == 0 {
		t.Fatalf("a write for a server no HAProxy polls went through (the Operator forced it?):\n%s", out)
	}
	if p, _, _ := consul.Client(t).KV().Get("hastate/state/nobody/polls", nil); p != nil {
		t.Fatalf("the refused write wrote %s", p.Key)
	}
}

// TestE2EWrongConsulCluster: a write to another Consul cluster than the
// one the replica reads (the same prefix) is refused, naming both, and
// writes nothing.
func TestE2EWrongConsulCluster(t *testing.T) {
	read := testenv.StartConsul(t, testenv.ConsulOptions{})
	other := testenv.StartConsul(t, testenv.ConsulOptions{})
	h := StartHastate(t, HastateOptions{ConsulAddr: read.Addr()})
	op := Operator{ConsulAddr: other.Addr(), Addr: h.HTTPAddr, WriteFlags: []string{"--force"}}
	testenv.Eventually(t, 10*time.Second, func() error {
		c := h.Cluster(t)
		return testenv.Expect(c.Consul != nil && c.Consul.Cluster != "", "/v1/cluster names no Consul cluster yet: %+v", c.Consul)
	})
	out := op.RunExit(t, 1, "drain", "web/a")
	if !strings.Contains(out, "of another Consul cluster") || !strings.Contains(out, other.Addr()) || !strings.Contains(out, "nothing was written") {
		t.Errorf("a write to another Consul: %s", out)
	}
	if keys, _, err := other.Client(t).KV().Keys("hastate/", "", nil); err != nil || len(keys) > 0 {
		t.Errorf("the refused write wrote %v (%v)", keys, err)
	}
	h.Operator("--allow-unknown").Run(t, "drain", "web/a")
	h.WaitAnswer(t, "web/a", "drain")
}
