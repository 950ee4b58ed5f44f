package test

import (
	"encoding/json"
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
	c := &rollChecker{hs: hs, servers: slices.Sorted(maps.Keys(want)), stop: make(chan struct{}), want: want, lastW: map[string]map[string]int{}}
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

// wantLevelRise says that this release adds a kind of raft entry, so that
// its highest feature level (state.MaxLevel) is above the previous
// release's: 0.15.0 adds level 3 (state.LevelRecorded). The test holds the
// build to it both ways, and fails at once otherwise: entry kinds added
// without a level rise would be written while replicas of the previous
// release are members (they withhold every answer once they meet one),
// and a rise this constant does not expect would not be checked. Set it
// to false only for a release that adds no kind of entry; the test then
// checks that rolling one replica back with its data stays safe after the
// roll.
const wantLevelRise = true

// TestE2ERollingUpgradeAndBack rolls a three-replica cluster, highest
// ordinal first and on the same data dirs, from the previous release
// (built from this repository's history) to this build capped at the
// previous release's feature level, and back; then to this build for good,
// where the level rises to this build's only once every replica runs it;
// then one replica back with its data (refused loudly once the level rose)
// and the documented way back: stop every replica, clear the data, start
// the previous release. HAProxy polls through a load balancer all along.
// Drains are written with both CLIs while the releases are mixed, each CLI
// against a replica of the other release; two drains expire and a ramp runs
// through the roll. Every answer of a ready replica is checked.
//
// Levels are read, not assumed: the previous release's highest is what its
// replicas report (/v1/cluster level.build), this build's is state.MaxLevel.
func TestE2ERollingUpgradeAndBack(t *testing.T) {
	start := time.Now()
	prevVersion, prevCommit := previousRelease(t)
	oldBin := buildRelease(t, prevVersion, prevCommit)
	c := testenv.StartConsul(t, testenv.ConsulOptions{})
	hs := NewCluster(t, 3, HastateOptions{ConsulAddr: c.Addr(),
		Args: []string{"--ramp-duration", "40s", "--ramp-interval", "1s", "--ramp-start", "10%"}})
	for _, h := range hs {
		h.Use(oldBin)
	}
	StartAll(t, hs...)
	level := func(h *Hastate) int { return max(h.Cluster(t).Level.Applied, state.LevelBase) }

	// The previous release's highest level, as its replicas report it; a
	// new cluster of it puts that level in force at once.
	var prevLevel int
	testenv.Eventually(t, 15*time.Second, func() error {
		var seen []string
		prevLevel = max(hs[0].Cluster(t).Level.Build, state.LevelBase)
		same := true
		for _, h := range hs {
			in := h.Cluster(t).Level
			seen = append(seen, fmt.Sprintf("%s: %+v", h.NodeID, in))
			same = same && max(in.Build, state.LevelBase) == prevLevel && max(in.Applied, state.LevelBase) == prevLevel
		}
		return testenv.Expect(same, "%s's replicas do not all report the same level in force and built: %v", prevVersion, seen)
	})
	t.Logf("feature levels: %s's highest is %d, this build's (state.MaxLevel) %d; wantLevelRise %v", prevVersion, prevLevel, state.MaxLevel, wantLevelRise)
	switch {
	case wantLevelRise && state.MaxLevel <= prevLevel:
		t.Fatalf("this build's highest feature level (state.MaxLevel %d) is not above %s's (%d): the level must rise for a release that adds "+
			"kinds of raft entry (%s replicas withhold every answer once they meet one): add the level (state, cluster/leader/gate.go, docs/deploy.md "+
			"Upgrades), or, for a release that adds no kind of entry, set wantLevelRise to false", state.MaxLevel, prevVersion, prevLevel, prevVersion)
	case !wantLevelRise && state.MaxLevel != prevLevel:
		t.Fatalf("this build's highest feature level (state.MaxLevel %d) is not %s's (%d), but wantLevelRise is false: "+
			"set it to true, so that the rise is checked", state.MaxLevel, prevVersion, prevLevel)
	}
	nextLevel := fmt.Sprintf("level %d (", prevLevel+1)

	roll := Backend{Name: "roll", Servers: []string{"ramp", "expire", "maint", "oldcli", "newcli", "newfor", "plain"}}
	hap := StartHAProxyLB(t, hs, roll)
	// While the releases are mixed, each CLI asks a replica of the other
	// release: n3 is the first on this build, n1 the last. Every guard is on.
	oldOp := Operator{Bin: oldBin, ConsulAddr: c.Addr(), Addr: hs[2].HTTPAddr}
	newOp := hs[0].Operator()

	answers := func(h *Hastate) map[string]string {
		out := map[string]string{}
		for _, s := range roll.Servers {
			_, ans, _ := probeAgent(h.AgentAddr, "roll/"+s)
			out[s] = ans
		}
		return out
	}
	// agree: every replica answers the same for every server and holds
	// the same KV content (kv_digest is the same on both releases), and
	// none met an entry it does not understand (a kind of entry written
	// before every replica advertised it).
	agree := func(step string) {
		t.Helper()
		var last string
		testenv.Eventually(t, 30*time.Second, holds(func() bool {
			a0, d0 := answers(hs[0]), hs[0].Cluster(t).KVDigest
			for _, h := range hs {
				in := h.Cluster(t)
				if in.Level.NotUnderstood != "" {
					t.Fatalf("%s: %s met an entry it does not understand: %s", step, h.NodeID, in.Level.NotUnderstood)
				}
				if a := answers(h); !maps.Equal(a, a0) || in.KVDigest != d0 {
					last = fmt.Sprintf("%s: %v %s; %s: %v %s", hs[0].NodeID, a0, d0, h.NodeID, a, in.KVDigest)
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

	// The previous release's CLI (word + meta key): a maint, and a drain
	// cleared to start a ramp that runs through the roll.
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

	// Roll forward, this build capped at the previous release's level
	// (--feature-level): rolling back with the data stays safe.
	capped := strconv.Itoa(prevLevel)
	for i, h := range slices.Backward(hs) {
		upgrade(fmt.Sprintf("forward, capped at %d: %s runs this build", prevLevel, h.NodeID), h, "", "--feature-level", capped)
		if i == 2 {
			// Mixed: a drain with each CLI, and one with --for from
			// each that expires while mixed (a meta key's until and
			// ramp count from level 2 on, in force on both releases).
			write(oldOp, "oldcli", fixed("ready 100%"), fixed("drain"), "drain", "roll/oldcli", "--reason", "old CLI, mixed")
			write(newOp, "newcli", fixed("ready 100%"), fixed("drain"), "drain", "roll/newcli", "--reason", "new CLI, mixed")
			write(newOp, "newfor", fixed("ready 100%"), fixed("drain"), "drain", "roll/newfor", "--for", "3s", "--ramp", "3s")
			chk.set("roll/newfor", rampish)
			write(oldOp, "expire", fixed("ready 100%"), fixed("drain"), "drain", "roll/expire", "--for", "3s", "--reason", "expires while mixed")
			chk.set("roll/expire", rampish)
			testenv.Eventually(t, 20*time.Second, holds(func() bool { return converged("newfor", expect{ramp: true}) && converged("expire", expect{ramp: true}) },
				func() string {
					return fmt.Sprintf("roll/newfor and roll/expire did not both expire while mixed: %v", answers(hs[2]))
				}))
			agree("mixed: drains written with both CLIs, two expired")
		}
	}
	for _, h := range hs {
		if l := level(h); l != prevLevel {
			t.Fatalf("%s: level %d in force with every replica capped at %d", h.NodeID, l, prevLevel)
		}
	}
	if wantLevelRise {
		// What the cap holds back is said.
		leader := WaitLeader(t, 10*time.Second, hs...)
		testenv.Eventually(t, 10*time.Second, holds(func() bool {
			w := leader.Cluster(t).Level.Waiting
			return strings.Contains(w, nextLevel) && strings.Contains(w, "--feature-level")
		}, func() string {
			return fmt.Sprintf("the leader does not say that the cap holds level %d: %+v", prevLevel+1, leader.Cluster(t).Level)
		}))
	}
	// And back, on the same data dirs: the previous release applies
	// everything this build wrote (agree: nothing it does not understand).
	for _, h := range hs {
		upgrade(fmt.Sprintf("back: %s runs %s", h.NodeID, prevVersion), h, oldBin)
	}

	// Forward for good.
	for i, h := range slices.Backward(hs) {
		upgrade(fmt.Sprintf("forward: %s runs this build", h.NodeID), h, "")
		if i == 1 {
			mixedGate(t, hs, oldBin, prevVersion, prevLevel, upgrade)
		}
	}
	var lv []string
	testenv.Eventually(t, 15*time.Second, holds(func() bool {
		lv = nil
		for _, h := range hs {
			lv = append(lv, fmt.Sprintf("%s: %+v", h.NodeID, h.Cluster(t).Level))
			if level(h) != state.MaxLevel {
				return false
			}
		}
		return true
	}, func() string {
		return fmt.Sprintf("the feature level did not rise to %d on every replica: %v", state.MaxLevel, lv)
	}))
	if w := WaitLeader(t, 10*time.Second, hs...).Cluster(t).Level.Waiting; w != "" {
		t.Errorf("every replica runs this build at level %d, and the leader says: %s", state.MaxLevel, w)
	}
	// Every ramp ends; then they agree for good.
	testenv.Eventually(t, 90*time.Second, holds(func() bool {
		a := answers(hs[0])
		return a["ramp"] == "ready 100%" && a["expire"] == "ready 100%" && a["newfor"] == "ready 100%"
	}, func() string { return fmt.Sprintf("ramps did not end: %v", answers(hs[0])) }))
	agree("all on this build, ramps done")
	if r := hap.Server(t, "roll/ramp"); r.Status != "UP" || r.Weight != serverWeight {
		t.Errorf("HAProxy shows roll/ramp %s after its ramp", r)
	}

	// The documented way back (docs/deploy.md, Upgrades, Rollback): clear
	// the keys that expired (a replica that starts empty reads their until
	// anew), stop every replica, clear the data, start the previous release.
	write(newOp, "newfor", fixed("ready 100%"), fixed("ready 100%"), "clear", "roll/newfor")
	write(newOp, "expire", fixed("ready 100%"), fixed("ready 100%"), "clear", "roll/expire")
	agree("before the way back")
	want := answers(hs[0])

	// One replica back with its data: once the level rose it is refused
	// loudly (it meets what it does not understand and withholds, failing
	// readiness, or it refuses the snapshot and exits), and the leader
	// reports a member below the level in force. Without a rise it is safe:
	// it answers as the others. Its answers are judged whenever it is ready.
	if code, took := hs[2].Stop(t); code != 0 {
		t.Fatalf("n3 exited %d after SIGTERM (%s)", code, took)
	}
	hs[2].Use(oldBin)
	hs[2].Start(t)
	if wantLevelRise {
		var said, n3 string
		testenv.Eventually(t, 20*time.Second, func() error {
			if hs[2].proc.Exited() {
				n3 = "exited: " + hs[2].LogLine(t, "upgrade hastate")
				return testenv.Expect(hs[2].LogContains(t, "upgrade hastate"), "n3 (%s) exited without saying why", prevVersion)
			}
			code, body, err := hs[2].get("/v1/cluster")
			if err != nil || code != http.StatusOK {
				return fmt.Errorf("n3 on %s: GET /v1/cluster: %d %v", prevVersion, code, err)
			}
			var in ClusterInfo
			if err := json.Unmarshal(body, &in); err != nil {
				return fmt.Errorf("n3: /v1/cluster: %v", err)
			}
			n3 = in.Level.NotUnderstood
			if n3 == "" || ready(hs[2]) {
				return fmt.Errorf("n3 on %s with its data after level %d: not refused (not_understood %q, ready %v)", prevVersion, state.MaxLevel, n3, ready(hs[2]))
			}
			l := WaitLeader(t, 10*time.Second, hs[:2]...)
			said = l.Cluster(t).Level.Waiting
			return testenv.Expect(strings.Contains(said, "not every replica understands it") && strings.Contains(said, fmt.Sprintf("n3 (%s, level %d)", prevVersion, prevLevel)) &&
				l.Metric(t, "hastate_cluster_level_waiting") == 1, "the leader does not report n3 below the level: %q", said)
		})
		t.Logf("n3 rolled back with its data after level %d: it says %q; the leader says %q", state.MaxLevel, n3, said)
	} else {
		hs[2].WaitReady(t)
		agree(fmt.Sprintf("n3 back on %s with its data, no level rose", prevVersion))
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
	t.Logf("roll %s -> this build (levels %d -> %d) and back in %s: %d answers of ready replicas checked: %d wrong, %d withheld, %d unanswered while no leader confirmed (leadership moving)",
		prevVersion, prevLevel, state.MaxLevel, time.Since(start).Round(time.Second), checked, wrong, withheld, unconfirmed)
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

// mixedHold is how long a leader of this build leads a mixed cluster
// before the level may rise: longer than the period of every leader loop
// that writes entries (the record of HAProxy nodes: 5s), so that an entry
// of a new kind written too early reaches the previous release's replica,
// which then says it does not understand it.
const mixedHold = 7 * time.Second

// mixedGate checks this build's level gate with n2 and n3 on this build
// and n1 still on the previous release: the level in force stays the
// previous release's, on every replica, and (with a rise) every replica of
// this build says what waits for whom. The gate under test is this
// build's, so if n1 leads, it restarts on its release, handing leadership
// over (upgrade, as the roll does).
func mixedGate(t *testing.T, hs []*Hastate, oldBin, prevVersion string, prevLevel int, upgrade func(string, *Hastate, string, ...string)) {
	t.Helper()
	// From here a replica of this build leads (at the latest once n1
	// handed over): it holds for mixedHold.
	since := time.Now()
	if WaitLeader(t, 10*time.Second, hs...) == hs[0] {
		upgrade(fmt.Sprintf("n1 restarts on %s, handing leadership to this build", prevVersion), hs[0], oldBin)
	}
	leader := WaitLeader(t, 10*time.Second, hs...)
	if leader == hs[0] {
		t.Fatalf("n1 (%s) leads again after it handed leadership over", prevVersion)
	}
	nextLevel := fmt.Sprintf("level %d (", prevLevel+1)
	// n1 as the gate names a member that answered its status query with
	// the previous release and level.
	n1 := fmt.Sprintf("n1 (%s, level %d)", prevVersion, prevLevel)
	if wantLevelRise {
		var said []string
		testenv.Eventually(t, 10*time.Second, holds(func() bool {
			said = nil
			all := leader.Metric(t, "hastate_cluster_level_waiting") == 1
			for _, h := range hs[1:] {
				w := h.Cluster(t).Level.Waiting
				said = append(said, h.NodeID+": "+w)
				all = all && strings.Contains(w, nextLevel) && strings.Contains(w, n1)
			}
			return all
		}, func() string {
			return fmt.Sprintf("with n1 on %s, this build's replicas do not all say that level %d waits for %s: %q", prevVersion, prevLevel+1, n1, said)
		}))
		t.Logf("mixed, %s leads: %s", leader.NodeID, said[0])
	}
	// For mixedHold since this build leads, and at least two rounds of
	// its gate (one a second): nothing rises, and n1 meets nothing it
	// does not understand.
	var lv []string
	consistently(t, max(2*time.Second, time.Until(since.Add(mixedHold))), func() bool {
		lv = nil
		for _, h := range hs {
			in := h.Cluster(t).Level
			lv = append(lv, fmt.Sprintf("%s: %+v", h.NodeID, in))
			if max(in.Applied, state.LevelBase) != prevLevel || in.NotUnderstood != "" {
				return false
			}
		}
		return true
	}, func() string { return fmt.Sprintf("with n1 on %s: %v", prevVersion, lv) })
	if !wantLevelRise {
		for _, h := range hs[1:] {
			if w := h.Cluster(t).Level.Waiting; w != "" {
				t.Errorf("%s: no level is above %s's, and it says: %s", h.NodeID, prevVersion, w)
			}
		}
	}
}
