package test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hastate/hastate/internal/testenv"
)

// caughtUpLine is in the log line a replica writes when it stops
// withholding after it caught up with the leader; withheld_for is the time
// since the node started.
const caughtUpLine = `"reason":"catching_up","withheld_for"`

// logLines returns the lines of the replica's log (all its runs) holding s.
func (h *Hastate) logLines(t testing.TB, s string) []string {
	t.Helper()
	b, err := os.ReadFile(h.proc.LogPath)
	if err != nil {
		t.Fatalf("read hastate log: %v", err)
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return out
}

// TestE2ERestartAnswersWithinASecond restarts a replica of three ten times,
// a follower and the leader in turn, two ways: a plain SIGTERM-and-start,
// and a start after the replica was down for 12s (killed, as in the demo:
// `kill -9`, then `scripts/demo.sh restart` a while later). A restarted
// replica's log already holds the leader's entries, so it has the leader's
// index as soon as the leader tells it the commit index; it must answer
// within a second of starting (its own withheld_for, from the node's start
// to its first answer) and its wall-clock time from the start of the
// process to the first answer is reported.
//
// Before the fix, the 12s-down restarts waited for the leader's
// replication backoff (raft doubles it after each failed AppendEntries, up
// to 10.24s): several seconds of catching_up with the indexes equal.
func TestE2ERestartAnswersWithinASecond(t *testing.T) {
	const (
		restarts = 10
		down     = 12 * time.Second
		server   = "be_rs/web1"
	)
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	hs := StartCluster(t, 3, HastateOptions{ConsulAddr: consul.Addr()})
	op := hs[0].Operator("--allow-unknown") // no HAProxy polls the server yet
	op.Run(t, "drain", server)
	for _, h := range hs {
		h.WaitAnswer(t, server, "drain")
	}
	type result struct {
		what            string
		withheld, total time.Duration
	}
	var results []result
	for i := range restarts {
		leader := WaitLeader(t, 15*time.Second, hs...)
		role, h := "leader", leader
		if i%2 == 0 {
			role, h = "follower", others(hs, leader)[0]
		}
		mode := "SIGTERM-and-start"
		if i%4 >= 2 {
			mode = fmt.Sprintf("down %s", down)
		}
		for _, o := range hs {
			o.WaitReady(t)
		}
		seen := len(h.logLines(t, caughtUpLine))
		if mode == "SIGTERM-and-start" {
			if code, took := h.Stop(t); code != 0 {
				t.Fatalf("%s exited with %d after SIGTERM (took %s)", h.NodeID, code, took)
			}
		} else {
			h.Kill()
			// The others keep a leader meanwhile (and elect one when the
			// leader was killed): the leader's replication to h fails.
			WaitLeader(t, 15*time.Second, others(hs, h)...)
			time.Sleep(down) // the downtime is what is measured against, not a wait for a condition
		}
		start := time.Now()
		h.Start(t)
		var total time.Duration
		testenv.Eventually(t, 30*time.Second, func() error {
			kind, ans, err := probeAgent(h.AgentAddr, server)
			if kind == probeAnswered && ans == "drain" {
				total = time.Since(start)
				return nil
			}
			return fmt.Errorf("restarted %s %s does not answer: %v %q %v", role, h.NodeID, kind, ans, err)
		})
		lines := h.logLines(t, caughtUpLine)
		if len(lines) <= seen {
			t.Fatalf("%s logged no catching_up line since its restart", h.NodeID)
		}
		var l struct {
			WithheldFor float64 `json:"withheld_for"`
		}
		if err := json.Unmarshal([]byte(lines[len(lines)-1]), &l); err != nil {
			t.Fatalf("%s: %v", lines[len(lines)-1], err)
		}
		r := result{what: fmt.Sprintf("%s %s (%s)", role, h.NodeID, mode), withheld: time.Duration(l.WithheldFor * float64(time.Second)), total: total}
		results = append(results, r)
		t.Logf("restart %d: %s: withheld %s after the node started; first answer %s after the process start",
			i+1, r.what, r.withheld.Round(time.Millisecond), r.total.Round(time.Millisecond))
	}
	var withheld, total durations
	byMode := map[string]durations{}
	for _, r := range results {
		withheld = append(withheld, r.withheld)
		total = append(total, r.total)
		mode := r.what[strings.Index(r.what, "(")+1 : len(r.what)-1]
		byMode[mode] = append(byMode[mode], r.withheld)
	}
	t.Logf("%d restarts: withheld (node start to first answer) p50 %s max %s; process start to first answer p50 %s max %s",
		restarts, withheld.quantile(0.5).Round(time.Millisecond), withheld.max().Round(time.Millisecond),
		total.quantile(0.5).Round(time.Millisecond), total.max().Round(time.Millisecond))
	for mode, d := range byMode {
		t.Logf("  %s: withheld p50 %s max %s (%d restarts)", mode, d.quantile(0.5).Round(time.Millisecond), d.max().Round(time.Millisecond), len(d))
	}
	// DESIGN: a restarted replica that has caught up answers within a
	// second. withheld_for runs from the node's start, so it also holds the
	// time to hear from the leader, which a loaded 2-core CI machine can
	// stretch (one run at load 30 saw 1.26s). The median holds the second;
	// each restart is held to 2s, still far below the replication backoff
	// this guards against (up to 10.24s: 8.6s at the median before the fix).
	if p50 := withheld.quantile(0.5); p50 > time.Second {
		t.Errorf("withheld p50 %s over %d restarts, want at most 1s", p50.Round(time.Millisecond), restarts)
	}
	for _, r := range results {
		if r.withheld > 2*time.Second {
			t.Errorf("%s withheld %s after it started, want at most 2s", r.what, r.withheld.Round(time.Millisecond))
		}
	}
}

// TestE2ERollingRestartUnderLoad restarts the three replicas one after
// another (SIGTERM with the chart's kind of --shutdown-delay, start on the
// same data dir, wait until the load balancer has it back), with an
// HAProxy polling a drained server through the agent load balancer (real
// HAProxy, TCP mode, health-checking /-/readiness) and checks through the
// load balancer every 20ms. No answer may be wrong, HAProxy's server must
// stay DRAIN throughout, and the time each replica spends out of the load
// balancer is reported.
func TestE2ERollingRestartUnderLoad(t *testing.T) {
	const server = "be_roll/web1"
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	hs := StartCluster(t, 3, HastateOptions{ConsulAddr: consul.Addr(), Args: []string{"--shutdown-delay", "1s"}})
	op := hs[0].Operator("--allow-unknown") // no HAProxy polls the server yet
	op.Run(t, "drain", server)
	for _, h := range hs {
		h.WaitAnswer(t, server, "drain")
	}
	lb := StartAgentLB(t, hs, LBOptions{Inter: 200 * time.Millisecond, Fall: 1, Rise: 2})
	fleet := StartHAProxy(t, lb.Frontend, Backend{Name: "be_roll", Servers: []string{"web1"}})
	fleet.WaitServer(t, server, "DRAIN (agent)", -1)
	lbp := startLBProbers(lb.Frontend, server)
	lbp.expectFromFirst("drain")
	lbp.expectBy(time.Now()) // every replica already answers drain
	lbp.waitProbes(t, 20)

	// Sample the load balancer's and the fleet's `show stat` every 50ms.
	type span struct{ from, to time.Time }
	var (
		mu       sync.Mutex
		out      = map[string][]span{} // replica row -> periods not UP
		fleetBad []string
	)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tickUntil(done, 50*time.Millisecond, func() {
			now := time.Now()
			st, err := lb.stat()
			fst, ferr := fleet.stat()
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				for i := range hs {
					row := agentLBName + "/" + lbServerName(i)
					s := out[row]
					up := st[row].Status == "UP"
					switch {
					case !up && (len(s) == 0 || !s[len(s)-1].to.IsZero()):
						out[row] = append(s, span{from: now})
					case up && len(s) > 0 && s[len(s)-1].to.IsZero():
						s[len(s)-1].to = now
					}
				}
			}
			if ferr == nil && fst[server].Status != "DRAIN (agent)" {
				fleetBad = append(fleetBad, fmt.Sprintf("%s: %s", now.Format("15:04:05.000"), fst[server]))
			}
		})
	}()

	for i, h := range hs {
		row := agentLBName + "/" + lbServerName(i)
		stopped := time.Now()
		if code, took := h.Stop(t); code != 0 {
			t.Fatalf("%s exited with %d after SIGTERM (took %s)", h.NodeID, code, took)
		}
		h.Start(t)
		h.WaitReady(t)
		lb.WaitServer(t, row, "UP", -1)
		t.Logf("restarted %s: back in the load balancer %s after its SIGTERM", h.NodeID, time.Since(stopped).Round(time.Millisecond))
	}
	lbp.waitProbes(t, 20)
	close(done)
	wg.Wait()
	res := lbp.stop()
	mu.Lock()
	defer mu.Unlock()
	for i, h := range hs {
		row := agentLBName + "/" + lbServerName(i)
		var sum time.Duration
		for _, s := range out[row] {
			if !s.to.IsZero() {
				sum += s.to.Sub(s.from)
			}
		}
		t.Logf("%s (%s) was out of the load balancer %s in %d period(s)", h.NodeID, row, sum.Round(time.Millisecond), len(out[row]))
	}
	t.Logf("checks through the load balancer: %d, %d answered drain, %d wrong, %d unanswered", res.total, res.ok, res.stale, res.unanswered)
	if res.stale != 0 {
		t.Errorf("%d wrong answers through the load balancer during the rolling restart (first: %s)", res.stale, res.firstStale)
	}
	if len(fleetBad) > 0 {
		t.Errorf("HAProxy's %s left DRAIN %d times during the rolling restart, first: %s", server, len(fleetBad), fleetBad[0])
	}
	if res.ok == 0 {
		t.Error("no check through the load balancer was answered")
	}
}

// TestE2ENotUnderstoodSurvivesRestarts runs a real replica through an
// entry it does not understand: it plays an older release with
// --feature-level 1 on a data dir whose log holds the level 2 entry. It
// withholds, and takes no snapshot while it does (raft tries every 500ms
// here, past 4 entries), so restarted with its --data-dir it meets the
// entry again and still withholds; run as this release (level 2
// understood), it applies the entry and everything after it and answers.
func TestE2ENotUnderstoodSurvivesRestarts(t *testing.T) {
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	// As this release, with raft's default snapshot thresholds: no
	// snapshot holds the level 2 entry yet (one taken past it would be
	// refused by the older release at restore, and it would never meet the
	// entry in its log; a CI run saw raft snapshot 86ms after the level rose).
	h := StartHastate(t, HastateOptions{ConsulAddr: consul.Addr()})
	testenv.Eventually(t, 15*time.Second, func() error {
		return testenv.Expect(h.LogContains(t, "feature level raised"), "the level never rose to this release's")
	})
	// No HAProxy polls be_nu, and a stuck replica cannot confirm a write.
	op := h.Operator("--allow-unknown", "--allow-no-replica")
	op.Run(t, "drain", "be_nu/web1")
	h.WaitAnswer(t, "be_nu/web1", "drain")
	if code, took := h.Stop(t); code != 0 {
		t.Fatalf("exit %d after SIGTERM (took %s)", code, took)
	}

	const refused = "no snapshot is taken while a raft entry is not understood"
	// An older release, with raft asking for a snapshot every 500ms past 4 entries.
	h.Use("", "--feature-level", "1", "--snapshot-threshold", "4", "--snapshot-interval", "500ms")
	h.Start(t)
	stuck := func(step string) {
		t.Helper()
		testenv.Eventually(t, 20*time.Second, func() error {
			code, body, err := h.get("/-/readiness")
			return testenv.Expect(err == nil && code == 503 && strings.Contains(string(body), "newer release"),
				"%s: /-/readiness %d %s %v, want 503 for an entry of a newer release", step, code, body, err)
		})
		if v := h.Metric(t, "hastate_fsm_entry_not_understood"); v != 1 {
			t.Errorf("%s: hastate_fsm_entry_not_understood = %v", step, v)
		}
		if kind, ans, _ := probeAgent(h.AgentAddr, "be_nu/web1"); kind != probeUnanswered {
			t.Errorf("%s: the replica answers %v %q after an entry it does not understand", step, kind, ans)
		}
	}
	stuck("first met")
	// Entries after it (the stuck leader still mirrors Consul) pass the
	// snapshot threshold: raft asks for a snapshot and is refused.
	for i := range 6 {
		op.Run(t, "drain", fmt.Sprintf("be_nu/web%d", i+2))
	}
	snapshots := func() int {
		d, _ := os.ReadDir(filepath.Join(h.DataDir, "snapshots"))
		return len(d)
	}
	testenv.Eventually(t, 20*time.Second, func() error {
		return testenv.Expect(h.LogContains(t, refused) || snapshots() > 0, "raft never asked for a snapshot while the replica was stuck")
	})
	if n := snapshots(); n > 0 {
		t.Errorf("the stuck replica took %d snapshot(s): its log no longer holds the entry it skipped", n)
	}
	if code, took := h.Stop(t); code != 0 {
		t.Fatalf("exit %d after SIGTERM (took %s)", code, took)
	}
	h.Start(t) // the same older release, the same --data-dir
	stuck("after a restart with --data-dir kept")
	if code, took := h.Stop(t); code != 0 {
		t.Fatalf("exit %d after SIGTERM (took %s)", code, took)
	}

	h.Use("") // this release: it understands the entry
	h.Start(t)
	h.WaitReady(t)
	for i := range 7 {
		h.WaitAnswer(t, fmt.Sprintf("be_nu/web%d", i+1), "drain")
	}
	if v := h.Metric(t, "hastate_fsm_entry_not_understood"); v != 0 {
		t.Errorf("upgraded: hastate_fsm_entry_not_understood = %v", v)
	}
}
