package test

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/hastate/hastate/internal/history"
	"github.com/hastate/hastate/internal/nemesis"
	"github.com/hastate/hastate/internal/testenv"
)

// The fault-injection test, in the spirit of etcd's tests/robustness and
// Jepsen: three replicas behind a real HAProxy load balancer (TCP,
// health-checking /-/readiness), a real HAProxy fleet polling through it,
// writes from the CLI and from the Consul API, HAProxy-like pollers
// through the load balancer, and a seeded schedule of faults (package
// nemesis): SIGKILL, SIGSTOP/SIGCONT, raft links cut, Consul killed, the
// leader paused past the election timeout while a write is committed, a
// follower's disk wiped (it rejoins from a snapshot) and then made leader,
// a leadership hand-over, the load balancer cut from one replica, the
// leader's Consul token revoked and then restored.
//
// Consul runs as production does: ACLs on, default deny, and the shipped
// policies (deploy/terraform/policies). Each replica reads with its own
// token of the shipped read policy, in its own --consul-token-file (so
// that one replica's can be revoked; the shipped Terraform makes one
// token for all, which is TestE2EACLReplicasWithoutTokenNeverGuess's
// case); the CLI and the Consul API write with the shipped writer
// policy's token. A revoked leader hands over at once (a 403 is final);
// the replicas run with --kv-failover-after 10s, above the longest Consul
// fault, so that a Consul outage alone moves no leadership (with 3s, a
// leader whose Consul came back but whose identity was not yet read again
// handed over in the convergence window, and the new leader's barrier was
// an empty answer there).
//
// Judged: the whole history by porcupine (history.Linearizable: a register
// per server; each write from its call until a replica was seen serving
// it, pending when never seen; each answered check a read; no answer no
// operation), plus internal/history's rules (no answer a key never held,
// no step back for any poller) for their messages, and every replica and
// the fleet converged a bounded time after the last fault. During a token
// fault every replica is also asked directly, and those checks join the
// judged history. The run also fails when a wiped replica was not made
// leader, or a leader whose token Consul refuses leads longer than a
// hand-over once it saw the refusal. A failing
// history is written as porcupine's HTML visualisation under
// test/artifacts/ (or $HASTATE_ARTIFACTS); the seed is logged.
//
// Ramps are excluded, not modelled: the replicas run with
// --ramp-duration 0, so a written weight is served as written.
//
//	HASTATE_NEMESIS_SEED=<n>        repeat a run's schedule (the seed is logged)
//	HASTATE_NEMESIS_SEEDS=<k>       run k seeds one after another (make soak)
//	HASTATE_NEMESIS_DURATION=10m    of faults per seed, instead of 30s
//	HASTATE_NEMESIS_SERVE_ARGS=...  extra `hastate serve` flags
//	HASTATE_NEMESIS_MIXED=1         the last replica runs the previous release
//	                                (test/testdata/previous-release), faults
//	                                of every kind but token (make soak-mixed)
//	HASTATE_NEMESIS_REPLICAS=1      a control: one replica behind the load
//	                                balancer (no raft links to cut) cannot
//	                                step back, so any violation is the checker's

const (
	nemesisBackend = "be_nem"
	// nemesisServers are written by the CLI and Consul writers (half
	// each); one more, the last of r.servers, is written only by the
	// long-pause fault.
	nemesisServers = 8
	// nemesisPollers is how many HAProxy-like pollers check through the
	// load balancer, each one check at a time, 10ms apart.
	nemesisPollers = 4
	// convergeBound is how long after the last fault ended (and the last
	// write returned) every replica and the fleet must show the last
	// written state: a restarted -race replica catching up, the load
	// balancer's rise, the fleet's agent-inter, on two busy cores.
	convergeBound = 30 * time.Second
	// servedTimeout is how long a writer waits to see its write served
	// (a replica's /v1/cluster kv.synced_index at or past it) before it
	// counts as pending: it may take effect at any time after its call.
	servedTimeout = 10 * time.Second
	// minAnsweredPerSecond is the history's QPS floor: answered checks
	// through the load balancer per second of polling, over the whole run;
	// minServedWrites the writes seen served. A thinner history proves too
	// little, and the run fails.
	minAnsweredPerSecond = 40
	minServedWrites      = 20
	// nemesisSnapshotThreshold makes the replicas snapshot every 16
	// entries and keep 64 after a snapshot (cluster: four snapshots'
	// worth), so that a wiped replica rejoins from a snapshot.
	nemesisSnapshotThreshold = 16
)

func TestE2ENemesis(t *testing.T) {
	seed, fromEnv, err := nemesis.Seed(os.Getenv("HASTATE_NEMESIS_SEED"))
	if err != nil {
		t.Fatal(err)
	}
	d := 30 * time.Second // of faults: with set-up, the wipe's wait and convergence about 80s on two loaded cores
	if s := os.Getenv("HASTATE_NEMESIS_DURATION"); s != "" {
		if d, err = time.ParseDuration(s); err != nil {
			t.Fatalf("HASTATE_NEMESIS_DURATION=%q: %v", s, err)
		}
	}
	replicas := 3
	if s := os.Getenv("HASTATE_NEMESIS_REPLICAS"); s != "" {
		if _, err := fmt.Sscan(s, &replicas); err != nil || replicas < 1 {
			t.Fatalf("HASTATE_NEMESIS_REPLICAS=%q: want a number of replicas", s)
		}
	}
	seeds := 1
	if s := os.Getenv("HASTATE_NEMESIS_SEEDS"); s != "" {
		if _, err := fmt.Sscan(s, &seeds); err != nil || seeds < 1 {
			t.Fatalf("HASTATE_NEMESIS_SEEDS=%q: want a number of seeds", s)
		}
	}
	var prev string // the previous release's binary, for a mixed run
	kinds := nemesis.Kinds
	if os.Getenv("HASTATE_NEMESIS_MIXED") != "" {
		prev, kinds = previousReleaseBin(t), nemesis.MixedKinds
	}
	if seeds == 1 {
		plan := nemesis.Plan(seed, nemesis.Options{Duration: d, Kinds: kinds})
		t.Logf("nemesis seed %d (from HASTATE_NEMESIS_SEED: %v; rerun with HASTATE_NEMESIS_SEED=%d): %d faults over %s", seed, fromEnv, seed, len(plan), d)
		runNemesis(t, seed, replicas, plan, prev)
		return
	}
	var summary []string
	for i := range seeds {
		s := seed + uint64(i)
		t.Run(fmt.Sprintf("seed=%d", s), func(t *testing.T) {
			plan := nemesis.Plan(s, nemesis.Options{Duration: d, Kinds: kinds})
			t.Logf("nemesis seed %d (rerun with HASTATE_NEMESIS_SEED=%d): %d faults over %s", s, s, len(plan), d)
			sum := runNemesis(t, s, replicas, plan, prev)
			summary = append(summary, fmt.Sprintf("seed %d: %s; failed %v", s, sum, t.Failed()))
		})
	}
	t.Logf("figures: %d seeds of %s of faults:\n%s", seeds, d, strings.Join(summary, "\n"))
}

// TestE2EHistoryCheck is a fixed schedule of the nemesis (issue 23's
// leader kill and follower cut, issue 33's long leader pause with a write,
// a wiped follower that rejoins from a snapshot and is made leader, the
// load balancer cut from a follower, Consul restarted, the leader's token
// revoked and restored), judged by the same checks.
func TestE2EHistoryCheck(t *testing.T) {
	plan := []nemesis.Fault{
		{Kind: nemesis.Kill, Target: nemesis.Leader, Gap: 2 * time.Second, Hold: 3 * time.Second},
		{Kind: nemesis.PauseLong, Target: nemesis.Leader, Gap: 2 * time.Second, Hold: nemesis.LongPause},
		{Kind: nemesis.Wipe, Target: nemesis.Follower, Gap: 2 * time.Second, Hold: 2 * time.Second},
		{Kind: nemesis.LBCut, Target: nemesis.Follower, Gap: 2 * time.Second, Hold: 3 * time.Second},
		{Kind: nemesis.Cut, Target: nemesis.Follower, Gap: 2 * time.Second, Hold: 4 * time.Second},
		{Kind: nemesis.Consul, Target: nemesis.None, Gap: 2 * time.Second, Hold: 3 * time.Second},
		{Kind: nemesis.Token, Target: nemesis.Leader, Gap: 2 * time.Second, Hold: nemesis.TokenHold},
	}
	runNemesis(t, 1, 3, plan, "")
}

// TestE2ENemesisMixedRelease is a fixed schedule with one replica of the
// previous release in the cluster (a rolling upgrade half done), its
// leaders paused and deposed: the previous release answers the leader's
// "ack" with null, so a leader of this release confirms its rounds with
// raft's VerifyLeader while that replica's vote is needed; a leader paused
// past the election timeout must not confirm itself with replies held
// from before the election (issue 43's window). Judged as the nemesis is.
func TestE2ENemesisMixedRelease(t *testing.T) {
	plan := []nemesis.Fault{
		{Kind: nemesis.PauseLong, Target: nemesis.Leader, Gap: 2 * time.Second, Hold: nemesis.LongPause},
		{Kind: nemesis.Transfer, Target: nemesis.Leader, Gap: 2 * time.Second, Hold: 2 * time.Second},
		{Kind: nemesis.Pause, Target: nemesis.Leader, Gap: 2 * time.Second, Hold: 3 * time.Second},
		{Kind: nemesis.PauseLong, Target: nemesis.Leader, Gap: 2 * time.Second, Hold: nemesis.LongPause},
		{Kind: nemesis.Cut, Target: nemesis.Leader, Gap: 2 * time.Second, Hold: 3 * time.Second},
	}
	runNemesis(t, 1, 3, plan, previousReleaseBin(t))
}

// previousReleaseBin builds the previous release (test/testdata/previous-release).
func previousReleaseBin(t *testing.T) string {
	t.Helper()
	version, commit := previousRelease(t)
	return buildRelease(t, version, commit)
}

// nemesisFailoverAfter is the replicas' --kv-failover-after (30s by
// default): above the longest Consul fault (nemesis.Plan's MaxHold, 6s,
// plus the restart), so that a Consul outage moves no leadership, as with
// the default. A leader whose token Consul refuses hands over at once,
// whatever it says.
const nemesisFailoverAfter = 10 * time.Second

// tokenHandOver bounds how long a leader whose token is refused leads once
// it found the refusal: its failover loop's tick (1s), its ask of the
// peers' verdicts (2s at most) and the transfer.
const tokenHandOver = 5 * time.Second

// nemesisRun is the shared state of one run: what was written and told.
type nemesisRun struct {
	consul *testenv.Consul
	kv     *api.KV // the management token's: reads what was written
	// writerKV and writerTok are the shipped writer policy's (the
	// writers'); tokens[i] and tokenFiles[i] replica hs[i]'s read token.
	writerKV   *api.KV
	writerTok  testenv.Token
	tokens     []testenv.Token
	tokenFiles []string
	hs         []*Hastate
	servers    []string   // backend/server
	pick       *rand.Rand // which follower a fault hits, how a token is restored (seeded; used by the test's goroutine only)

	mu      sync.Mutex
	writes  []history.Write
	answers []history.Answer // through the load balancer
	direct  []history.Answer // asked of one replica directly (during token faults)
	counts  map[string]int   // figures: "cli", "cli failed", "consul", ...
	errs    []string         // harness errors from goroutines (reported by the test)
	cliErrs []string         // the first failed CLI writes, for the log
}

func (r *nemesisRun) count(what string) {
	r.mu.Lock()
	r.counts[what]++
	r.mu.Unlock()
}

func (r *nemesisRun) fail(format string, args ...any) {
	r.mu.Lock()
	if len(r.errs) < 10 {
		r.errs = append(r.errs, fmt.Sprintf(format, args...))
	}
	r.mu.Unlock()
}

// nemesisSummary is one run's figures, for make soak's table.
type nemesisSummary struct {
	Reads, Writes, Pending int
	Violations             int
	Linear                 string
	LongestWithheld        time.Duration
	WithheldDuring         string
	Token                  []string // per token fault: tokenFigures
}

func (s nemesisSummary) String() string {
	tok := "no token fault"
	if len(s.Token) > 0 {
		tok = "token faults: " + strings.Join(s.Token, "; ")
	}
	return fmt.Sprintf("operations checked %d (%d reads, %d writes of which %d pending), violations %d (porcupine: %s), longest withheld stretch %s (%s); %s",
		s.Reads+s.Writes, s.Reads, s.Writes, s.Pending, s.Violations, s.Linear, s.LongestWithheld.Round(time.Millisecond), s.WithheldDuring, tok)
}

// runNemesis runs plan; prev, when set, is the binary the last replica
// runs (the previous release: its Consul token comes from
// CONSUL_HTTP_TOKEN_FILE, which it reads at start).
func runNemesis(t *testing.T, seed uint64, replicas int, plan []nemesis.Fault, prev string) nemesisSummary {
	consul := testenv.StartConsul(t, testenv.ConsulOptions{Persistent: true, ACL: true})
	_, writerTok := consul.ShippedTokens(t, kvPrefix)
	args := []string{"--snapshot-threshold", fmt.Sprint(nemesisSnapshotThreshold), "--snapshot-interval", "1s",
		"--kv-failover-after", nemesisFailoverAfter.String()}
	args = append(args, strings.Fields(os.Getenv("HASTATE_NEMESIS_SERVE_ARGS"))...)
	hs := NewCluster(t, replicas, HastateOptions{ConsulAddr: consul.Addr(), Args: args})
	var tokens []testenv.Token
	var files []string
	for _, h := range hs {
		tok := consul.CreateToken(t, "hastate replica "+h.NodeID, "hastate-read")
		tokens, files = append(tokens, tok), append(files, tokenFile(t, tok.SecretID))
		if prev != "" && h == hs[len(hs)-1] {
			h.Use(prev)
			h.SetEnv(hermeticEnv("CONSUL_HTTP_TOKEN_FILE=" + files[len(files)-1]))
			continue
		}
		h.AddArgs("--consul-token-file", files[len(files)-1])
	}
	writerClient, err := api.NewClient(&api.Config{Address: consul.Addr(), Token: writerTok.SecretID})
	if err != nil {
		t.Fatal(err)
	}
	fnet := newFaultNet()
	mesh := newRaftMesh(t, fnet, hs)
	StartAll(t, hs...)
	// The load balancer reaches each replica through two links (agent
	// port, health check port) that a fault cuts.
	lbLinks := make([][2]*link, len(hs))
	for i, h := range hs {
		lbLinks[i] = [2]*link{fnet.Link(t, "lb-agent-"+h.NodeID, h.AgentAddr), fnet.Link(t, "lb-http-"+h.NodeID, h.HTTPAddr)}
	}
	lb := StartAgentLB(t, hs, LBOptions{Inter: 500 * time.Millisecond, Fall: 2, Rise: 2,
		Addrs: func(i int) (string, string) { return lbLinks[i][0].Addr, lbLinks[i][1].Addr }})
	be := Backend{Name: nemesisBackend}
	r := &nemesisRun{consul: consul, kv: consul.Client(t).KV(), writerKV: writerClient.KV(), writerTok: writerTok, tokens: tokens, tokenFiles: files,
		hs: hs, counts: map[string]int{}, pick: rand.New(rand.NewPCG(seed, 3))}
	for i := range nemesisServers + 1 {
		be.Servers = append(be.Servers, fmt.Sprintf("s%02d", i+1))
		r.servers = append(r.servers, fmt.Sprintf("%s/s%02d", nemesisBackend, i+1))
	}
	faultServer := r.servers[nemesisServers]
	faultKey := &keyState{}
	fleet := StartHAProxy(t, lb.Frontend, be)
	WaitLeader(t, 30*time.Second, hs...)

	// Writers: the first half of the servers written by the CLI (pointed
	// at each replica in turn with HASTATE_ADDR), the second half through
	// the Consul API; one writer per key, so that each write's index is
	// known.
	stopWrites, stopPolls := make(chan struct{}), make(chan struct{})
	var writers, pollers sync.WaitGroup
	stopWriters, stopPollers := sync.OnceFunc(func() { close(stopWrites); writers.Wait() }), sync.OnceFunc(func() { close(stopPolls); pollers.Wait() })
	// A failed wait below ends the test: the goroutines stop first.
	defer stopPollers()
	defer stopWriters()
	half := nemesisServers / 2
	writers.Add(2)
	go func() {
		defer writers.Done()
		r.cliWriter(rand.New(rand.NewPCG(seed, 1)), r.servers[:half], stopWrites)
	}()
	go func() {
		defer writers.Done()
		r.consulWriter(rand.New(rand.NewPCG(seed, 2)), r.servers[half:nemesisServers], stopWrites)
	}()
	pollStart := time.Now()
	for i := range nemesisPollers {
		pollers.Add(1)
		go func() {
			defer pollers.Done()
			r.poller(fmt.Sprintf("poller%d", i+1), lb.Frontend, rand.New(rand.NewPCG(seed, uint64(10+i))), stopPolls)
		}()
	}

	// The faults, one at a time, each ended and the cluster ready again
	// before the next one's gap.
	faults := map[nemesis.Kind]int{}
	type window struct {
		kind       nemesis.Kind
		from, till time.Time // from the fault's start until all replicas were ready again
	}
	var windows []window
	var notes []string // what the faults did that the schedule does not say
	var tokenFaults []tokenFigures
	began := time.Now()
	var lastEnd time.Time
	for i, f := range plan {
		<-time.After(f.Gap)
		h, what := r.target(t, f.Target)
		if len(r.hs) == 1 && (f.Kind == nemesis.Wipe || f.Kind == nemesis.PauseLong || f.Kind == nemesis.Transfer || f.Kind == nemesis.Token) {
			f.Kind = nemesis.Kill // one replica: nobody to take over or to rejoin from
		}
		injected := time.Now()
		switch f.Kind {
		case nemesis.Kill:
			h.Kill()
			<-time.After(f.Hold)
			lastEnd = time.Now()
			h.Start(t)
		case nemesis.Pause:
			h.Signal(t, syscall.SIGSTOP)
			<-time.After(f.Hold)
			lastEnd = time.Now()
			h.Signal(t, syscall.SIGCONT)
		case nemesis.PauseLong:
			h.Signal(t, syscall.SIGSTOP)
			// The others elect a leader and serve a write made meanwhile.
			x, err := r.leaderAmong(others(r.hs, h), 15*time.Second)
			if err == nil {
				w := r.faultWrite(faultServer, faultKey, injected)
				notes = append(notes, fmt.Sprintf("fault %d: %s led by %s while %s was stopped; wrote %s %q, served %v",
					i+1, f.Kind, x.NodeID, h.NodeID, faultServer, w.Answer, !w.Ended.IsZero()))
			} else {
				notes = append(notes, fmt.Sprintf("fault %d: %s: no new leader while %s was stopped: %v", i+1, f.Kind, h.NodeID, err))
			}
			<-time.After(time.Until(injected.Add(f.Hold)))
			lastEnd = time.Now()
			h.Signal(t, syscall.SIGCONT)
		case nemesis.Cut:
			cut := mesh.Isolate(h)
			<-time.After(f.Hold)
			lastEnd = time.Now()
			for _, l := range cut {
				l.Heal(t)
			}
		case nemesis.LBCut:
			ls := lbLinks[slices.Index(r.hs, h)]
			for _, l := range ls {
				l.Cut()
			}
			<-time.After(f.Hold)
			lastEnd = time.Now()
			for _, l := range ls {
				l.Heal(t)
			}
		case nemesis.Token:
			tf := r.tokenFault(t, h, f.Hold)
			lastEnd = tf.Restored
			tokenFaults = append(tokenFaults, tf)
		case nemesis.Consul:
			consul.Kill()
			<-time.After(f.Hold)
			lastEnd = time.Now()
			consul.Restart(t)
		case nemesis.Transfer:
			// SIGTERM: the leader hands leadership over, then exits.
			h.Stop(t)
			<-time.After(f.Hold)
			lastEnd = time.Now()
			h.Start(t)
		case nemesis.Wipe:
			h.Kill()
			if err := os.RemoveAll(h.DataDir); err != nil {
				t.Fatalf("wipe %s: %v", h.DataDir, err)
			}
			if err := os.MkdirAll(h.DataDir, 0o750); err != nil {
				t.Fatal(err)
			}
			<-time.After(f.Hold)
			// Past the entries the others keep after a snapshot, so that
			// the wiped replica rejoins from a snapshot.
			commit := r.waitCommit(others(r.hs, h), 6*nemesisSnapshotThreshold, 60*time.Second)
			lastEnd = time.Now()
			h.Start(t)
			h.WaitReady(t)
			installed := h.LogContains(t, "Installed remote snapshot")
			made, handOvers := r.makeLeader(t, h)
			lastEnd = time.Now()
			if !made {
				t.Errorf("fault %d: %s: the wiped replica %s was not made leader in %d hand-overs", i+1, f.Kind, h.NodeID, handOvers)
			}
			notes = append(notes, fmt.Sprintf("fault %d: %s %s: rejoined at commit index %d from a snapshot %v; led %v after %d hand-overs",
				i+1, f.Kind, h.NodeID, commit, installed, made, handOvers))
		}
		faults[f.Kind]++
		for _, x := range hs {
			x.WaitReady(t)
		}
		windows = append(windows, window{f.Kind, injected, time.Now()})
		t.Logf("fault %d/%d at +%s: %s%s; ended after %s; all ready %s later", i+1, len(plan), injected.Sub(began).Round(time.Millisecond), f.Kind, what,
			lastEnd.Sub(injected).Round(time.Millisecond), time.Since(lastEnd).Round(time.Millisecond))
	}
	stopWriters()
	writesDone := time.Now()
	deadline := slices.MaxFunc([]time.Time{lastEnd, writesDone}, time.Time.Compare).Add(convergeBound)

	// Convergence: every replica directly, and the fleet, show the last
	// written state by the deadline.
	r.mu.Lock()
	model := history.NewModel(r.writes)
	r.mu.Unlock()
	samples, convergedAt := r.sampleConvergence(model, deadline)
	var fleetAt time.Time
	var fleetLast string
	for time.Now().Before(deadline.Add(5 * time.Second)) {
		if fleetLast = fleetMismatch(fleet, model, r.servers); fleetLast == "" {
			fleetAt = time.Now()
			break
		}
		<-time.After(200 * time.Millisecond)
	}
	stopPollers()
	pollFor := time.Since(pollStart)

	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.errs {
		t.Errorf("harness: %s", e)
	}
	for _, e := range r.cliErrs {
		t.Logf("a failed write (during a fault): %s", e)
	}
	for _, n := range notes {
		t.Logf("%s", n)
	}
	// The direct checks of the token faults are judged with the others
	// (the figures below are the load balancer's).
	judgedAnswers := append(slices.Clone(r.answers), r.direct...)
	violations := model.Check(judgedAnswers)
	violations = append(violations, model.CheckConverged(nodeIDs(hs), samples, deadline)...)
	if fleetAt.IsZero() || fleetAt.After(deadline) {
		violations = append(violations, history.Violation{Kind: history.NotConverged, Answer: history.Answer{Poller: "haproxy fleet"},
			Detail: fmt.Sprintf("show stat not as written by the deadline: %s", fleetLast)})
	}
	during := func(at time.Time) string {
		for _, w := range windows {
			if !at.Before(w.from) && !at.After(w.till) {
				return string(w.kind)
			}
		}
		return "no fault"
	}
	judged, byKind, byFault := 0, map[history.Kind]int{}, map[string]int{}
	for _, a := range r.answers {
		if a.Line != "" {
			judged++
		}
	}
	for i, v := range violations {
		byKind[v.Kind]++
		byFault[during(v.Answer.Began)]++
		if i < 20 {
			t.Errorf("violation: %s", v)
		}
	}
	if len(violations) > 20 {
		t.Errorf("... and %d more violations", len(violations)-20)
	}

	// The verdict on the whole history, in real time across pollers.
	lin := history.Linearizable(r.writes, judgedAnswers, 3*time.Minute)
	if !lin.Ok() {
		dir, err := history.ArtifactsDir()
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, fmt.Sprintf("%s-seed-%d.html", strings.ReplaceAll(t.Name(), "/", "_"), seed))
		if err := lin.Visualize(path); err != nil {
			t.Errorf("visualise the history: %v", err)
		}
		t.Errorf("seed %d: the history is not linearizable: %s; porcupine's visualisation: %s (rerun with HASTATE_NEMESIS_SEED=%d)", seed, lin, path, seed)
	}
	longest, longestAt := longestWithheld(r.answers, pollStart)
	overlapping := "no fault"
	for _, w := range windows {
		if !longestAt.Add(longest).Before(w.from) && !longestAt.After(w.till) {
			overlapping = string(w.kind)
			break
		}
	}
	sum := nemesisSummary{Reads: lin.Reads, Writes: lin.Writes, Pending: lin.Pending, Violations: len(violations) + len(lin.Failing),
		Linear: string(lin.Result), LongestWithheld: longest, WithheldDuring: fmt.Sprintf("from +%s, overlapping %s", longestAt.Sub(began).Round(time.Second), overlapping)}
	for _, tf := range tokenFaults {
		sum.Token = append(sum.Token, tf.String(r.answers, r.direct, r.writes))
	}

	// The QPS floor: a thin history proves little.
	if rate := float64(judged) / pollFor.Seconds(); rate < minAnsweredPerSecond {
		t.Errorf("the history is too thin: %d answered checks in %s (%.1f/s), below the floor of %d/s", judged, pollFor.Round(time.Second), rate, minAnsweredPerSecond)
	}
	if served := lin.Writes - lin.Pending; served < minServedWrites {
		t.Errorf("the history is too thin: %d writes seen served, below the floor of %d", served, minServedWrites)
	}
	t.Logf("figures: seed %d: faults %d %v over %s; writes %d recorded (cli %d ok, %d failed; consul api %d ok, %d failed; %d pending: never seen served); checks through the load balancer %d, judged %d (%.1f/s), unanswered %d; violations %d %v, by the fault they fell in (from its start until all replicas were ready again) %v",
		seed, len(plan), faults, writesDone.Sub(began).Round(time.Second), len(r.writes), r.counts["cli"], r.counts["cli failed"], r.counts["consul"], r.counts["consul failed"], lin.Pending,
		len(r.answers), judged, float64(judged)/pollFor.Seconds(), len(r.answers)-judged, len(violations), byKind, byFault)
	t.Logf("figures: seed %d: linearizability (porcupine): %s", seed, lin)
	t.Logf("figures: seed %d: %s", seed, sum)
	t.Logf("figures: converged: replicas %s after the last fault ended, fleet %s (bound %s after the later of the last fault and the last write)",
		sinceOrNever(convergedAt, lastEnd), sinceOrNever(fleetAt, lastEnd), convergeBound)
	return sum
}

// longestWithheld is the longest stretch, from the start of polling, with
// no answered check through the load balancer (every poller told nothing),
// and when it began.
func longestWithheld(answers []history.Answer, from time.Time) (time.Duration, time.Time) {
	var ends []time.Time
	for _, a := range answers {
		if a.Line != "" {
			ends = append(ends, a.Ended)
		}
	}
	slices.SortFunc(ends, time.Time.Compare)
	var longest time.Duration
	at, last := from, from
	for _, e := range ends {
		if d := e.Sub(last); d > longest {
			longest, at = d, last
		}
		last = e
	}
	return longest, at
}

// quickClient asks replicas during faults: a stopped one must not hold a
// writer for long. /v1/cluster asks every peer for its status (a stopped
// one for up to 1s), so it gets 3s; /-/metrics answers at once.
var (
	quickClient   = &http.Client{Timeout: time.Second}
	clusterClient = &http.Client{Timeout: 3 * time.Second}
)

// quickCluster is /v1/cluster with clusterClient.
func quickCluster(h *Hastate) (ClusterInfo, error) {
	var c ClusterInfo
	code, body, err := h.getWith(clusterClient, "/v1/cluster")
	if err != nil {
		return c, err
	}
	if code != http.StatusOK {
		return c, fmt.Errorf("GET /v1/cluster: HTTP %d", code)
	}
	return c, json.Unmarshal(body, &c)
}

// served waits until a replica serves Consul index index of the prefix
// (its kv.synced_index: a follower's applied mirror, a leader's watch
// once applied, so the raft entry holding it is committed), at most
// servedTimeout, and returns when it saw that (zero: not seen, pending).
func (r *nemesisRun) served(index uint64) time.Time {
	deadline := time.Now().Add(servedTimeout)
	for time.Now().Before(deadline) {
		seen := make(chan bool, len(r.hs))
		for _, h := range r.hs {
			go func() {
				ci, err := quickCluster(h)
				seen <- err == nil && ci.KV.SyncedIndex >= index
			}()
		}
		ok := false
		for range r.hs {
			ok = <-seen || ok
		}
		if ok {
			return time.Now()
		}
		<-time.After(25 * time.Millisecond)
	}
	return time.Time{}
}

// leaderAmong waits until one of hs says it leads (quickly: a stopped
// replica is not among them) and returns it.
func (r *nemesisRun) leaderAmong(hs []*Hastate, timeout time.Duration) (*Hastate, error) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		for _, h := range hs {
			if st, err := h.raftStateWith(quickClient); err == nil && st == "leader" {
				return h, nil
			}
		}
		<-time.After(50 * time.Millisecond)
	}
	return nil, fmt.Errorf("none of %v led within %s", nodeIDs(hs), timeout)
}

// waitCommit waits until one of hs knows at least n entries committed
// (at most timeout) and returns the highest commit index seen.
func (r *nemesisRun) waitCommit(hs []*Hastate, n uint64, timeout time.Duration) uint64 {
	deadline := time.Now().Add(timeout)
	var best uint64
	for time.Now().Before(deadline) {
		for _, h := range hs {
			if ci, err := quickCluster(h); err == nil {
				best = max(best, ci.CommitIndex)
			}
		}
		if best >= n {
			return best
		}
		<-time.After(200 * time.Millisecond)
	}
	return best
}

// makeLeader makes h leader by the hand-over of a rolling restart: a
// SIGTERM of the leader, whose shutdown transfers leadership to the
// follower raft finds furthest ahead (raft's pickServer: the highest next
// index, a tie going to the first in the configuration, which is why a
// plain SIGTERM did not always pick h). So the other followers are stopped
// (SIGSTOP) first, until the leader has committed an entry past the last
// index its log had once they stopped: only h can have acknowledged it,
// so h alone is furthest ahead and is picked. They are resumed (SIGCONT)
// as soon as h leads or the old leader has exited, and the old leader is
// started again. At most 3 hand-overs; it returns whether h leads and how
// many hand-overs it took.
func (r *nemesisRun) makeLeader(t *testing.T, h *Hastate) (bool, int) {
	t.Helper()
	for n := range 3 {
		l := WaitLeader(t, 30*time.Second, r.hs...)
		if l == h {
			return true, n
		}
		rest := others(others(r.hs, l), h)
		for _, o := range rest {
			o.Signal(t, syscall.SIGSTOP)
		}
		if err := r.commitPastLog(l, 15*time.Second); err != nil {
			// The writers' entries did not come: the hand-over may still
			// pick h (a tie), and the next round tries again.
			t.Logf("make %s leader: %v", h.NodeID, err)
		}
		sent := l.Signal(t, syscall.SIGTERM)
		deadline := time.Now().Add(stopTimeout)
		for time.Now().Before(deadline) && !l.proc.Exited() {
			if st, err := h.raftStateWith(quickClient); err == nil && st == "leader" {
				break
			}
			<-time.After(20 * time.Millisecond)
		}
		for _, o := range rest {
			o.Signal(t, syscall.SIGCONT)
		}
		if code, took := l.Wait(t, sent); code != 0 {
			t.Errorf("make %s leader: %s exited %d after SIGTERM (took %s)", h.NodeID, l.NodeID, code, took)
		}
		l.Start(t)
		l.WaitReady(t)
	}
	return WaitLeader(t, 30*time.Second, r.hs...) == h, 3
}

// commitPastLog waits until leader l has committed an entry past the last
// index of its log when it was asked (its own raft_last_index), at most
// timeout.
func (r *nemesisRun) commitPastLog(l *Hastate, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last uint64
	for time.Now().Before(deadline) {
		ci, err := quickCluster(l)
		if err == nil && last == 0 {
			for _, m := range ci.Members {
				if m.ID == l.NodeID && m.Status != nil {
					last = m.Status.RaftLastIndex
				}
			}
		}
		if err == nil && last > 0 && ci.CommitIndex > last {
			return nil
		}
		<-time.After(50 * time.Millisecond)
	}
	return fmt.Errorf("%s did not commit past its last index %d within %s", l.NodeID, last, timeout)
}

// tokenFigures are what one token fault did.
type tokenFigures struct {
	Replica    string
	Restore    string    // "rotated" (a new token in its file) or "re-created" (the same accessor and secret)
	Revoked    time.Time // the token deleted
	Found      time.Time // the replica's /v1/cluster named the refused token (zero: never seen)
	HandedAt   time.Time // the replica no longer led (zero: it still led at the restore)
	HandedTo   string
	Led        time.Duration // the longest the replica led once the refusal was seen
	ByFailover bool          // its hastate_raft_kv_failovers_total rose: it handed over itself
	Restored   time.Time     // access restored
	Recovered  time.Time     // the replica's token read again (zero: not within the bound)
}

// String says what the fault did, with the answers (through the load
// balancer, and direct) and the writes between the revocation and the
// recovery.
func (f tokenFigures) String(lb, direct []history.Answer, writes []history.Write) string {
	till := f.Recovered
	if till.IsZero() {
		till = f.Restored
	}
	since := func(at time.Time) string { return sinceOrNever(at, f.Revoked) }
	ok, asked, longest := withheldDuring(lb, f.Revoked, till)
	byReplica := map[string][]history.Answer{}
	for _, a := range direct {
		byReplica[a.Poller] = append(byReplica[a.Poller], a)
	}
	var per []string
	for _, p := range slices.Sorted(maps.Keys(byReplica)) {
		o, n, l := withheldDuring(byReplica[p], f.Revoked, till)
		per = append(per, fmt.Sprintf("%s %d/%d (longest withheld %s)", strings.TrimPrefix(p, "direct-"), o, n, l.Round(time.Millisecond)))
	}
	served, pending, slowest := 0, 0, time.Duration(0)
	for _, w := range writes {
		if w.Began.Before(f.Revoked) || w.Began.After(till) {
			continue
		}
		if w.Ended.IsZero() {
			pending++
		} else {
			served++
			slowest = max(slowest, w.Ended.Sub(w.Began))
		}
	}
	return fmt.Sprintf("%s's token revoked: refusal seen after %s, handed over after %s to %s (by its failover %v; led %s at most after the refusal was seen), %s after %s, reading again %s after the revocation; "+
		"through the load balancer %d of %d checks answered (longest withheld %s); directly %s; writes begun meanwhile %d served (the slowest %s after its call), %d pending",
		f.Replica, since(f.Found), since(f.HandedAt), cmp.Or(f.HandedTo, "nobody"), f.ByFailover, f.Led.Round(time.Millisecond), f.Restore, f.Restored.Sub(f.Revoked).Round(time.Millisecond), since(f.Recovered),
		ok, asked, longest.Round(time.Millisecond), strings.Join(per, ", "), served, slowest.Round(time.Millisecond), pending)
}

// later is the later of a and b.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// withheldDuring counts the checks begun within [from, till] and those
// answered, and returns the longest stretch within it in which none was
// answered.
func withheldDuring(as []history.Answer, from, till time.Time) (answered, asked int, longest time.Duration) {
	var in []history.Answer
	for _, a := range as {
		if !a.Began.Before(from) && !a.Began.After(till) {
			in = append(in, a)
			asked++
			if a.Line != "" {
				answered++
			}
		}
	}
	longest, _ = longestWithheld(in, from)
	last := from
	for _, a := range in {
		if a.Line != "" && a.Ended.After(last) {
			last = a.Ended
		}
	}
	return answered, asked, max(longest, till.Sub(last))
}

// tokenFault revokes leader h's Consul token (`consul acl token delete`),
// holds that for hold and until h no longer leads (it must hand over
// after --kv-failover-after), then restores access: by the run's seeded
// pick a new token of the shipped read policy written to h's token file
// (a rotation) or the same accessor and secret created again (a
// revocation undone); and waits until h's token reads again. Every
// replica is asked directly meanwhile, and those checks join the judged
// history.
func (r *nemesisRun) tokenFault(t *testing.T, h *Hastate, hold time.Duration) tokenFigures {
	t.Helper()
	i := slices.Index(r.hs, h)
	f := tokenFigures{Replica: h.NodeID}
	stop := make(chan struct{})
	var askers sync.WaitGroup
	seed := r.pick.Uint64()
	for j, x := range r.hs {
		askers.Add(1)
		go func() {
			defer askers.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(j)))
			tickUntil(stop, 20*time.Millisecond, func() {
				a := r.check("direct-"+x.NodeID, x.AgentAddr, r.servers[rng.IntN(len(r.servers))])
				r.mu.Lock()
				r.direct = append(r.direct, a)
				r.mu.Unlock()
			})
		}()
	}
	defer func() { close(stop); askers.Wait() }()

	failovers := h.Metric(t, "hastate_raft_kv_failovers_total")
	r.consul.DeleteToken(t, r.tokens[i])
	f.Revoked = time.Now()
	// h leads now; leadSince is the start of its current stretch as
	// leader (zero while it does not lead).
	leadSince := f.Revoked
	deadline := f.Revoked.Add(hold + nemesisFailoverAfter + 30*time.Second)
	for time.Now().Before(deadline) {
		ci, err := quickCluster(h)
		now := time.Now()
		if err == nil {
			if f.Found.IsZero() && ci.ConsulToken != nil && ci.ConsulToken.Problem != nil {
				f.Found = now
			}
			switch leads := ci.State == "leader"; {
			case leads && leadSince.IsZero():
				leadSince = now // elected again while its token is refused
			case !leads && !leadSince.IsZero():
				f.Led = max(f.Led, now.Sub(later(leadSince, f.Found)))
				leadSince = time.Time{}
				if f.HandedAt.IsZero() {
					f.HandedAt = now
				}
			}
			if !f.HandedAt.IsZero() && f.HandedTo == "" && ci.LeaderID != h.NodeID {
				f.HandedTo = ci.LeaderID // "" during the election
			}
		}
		if leadSince.IsZero() && f.HandedTo != "" && now.Sub(f.Revoked) >= hold {
			break
		}
		<-time.After(100 * time.Millisecond)
	}
	if !leadSince.IsZero() {
		f.Led = max(f.Led, time.Since(later(leadSince, f.Found)))
	}
	// A leader whose token Consul refuses hands over at once (its own
	// failover, or an election: a starved leader loses its lease
	// first; both count): it leads no longer than a hand-over once the
	// refusal is found.
	f.ByFailover = h.Metric(t, "hastate_raft_kv_failovers_total") > failovers
	if bound := tokenHandOver; !leadSince.IsZero() || f.Found.IsZero() || f.Led > bound {
		t.Errorf("%s, whose token was revoked: refusal seen after %s, led for %s after it (bound %s: a hand-over), still leads %v: "+
			"a leader whose token cannot read must hand over at once", h.NodeID, sinceOrNever(f.Found, f.Revoked), f.Led.Round(time.Millisecond), bound, !leadSince.IsZero())
	}

	want := r.tokens[i].AccessorID
	if r.pick.IntN(2) == 0 {
		f.Restore = "re-created"
		r.consul.RecreateToken(t, r.tokens[i], "hastate replica "+h.NodeID+", restored", "hastate-read")
	} else {
		f.Restore = "rotated"
		r.tokens[i] = r.consul.CreateToken(t, "hastate replica "+h.NodeID+", rotated", "hastate-read")
		want = r.tokens[i].AccessorID
		writeToken(t, r.tokenFiles[i], r.tokens[i].SecretID)
	}
	f.Restored = time.Now()
	var last string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); <-time.After(100 * time.Millisecond) {
		ci, err := quickCluster(h)
		if err != nil {
			last = err.Error()
			continue
		}
		last = fmt.Sprintf("consul_token %+v, mirror %+v", ci.ConsulToken, ci.Mirror)
		if ci.ConsulToken != nil && ci.ConsulToken.Problem == nil && ci.ConsulToken.AccessorID == want && ci.Mirror != nil && ci.Mirror.CanMirror() {
			f.Recovered = time.Now()
			break
		}
	}
	if f.Recovered.IsZero() {
		t.Errorf("%s: its token %s (%s) does not read within 30s: %s", h.NodeID, want, f.Restore, last)
	}
	return f
}

// faultWrite is the long pause's write: the other value of server than its
// last (drain or ready) through the Consul API, learned and waited for
// like the writers' writes.
func (r *nemesisRun) faultWrite(server string, last *keyState, began time.Time) history.Write {
	value := "drain"
	if last.present {
		value = "ready"
	}
	if _, err := r.writerKV.Put(&api.KVPair{Key: stateKey(server), Value: []byte(value)}, nil); err != nil {
		r.count("fault write failed")
	}
	return r.learn(server, began, "fault", last)
}

func sinceOrNever(at, from time.Time) string {
	if at.IsZero() {
		return "never"
	}
	return at.Sub(from).Round(time.Millisecond).String()
}

// target resolves a fault's role to a replica (none for Consul faults).
func (r *nemesisRun) target(t *testing.T, role nemesis.Target) (*Hastate, string) {
	t.Helper()
	if role == nemesis.None {
		return nil, ""
	}
	leader := WaitLeader(t, 30*time.Second, r.hs...)
	if role == nemesis.Leader {
		return leader, " " + leader.NodeID + " (leader)"
	}
	fs := others(r.hs, leader)
	if len(fs) == 0 {
		return leader, " " + leader.NodeID + " (the only replica)"
	}
	h := fs[r.pick.IntN(len(fs))]
	return h, " " + h.NodeID + " (follower)"
}

// learn appends a write found in Consul for server after a writer's
// attempt, if the key changed, once it was seen served (or servedTimeout
// passed: then pending), and returns it (zero when nothing was written).
// last is the writer's previous knowledge of the key (index 0: absent).
func (r *nemesisRun) learn(server string, began time.Time, by string, last *keyState) history.Write {
	giveUp := time.Now().Add(60 * time.Second)
	for {
		pair, meta, err := r.kv.Get(stateKey(server), &api.QueryOptions{RequireConsistent: true})
		if err != nil {
			// Consul is down (a fault): ask again once it is back.
			if time.Now().After(giveUp) {
				r.fail("%s: could not read %s back from Consul: %v", by, server, err)
				return history.Write{}
			}
			<-time.After(200 * time.Millisecond)
			continue
		}
		w := history.Write{Server: server, Began: began, By: by}
		switch {
		case pair == nil && last.present:
			// A delete: its index is after the key's last write and at or
			// before the index Consul has now.
			w.Answer, w.Index, w.MaxIndex = history.Absent, last.index+1, meta.LastIndex
			last.present = false
		case pair == nil:
			return history.Write{} // still absent
		case last.present && pair.ModifyIndex == last.index:
			return history.Write{} // not written
		default:
			a, ok := history.AnswerFor(string(pair.Value))
			if !ok {
				r.fail("%s wrote %q to %s: not a value the checker knows", by, pair.Value, server)
				return history.Write{}
			}
			w.Answer, w.Index = a, pair.ModifyIndex
			last.present, last.index = true, pair.ModifyIndex
		}
		w.Ended = r.served(max(w.Index, w.MaxIndex))
		r.mu.Lock()
		r.writes = append(r.writes, w)
		r.mu.Unlock()
		return w
	}
}

type keyState struct {
	present bool
	index   uint64 // ModifyIndex of the last write, while present
}

// cliWriter runs `hastate drain|maint|weight|ready|clear` on its servers,
// pointed at each replica in turn, until stop is closed.
func (r *nemesisRun) cliWriter(rng *rand.Rand, servers []string, stop <-chan struct{}) {
	keys := map[string]*keyState{}
	for _, s := range servers {
		keys[s] = &keyState{}
	}
	op := Operator{ConsulAddr: r.consul.Addr()}
	for n := 0; ; n++ {
		select {
		case <-stop:
			return
		case <-time.After(time.Duration(100+rng.IntN(400)) * time.Millisecond):
		}
		srv := servers[rng.IntN(len(servers))]
		var args []string
		switch k := rng.IntN(10); {
		case k < 2:
			args = []string{"drain", srv}
		case k < 3:
			args = []string{"maint", srv}
		case k < 4:
			args = []string{"ready", srv}
		case k < 5:
			args = []string{"clear", srv}
		default:
			args = []string{"weight", fmt.Sprintf("%d%%", 1+rng.IntN(256)), srv}
		}
		if args[0] != "clear" {
			args = append(args, "--reason", "nemesis")
		}
		args = append(args, "--force", "--timeout", "5s")
		o := op
		o.Env = []string{"HASTATE_ADDR=http://" + r.hs[n%len(r.hs)].HTTPAddr, "CONSUL_HTTP_TOKEN=" + r.writerTok.SecretID}
		began := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		out, err := o.command(ctx, args...).CombinedOutput()
		cancel()
		var ee *exec.ExitError
		if errors.As(err, &ee) && ee.ExitCode() == 2 {
			r.fail("hastate %s: usage: %s", strings.Join(args, " "), out)
		}
		if err != nil {
			// A fault may fail a write (Consul down, the replica asked
			// killed or paused); whether it wrote is read back below.
			r.count("cli failed")
			r.mu.Lock()
			if r.counts["cli failed"] <= 3 {
				r.cliErrs = append(r.cliErrs, fmt.Sprintf("hastate %s: %v: %.300s", strings.Join(args, " "), err, out))
			}
			r.mu.Unlock()
		} else {
			r.count("cli")
		}
		r.learn(srv, began, "cli", keys[srv])
	}
}

// consulWriter writes its servers through the Consul API (as `consul kv
// put` does) until stop is closed: N%, drain, maint, ready, or a delete.
func (r *nemesisRun) consulWriter(rng *rand.Rand, servers []string, stop <-chan struct{}) {
	keys := map[string]*keyState{}
	for _, s := range servers {
		keys[s] = &keyState{}
	}
	kv := r.writerKV
	for {
		select {
		case <-stop:
			return
		case <-time.After(time.Duration(50+rng.IntN(250)) * time.Millisecond):
		}
		srv := servers[rng.IntN(len(servers))]
		var value string
		switch k := rng.IntN(10); {
		case k < 2:
			value = "drain"
		case k < 3:
			value = "maint"
		case k < 4:
			value = "ready"
		default:
			value = fmt.Sprintf("%d%%", 1+rng.IntN(256))
		}
		began := time.Now()
		var err error
		if rng.IntN(10) == 0 {
			_, err = kv.Delete(stateKey(srv), nil)
		} else {
			_, err = kv.Put(&api.KVPair{Key: stateKey(srv), Value: []byte(value)}, nil)
		}
		if err != nil {
			r.count("consul failed")
		} else {
			r.count("consul")
		}
		r.learn(srv, began, "consul", keys[srv])
	}
}

// poller checks the servers through the load balancer as an HAProxy does
// (connect, send "backend/server\n", read one line), one check at a time,
// until stop is closed.
func (r *nemesisRun) poller(name, addr string, rng *rand.Rand, stop <-chan struct{}) {
	tickUntil(stop, 10*time.Millisecond, func() {
		a := r.check(name, addr, r.servers[rng.IntN(len(r.servers))])
		r.mu.Lock()
		r.answers = append(r.answers, a)
		r.mu.Unlock()
	})
}

// check is one agent check of srv at addr, as poller name saw it.
func (r *nemesisRun) check(name, addr, srv string) history.Answer {
	began := time.Now()
	kind, ans, _ := probeAgent(addr, srv)
	a := history.Answer{Poller: name, Server: srv, Began: began, Ended: time.Now()}
	switch kind {
	case probeAnswered:
		a.Line = ans
	case probeFailed:
		if ans != "" {
			a.Line = ans // malformed: judged (never held)
		}
	}
	return a
}

// sampleConvergence asks every replica directly for every server every
// 100ms until all answer the last written state and keep it for a second,
// or the deadline has passed by a few seconds. It returns the samples and
// when all replicas first agreed (zero: never).
func (r *nemesisRun) sampleConvergence(model *history.Model, deadline time.Time) ([]history.Answer, time.Time) {
	var samples []history.Answer
	var agreed time.Time
	for {
		all := true
		for _, h := range r.hs {
			for _, srv := range r.servers {
				began := time.Now()
				kind, ans, _ := probeAgent(h.AgentAddr, srv)
				if kind != probeAnswered {
					ans = ""
				}
				samples = append(samples, history.Answer{Poller: h.NodeID, Server: srv, Began: began, Ended: time.Now(), Line: ans})
				all = all && ans == model.Final(srv)
			}
		}
		switch {
		case !all:
			agreed = time.Time{}
		case agreed.IsZero():
			agreed = time.Now()
		case time.Since(agreed) > time.Second:
			return samples, agreed
		}
		if time.Now().After(deadline.Add(5 * time.Second)) {
			return samples, agreed
		}
		<-time.After(100 * time.Millisecond)
	}
}

// fleetMismatch compares the fleet's show stat with the last written
// state; "" when every server shows it.
func fleetMismatch(fleet *HAProxy, model *history.Model, servers []string) string {
	st, err := fleet.stat()
	if err != nil {
		return err.Error()
	}
	var bad []string
	for _, srv := range servers {
		row := st[srv]
		want := model.Final(srv)
		ok := false
		switch {
		case want == "drain":
			ok = row.Status == statDrainAgent
		case want == "maint":
			ok = row.Status == "MAINT"
		default:
			var w int
			_, _ = fmt.Sscanf(want, "ready %d%%", &w)
			ok = row.Status == "UP" && row.Weight == min(256, w*serverWeight/100)
		}
		if !ok {
			bad = append(bad, fmt.Sprintf("%s: %s, want %q", srv, row, want))
		}
	}
	slices.Sort(bad)
	return strings.Join(bad, "; ")
}
