package test

import (
	"cmp"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hastate/hastate/internal/testenv"
	"github.com/hastate/hastate/state"
)

// previousRelease reads test/testdata/previous-release: the release this
// build rolls from and back to, and its commit in this repository.
func previousRelease(t *testing.T) (version, commit string) {
	t.Helper()
	b, err := os.ReadFile("testdata/previous-release")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		t.Fatalf("testdata/previous-release: %q, want \"<version> <commit>\"", b)
	}
	return f[0], f[1]
}

// buildRelease builds hastate at commit from this repository's own
// history (git archive into a temp dir, go build there with the module
// cache and no network), stamped as version.
func buildRelease(t *testing.T, version, commit string) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(t.TempDir(), "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	archive := exec.Command("sh", "-c", `git -C "$1" archive "$2" | tar -x -C "$3"`, "sh", root, commit, src)
	if out, err := archive.CombinedOutput(); err != nil {
		t.Fatalf("git archive %s (the previous release must be in this clone's history; a shallow clone lacks it: git fetch --unshallow): %v\n%s", commit, err, out)
	}
	bin := filepath.Join(t.TempDir(), "hastate-"+version)
	pkg := "github.com/hastate/hastate/internal/version"
	build := exec.Command("go", "build", "-o", bin, "-ldflags", "-X "+pkg+".Version="+version+" -X "+pkg+".Revision="+commit, "./cmd/hastate")
	build.Dir = src
	build.Env = append(os.Environ(), "GOFLAGS=-mod=readonly -buildvcs=false", "GOPROXY=off", "GOTOOLCHAIN=local")
	start := time.Now()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build of %s at %s: %v\n%s", version, commit, err, out)
	}
	t.Logf("built %s (%s) from this repository's history in %s", version, commit[:7], time.Since(start).Round(time.Second))
	return bin
}

// expect is what a server may be answered at a moment of the roll.
type expect struct {
	fixed map[string]bool // these answers
	// ramp: also "drain" and "ready N%", never below what the same
	// replica said before; once it said a weight, "drain" is wrong there.
	// (A weight that fixed also allows, e.g. "ready 100%" before a drain,
	// does not start the ramp.)
	ramp bool
}

// rollChecker probes every replica for every server in a loop and counts
// every answer that is not expected, or withheld while the replica is
// ready (its readiness is read before and after the round: a replica that
// is not ready both times is not counted, since the load balancer sends it
// no checks).
type rollChecker struct {
	hs      []*Hastate
	servers []string
	stop    chan struct{}
	wg      sync.WaitGroup

	mu       sync.Mutex
	skip     map[string]bool // replicas not judged (an unsafe rollback shown on purpose)
	want     map[string]expect
	lastW    map[string]map[string]int // replica -> server -> last ramp weight (-1: drained, no weight yet)
	checked  int
	wrong    int
	withheld int
	// unconfirmed counts the empty replies of a ready replica that could
	// not confirm with a leader (hastate_agent_unconfirmed_total rose by
	// as much over the round): leadership moving as a replica restarts.
	// HAProxy keeps its state; they are allowed, within a bound.
	unconfirmed int
	bad         []string
}

func startRollChecker(hs []*Hastate, want map[string]expect) *rollChecker {
	c := &rollChecker{hs: hs, servers: slices.Sorted(maps.Keys(want)), stop: make(chan struct{}), want: want, lastW: map[string]map[string]int{}, skip: map[string]bool{}}
	for _, h := range hs {
		c.lastW[h.NodeID] = map[string]int{}
		c.wg.Add(1)
		go c.run(h)
	}
	return c
}

// set changes what a server may be answered.
func (c *rollChecker) set(server string, e expect) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.want[server] = e
	if !e.ramp {
		for _, m := range c.lastW {
			delete(m, server)
		}
	}
}

// judge says whether the checker judges a replica's answers.
func (c *rollChecker) judge(id string, on bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.skip[id] = !on
}

func ready(h *Hastate) bool {
	cl := http.Client{Timeout: time.Second}
	resp, err := cl.Get("http://" + h.HTTPAddr + "/-/readiness")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

func (c *rollChecker) run(h *Hastate) {
	defer c.wg.Done()
	type probe struct {
		server, ans string
		kind        probeKind
	}
	for {
		select {
		case <-c.stop:
			return
		case <-time.After(20 * time.Millisecond):
		}
		// A probe is judged by what was expected when the round began
		// or when it is judged: a write may land in between.
		c.mu.Lock()
		began := maps.Clone(c.want)
		c.mu.Unlock()
		before := ready(h)
		u0, _ := unconfirmedChecks(h)
		var round []probe
		for _, s := range c.servers {
			kind, ans, _ := probeAgent(h.AgentAddr, s)
			round = append(round, probe{s, ans, kind})
		}
		if !before || !ready(h) {
			continue
		}
		u1, _ := unconfirmedChecks(h)
		unconfirmed := int(u1 - u0)
		c.mu.Lock()
		if c.skip[h.NodeID] {
			c.mu.Unlock()
			continue
		}
		for _, p := range round {
			c.checked++
			e := union(began[p.server], c.want[p.server])
			last, tracked := c.lastW[h.NodeID][p.server]
			w, isRamp := rampWeight(p.ans)
			var why string
			switch {
			case p.kind != probeAnswered && unconfirmed > 0:
				unconfirmed--
				c.unconfirmed++
			case p.kind != probeAnswered:
				c.withheld++
				why = "withheld while ready"
			case e.ramp && p.ans == "drain" && tracked && last >= 0:
				c.wrong++
				why = fmt.Sprintf("drain after the ramp reached %d%%", last)
			case e.ramp && p.ans == "drain":
				c.lastW[h.NodeID][p.server] = -1
			case e.ramp && isRamp && tracked && w < last:
				c.wrong++
				why = fmt.Sprintf("ramp stepped back from %d%%", last)
			case e.ramp && isRamp && (tracked || !e.fixed[p.ans]):
				c.lastW[h.NodeID][p.server] = w
			case e.fixed[p.ans]:
			default:
				c.wrong++
				why = fmt.Sprintf("wrong (want %v, ramp %v)", slices.Sorted(maps.Keys(e.fixed)), e.ramp)
			}
			if why != "" && len(c.bad) < 20 {
				c.bad = append(c.bad, fmt.Sprintf("%s %s %s: %q: %s", time.Now().Format("15:04:05.000"), h.NodeID, p.server, p.ans, why))
			}
		}
		c.mu.Unlock()
	}
}

// unconfirmedChecks reads h's hastate_agent_unconfirmed_total (0 on a
// release without it, which does not confirm).
func unconfirmedChecks(h *Hastate) (float64, error) {
	code, body, err := h.get("/-/metrics")
	if err != nil || code != http.StatusOK {
		return 0, fmt.Errorf("GET /-/metrics: HTTP %d: %v", code, err)
	}
	for line := range strings.Lines(string(body)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "hastate_agent_unconfirmed_total "); ok {
			return strconv.ParseFloat(v, 64)
		}
	}
	return 0, nil
}

// union is what either expectation allows.
func union(a, b expect) expect {
	u := expect{fixed: maps.Clone(a.fixed), ramp: a.ramp || b.ramp}
	if u.fixed == nil {
		u.fixed = map[string]bool{}
	}
	maps.Copy(u.fixed, b.fixed)
	return u
}

func (c *rollChecker) Stop() (checked, wrong, withheld, unconfirmed int, bad []string) {
	close(c.stop)
	c.wg.Wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.checked, c.wrong, c.withheld, c.unconfirmed, c.bad
}

func fixed(answers ...string) expect {
	m := map[string]bool{}
	for _, a := range answers {
		m[a] = true
	}
	return expect{fixed: m}
}

// TestE2ERollingUpgradeAndBack rolls a three-replica cluster, highest
// ordinal first and on the same data dirs, from the previous release
// (built from this repository's history) to this build and back, with
// HAProxy polling through a load balancer; then to this build for good
// (the cluster's feature level rises), and back the documented way: stop
// every replica, clear the data, start the previous release. Drains are
// written with both CLIs while the releases are mixed; a drain expires and
// a ramp runs through the roll. Every answer of a ready replica is checked.
func TestE2ERollingUpgradeAndBack(t *testing.T) {
	prevVersion, prevCommit := previousRelease(t)
	oldBin := buildRelease(t, prevVersion, prevCommit)
	c := testenv.StartConsul(t, testenv.ConsulOptions{})
	hs := NewCluster(t, 3, HastateOptions{ConsulAddr: c.Addr(),
		Args: []string{"--ramp-duration", "40s", "--ramp-interval", "1s", "--ramp-start", "10%"}})
	for _, h := range hs {
		h.Use(oldBin)
	}
	StartAll(t, hs...)
	roll := Backend{Name: "roll", Servers: []string{"ramp", "expire", "maint", "oldcli", "newcli", "newfor", "plain"}}
	hap := StartHAProxyLB(t, hs, roll)
	// The previous release's CLI has one override for every check.
	oldOp := Operator{Bin: oldBin, ConsulAddr: c.Addr(), Addr: hs[0].HTTPAddr, WriteFlags: []string{"--force"}}
	newOp := hs[0].Operator("--allow-unknown", "--allow-no-replica") // replicas restart one by one

	answers := func(h *Hastate) map[string]string {
		out := map[string]string{}
		for _, s := range roll.Servers {
			_, ans, _ := probeAgent(h.AgentAddr, "roll/"+s)
			out[s] = ans
		}
		return out
	}
	// agree: every replica answers the same for every server and holds
	// the same KV content (kv_digest is the same on both releases).
	agree := func(step string) {
		t.Helper()
		var last string
		testenv.Eventually(t, 30*time.Second, holds(func() bool {
			a0, d0 := answers(hs[0]), hs[0].Cluster(t).KVDigest
			for _, h := range hs[1:] {
				if a, d := answers(h), h.Cluster(t).KVDigest; !maps.Equal(a, a0) || d != d0 {
					last = fmt.Sprintf("%s: %v %s; %s: %v %s", hs[0].NodeID, a0, d0, h.NodeID, a, d)
					return false
				}
			}
			return true
		}, func() string { return step + ": replicas do not agree: " + last }))
		t.Logf("%s: all three agree: %v", step, answers(hs[0]))
	}
	// converged: every replica answers what e allows.
	converged := func(server string, e expect) bool {
		for _, h := range hs {
			_, ans, _ := probeAgent(h.AgentAddr, "roll/"+server)
			if _, isRamp := rampWeight(ans); !e.fixed[ans] && !(e.ramp && isRamp) {
				return false
			}
		}
		return true
	}
	// write runs a CLI write, widening what the server may be told to
	// both states until every replica answers the new one.
	var chk *rollChecker
	write := func(op Operator, server string, from, to expect, args ...string) string {
		t.Helper()
		chk.set("roll/"+server, union(from, to))
		out := op.Run(t, args...)
		testenv.Eventually(t, 15*time.Second, holds(func() bool { return converged(server, to) },
			func() string { return fmt.Sprintf("%s: replicas did not all take %v", strings.Join(args, " "), to) }))
		chk.set("roll/"+server, to)
		return out
	}
	rampish := expect{fixed: map[string]bool{"drain": true}, ramp: true}
	// What HAProxy itself shows for roll/ramp, sampled all along: while it
	// is UP (after its drain: ramping), its weight never goes down.
	var (
		hapMu      sync.Mutex
		hapSamples int
		hapBack    []string
		hapStop    = make(chan struct{})
		hapDone    = make(chan struct{})
	)
	go func() {
		defer close(hapDone)
		last := -1
		for {
			select {
			case <-hapStop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			st, err := hap.stat()
			r, ok := st["roll/ramp"]
			if err != nil || !ok {
				continue
			}
			if r.Status != "UP" { // drained: the ramp starts when it is UP again
				last = -1
				continue
			}
			hapMu.Lock()
			hapSamples++
			if r.Weight < last {
				hapBack = append(hapBack, fmt.Sprintf("%d after %d", r.Weight, last))
			}
			hapMu.Unlock()
			last = max(last, r.Weight)
		}
	}()

	// The previous release's CLI writes JSON: a drain that expires
	// during the roll, a maint, and a drain cleared to start a ramp that
	// runs through it.
	oldOp.Run(t, "drain", "roll/ramp")
	oldOp.Run(t, "maint", "roll/maint", "--reason", "disk")
	testenv.Eventually(t, 15*time.Second, holds(func() bool { return converged("ramp", fixed("drain")) && converged("maint", fixed("maint")) },
		func() string { return "the first writes did not reach every replica" }))
	agree("start, " + prevVersion)
	chk = startRollChecker(hs, map[string]expect{
		"roll/ramp": fixed("drain"), "roll/expire": fixed("ready 100%"), "roll/maint": fixed("maint"),
		"roll/oldcli": fixed("ready 100%"), "roll/newcli": fixed("ready 100%"), "roll/newfor": fixed("ready 100%"), "roll/plain": fixed("ready 100%"),
	})
	hap.WaitServer(t, "roll/ramp", statDrainAgent, -1) // HAProxy applied the drain: its ramp is seen from the start
	write(oldOp, "ramp", fixed("drain"), rampish, "clear", "roll/ramp")
	testenv.Eventually(t, 10*time.Second, holds(func() bool { w, ok := rampWeight(answers(hs[1])["ramp"]); return ok && w < 100 },
		func() string { return "the ramp did not start" }))

	upgrade := func(step string, h *Hastate, bin string, extra ...string) {
		t.Helper()
		if code, took := h.Stop(t); code != 0 {
			t.Fatalf("%s: %s exited %d after SIGTERM (%s)", step, h.NodeID, code, took)
		}
		h.Use(bin, extra...)
		h.Start(t)
		h.WaitReady(t)
		agree(step)
	}
	level := func(h *Hastate) int { return h.Cluster(t).Level.Applied }

	// Roll forward, the new replicas capped at level 1 (--feature-level):
	// rolling back with the data stays safe.
	for i, h := range slices.Backward(hs) {
		upgrade(fmt.Sprintf("forward, capped: %s runs this build", h.NodeID), h, "", "--feature-level", "1")
		if i == 2 {
			// Mixed: a drain with each CLI; this CLI's --for waits
			// for level 2, on every replica alike.
			write(oldOp, "oldcli", fixed("ready 100%"), fixed("drain"), "drain", "roll/oldcli", "--reason", "old CLI, mixed")
			write(newOp, "newcli", fixed("ready 100%"), fixed("drain"), "drain", "roll/newcli", "--reason", "new CLI, mixed")
			out := write(newOp, "newfor", fixed("ready 100%"), fixed("drain"), "drain", "roll/newfor", "--for", "2s", "--ramp", "3s")
			if !strings.Contains(out, "count only from feature level 2") {
				t.Errorf("this CLI's --for while mixed does not say that it waits:\n%s", out)
			}
			// An expiring drain (the previous CLI's JSON until, which
			// both releases read) expires while mixed.
			write(oldOp, "expire", fixed("ready 100%"), fixed("drain"), "drain", "roll/expire", "--for", "3s", "--reason", "expires while mixed")
			chk.set("roll/expire", rampish)
			testenv.Eventually(t, 20*time.Second, holds(func() bool { return converged("expire", expect{ramp: true}) },
				func() string { return "roll/expire did not expire while mixed" }))
			agree("mixed: drains written with both CLIs, one expired")
		}
	}
	for _, h := range hs {
		if l := level(h); l != state.LevelBase {
			t.Fatalf("%s: level %d with every replica capped at 1", h.NodeID, l)
		}
	}
	// The feature waits and says so: roll/newfor's until has passed, but
	// nobody expires it (a 0.13.0 replica would not), and the leader says
	// what waits.
	leader := WaitLeader(t, 10*time.Second, hs...)
	testenv.Eventually(t, 10*time.Second, holds(func() bool { return strings.Contains(leader.Cluster(t).Level.Waiting, "level 2") },
		func() string {
			return fmt.Sprintf("the leader does not say that level 2 waits: %+v", leader.Cluster(t).Level)
		}))
	consistently(t, 3*time.Second, func() bool { return converged("newfor", fixed("drain")) },
		func() string { return "roll/newfor expired while level 2 waits" })
	// And back, on the same data dirs.
	for _, h := range hs {
		upgrade(fmt.Sprintf("back: %s runs %s", h.NodeID, prevVersion), h, oldBin)
	}
	// Forward for good: level 2 once every replica runs this build; then
	// roll/newfor's meta key's until counts (it expires and ramps).
	chk.set("roll/newfor", rampish)
	for i, h := range slices.Backward(hs) {
		upgrade(fmt.Sprintf("forward: %s runs this build", h.NodeID), h, "")
		if i == 1 {
			for _, n := range hs[1:] {
				if in := n.Cluster(t).Level; in.Applied != state.LevelBase || !strings.Contains(in.Waiting+hs[2].Cluster(t).Level.Waiting, "n1 (") && n.Cluster(t).State == "leader" {
					t.Fatalf("%s: level %+v with n1 still on %s", n.NodeID, in, prevVersion)
				}
			}
			if a := answers(hs[0]); a["newfor"] != "drain" {
				t.Fatalf("roll/newfor answered %q before level 2", a["newfor"])
			}
		}
	}
	testenv.Eventually(t, 15*time.Second, holds(func() bool {
		for _, h := range hs {
			if level(h) != state.MaxLevel {
				return false
			}
		}
		return true
	}, func() string { return "the feature level did not rise on every replica" }))
	testenv.Eventually(t, 20*time.Second, holds(func() bool { return answers(hs[2])["newfor"] == "ready 100%" },
		func() string {
			return "roll/newfor did not expire and ramp (3s) once level 2 was in force: " + answers(hs[2])["newfor"]
		}))
	// Every ramp ends; then they agree for good.
	testenv.Eventually(t, 90*time.Second, holds(func() bool {
		a := answers(hs[0])
		return a["ramp"] == "ready 100%" && a["expire"] == "ready 100%"
	}, func() string { return fmt.Sprintf("ramps did not end: %v", answers(hs[0])) }))
	agree("all on this build, ramps done")
	if r := hap.Server(t, "roll/ramp"); r.Status != "UP" || r.Weight != serverWeight {
		t.Errorf("HAProxy shows roll/ramp %s after its ramp", r)
	}

	// The documented way back once level 2 is in force: clear what only
	// this release expires (0.13.0 reads no meta key), stop every
	// replica, clear the data, start the previous release.
	write(newOp, "newfor", fixed("ready 100%"), fixed("ready 100%"), "clear", "roll/newfor")
	write(newOp, "expire", fixed("ready 100%"), fixed("ready 100%"), "clear", "roll/expire")
	agree("before the way back")
	want := answers(hs[0])

	// Rolling one replica back with its data now is not safe, and it is
	// said loudly: the leader reports a member below the level in force
	// (or, had a level 2 snapshot been taken, 0.13.0 refuses it and exits).
	// Its answers are not judged: it replays the log without the meta
	// keys' until, so it may answer otherwise (what the report says).
	chk.judge("n3", false)
	if code, took := hs[2].Stop(t); code != 0 {
		t.Fatalf("n3 exited %d after SIGTERM (%s)", code, took)
	}
	hs[2].Use(oldBin)
	hs[2].Start(t)
	var said string
	testenv.Eventually(t, 20*time.Second, func() error {
		if hs[2].proc.Exited() {
			return testenv.Expect(hs[2].LogContains(t, "newer than this binary"), "n3 (%s) exited without saying why", prevVersion)
		}
		l := WaitLeader(t, 10*time.Second, hs[:2]...)
		said = l.Cluster(t).Level.Waiting
		return testenv.Expect(strings.Contains(said, "not every replica understands it") && strings.Contains(said, "n3 (") &&
			l.Metric(t, "hastate_cluster_level_waiting") == 1, "the leader does not report n3 below the level: %q", said)
	})
	t.Logf("n3 rolled back with its data after level 2: %s", cmp.Or(said, "it refused the snapshot and exited"))
	if hs[2].proc.Running() {
		t.Logf("n3 on %s with its data answers %v; n1 answers %v", prevVersion, answers(hs[2]), answers(hs[0]))
	}

	for _, h := range hs {
		if h.proc.Running() {
			h.Stop(t)
		}
		if err := os.RemoveAll(h.DataDir); err != nil {
			t.Fatal(err)
		}
		h.Use(oldBin)
	}
	StartAll(t, hs...)
	agree("the way back: " + prevVersion + " from empty data dirs")
	chk.judge("n3", true)
	if got := answers(hs[1]); !maps.Equal(got, want) {
		t.Errorf("after the way back: %v, want %v", got, want)
	}
	close(hapStop)
	<-hapDone
	t.Logf("HAProxy: roll/ramp sampled %d times while UP, weight stepped back %d times %v", hapSamples, len(hapBack), hapBack)
	if len(hapBack) > 0 || hapSamples == 0 {
		t.Errorf("HAProxy's weight of roll/ramp: %d samples, stepped back: %v", hapSamples, hapBack)
	}
	checked, wrong, withheld, unconfirmed, bad := chk.Stop()
	t.Logf("roll: %d answers of ready replicas checked: %d wrong, %d withheld, %d unanswered while no leader confirmed (leadership moving)", checked, wrong, withheld, unconfirmed)
	if wrong+withheld > 0 {
		t.Fatalf("%d wrong and %d withheld answers while ready; first: %s", wrong, withheld, strings.Join(bad, "\n"))
	}
	if unconfirmed > checked/20 {
		t.Errorf("%d of %d checks of ready replicas unanswered for want of a confirmation; want a moment per leader change", unconfirmed, checked)
	}
	if checked < 1000 {
		t.Fatalf("only %d answers checked", checked)
	}
	// HAProxy, which polled through the load balancer all along, shows
	// the same.
	for _, s := range roll.Servers {
		r := hap.Server(t, "roll/"+s)
		wantStatus := map[string]string{"drain": statDrainAgent, "maint": "MAINT"}[want[s]]
		if wantStatus == "" {
			wantStatus = "UP"
		}
		if r.Status != wantStatus {
			t.Errorf("HAProxy shows roll/%s %s, want %s (%s)", s, r.Status, wantStatus, want[s])
		}
	}
}
