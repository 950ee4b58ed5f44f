package test

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/hastate/hastate/internal/testenv"
)

// The three-replica tests: three `hastate serve` processes in one raft
// cluster, a real Consul, real TCP on 127.0.0.1 and, for network faults,
// in-process toxiproxy links. HAProxy reaches the replicas through one load
// balancer address, so any replica may answer any check: every test checks
// all of them.

// Propagation: over propagationWrites writes to one key, the time from the
// Consul write returning until the last replica answers the new value.
// Writes are paced propagationGap apart, more than the Consul watch's
// minimum gap between two reads (50ms plus up to 50% jitter), so each write
// finds the leader's blocking query waiting, as an operator's write does.
const (
	propagationWrites = 200
	propagationGap    = 100 * time.Millisecond
	propagationTarget = 100 * time.Millisecond // p99 target: reported, not asserted
)

func measurePropagation(t testing.TB, consul *testenv.Consul, hs []*Hastate, writes int) durations {
	t.Helper()
	const server = "be_prop/web1"
	kv := consul.Client(t).KV()
	pace := time.NewTicker(propagationGap)
	defer pace.Stop()
	lat := make(durations, 0, writes)
	for i := range writes {
		n := i%200 + 1 // consecutive writes always differ
		want := fmt.Sprintf("ready %d%%", n)
		if _, err := kv.Put(&api.KVPair{Key: stateKey(server), Value: fmt.Appendf(nil, "%d%%", n)}, nil); err != nil {
			t.Fatalf("write %d: consul put: %v", i, err)
		}
		wrote := time.Now()
		last, err := waitAllAnswer(hs, server, want, 10*time.Second)
		if err != nil {
			t.Fatalf("write %d (%d%%) did not reach every replica: %v", i, n, err)
		}
		lat = append(lat, last.Sub(wrote))
		<-pace.C
	}
	return lat
}

// TestE2EClusterPropagation: every KV write is answered by all three
// replicas; the latency figures are logged (BenchmarkPropagation reports
// them as metrics).
func TestE2EClusterPropagation(t *testing.T) {
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	hs := StartCluster(t, 3, HastateOptions{ConsulAddr: consul.Addr()})
	leader := WaitLeader(t, 10*time.Second, hs...)

	lat := measurePropagation(t, consul, hs, propagationWrites)
	t.Logf("propagation over %d writes (leader %s), write returned -> last of 3 replicas answers: min %.1fms p50 %.1fms p90 %.1fms p99 %.1fms max %.1fms (p99 target %s, not asserted)",
		len(lat), leader.NodeID, ms(lat.min()), ms(lat.quantile(0.5)), ms(lat.quantile(0.9)), ms(lat.quantile(0.99)), ms(lat.max()), propagationTarget)
	waitMirrorsConsul(t, 10*time.Second, consul, hs...)
}

// BenchmarkPropagation reports the p50/p99 time from a Consul write
// returning until the last of three replicas answers it. One iteration is
// propagationWrites writes (about 20s), so run it once:
//
//	go test -run '^$' -bench Propagation -benchtime 1x ./test/
func BenchmarkPropagation(b *testing.B) {
	consul := testenv.StartConsul(b, testenv.ConsulOptions{})
	hs := StartCluster(b, 3, HastateOptions{ConsulAddr: consul.Addr()})
	WaitLeader(b, 10*time.Second, hs...)
	var lat durations
	for b.Loop() {
		lat = append(lat, measurePropagation(b, consul, hs, propagationWrites)...)
	}
	b.ReportMetric(ms(lat.quantile(0.5)), "p50_ms")
	b.ReportMetric(ms(lat.quantile(0.99)), "p99_ms")
	b.ReportMetric(ms(lat.max()), "max_ms")
	b.ReportMetric(float64(len(lat)), "writes")
}

// TestE2ELeaderSIGKILL kills the leader ten times. Each time the two
// survivors answer every check during the election with the value written
// before the kill or with nothing (no leader confirms their answers until
// the new one is in place; HAProxy keeps its state): zero errors, zero
// wrong answers. They elect a new leader,
// follow a KV write made after the failover; the killed replica restarts,
// catches up and answers the latest value.
func TestE2ELeaderSIGKILL(t *testing.T) {
	const (
		kills  = 10
		server = "be_fo/web1"
	)
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	hs := StartCluster(t, 3, HastateOptions{ConsulAddr: consul.Addr()})

	var elections, followed, rejoined durations
	probes := map[string]int{}
	for round := 1; round <= kills; round++ {
		leader := WaitLeader(t, 15*time.Second, hs...)
		survivors := others(hs, leader)

		// The value last written before the kill: every check must get it.
		want := fmt.Sprintf("ready %d%%", round)
		consul.Put(t, stateKey(server), fmt.Sprintf("%d%%", round))
		if _, err := waitAllAnswer(hs, server, want, 10*time.Second); err != nil {
			t.Fatalf("round %d: before the kill: %v", round, err)
		}
		p := startProbers(survivors, 3, server, want)
		p.waitProbes(t, 30)

		leader.Kill()
		killed := time.Now()
		next, seen := firstLeader(t, 15*time.Second, survivors...)
		elections = append(elections, seen.Sub(killed))
		WaitLeader(t, 10*time.Second, survivors...)
		p.waitProbes(t, 30) // and a few more with the new leader in place
		for id, c := range p.Stop() {
			probes[id] += c.OK
			// A survivor answers nothing (HAProxy keeps its state) while
			// no leader confirms its answers: from the kill until the
			// new leader has finished its barrier: allowed then, never a
			// wrong answer.
			if c.Unanswered > 0 && c.Unanswered == c.bad() && !c.LastBad.After(seen.Add(time.Second)) {
				t.Logf("round %d: survivor %s answered nothing to %d checks during an election of %s", round, id, c.Unanswered, seen.Sub(killed).Round(time.Millisecond))
				c.Unanswered = 0
			}
			if c.bad() > 0 || c.OK == 0 {
				t.Errorf("round %d: checks against survivor %s during the failover: %s; want only %q: %v", round, id, c, want, c.Bad)
			}
		}

		// The new leader follows KV: a write reaches both survivors.
		after := fmt.Sprintf("ready %d%%", 100+round)
		consul.Put(t, stateKey(server), fmt.Sprintf("%d%%", 100+round))
		wrote := time.Now()
		if _, err := waitAllAnswer(survivors, server, after, 10*time.Second); err != nil {
			t.Fatalf("round %d: a write after the failover: %v", round, err)
		}
		followed = append(followed, time.Since(wrote))

		// The killed replica restarts from its data dir and catches up.
		restart := time.Now()
		leader.Start(t)
		leader.WaitReady(t)
		if _, err := waitAllAnswer([]*Hastate{leader}, server, after, 10*time.Second); err != nil {
			t.Fatalf("round %d: restarted %s: %v", round, leader.NodeID, err)
		}
		rejoined = append(rejoined, time.Since(restart))
		waitMirrorsConsul(t, 10*time.Second, consul, hs...)
		t.Logf("round %d: killed leader %s; %s elected after %s; write after failover served by both survivors in %s; %s restarted, ready and caught up in %s",
			round, leader.NodeID, next.NodeID, elections[len(elections)-1].Round(time.Millisecond),
			followed[len(followed)-1].Round(time.Millisecond), leader.NodeID, rejoined[len(rejoined)-1].Round(time.Millisecond))
	}
	t.Logf("election time over %d leader kills (SIGKILL -> a survivor reports leader): min %s p50 %s max %s",
		len(elections), elections.min().Round(time.Millisecond), elections.quantile(0.5).Round(time.Millisecond), elections.max().Round(time.Millisecond))
	t.Logf("write after failover -> both survivors answer: p50 %s max %s; restart -> ready and caught up: p50 %s max %s; correct checks during the failovers: %v (zero errors, zero wrong answers)",
		followed.quantile(0.5).Round(time.Millisecond), followed.max().Round(time.Millisecond),
		rejoined.quantile(0.5).Round(time.Millisecond), rejoined.max().Round(time.Millisecond), probes)
}

// TestE2EPartition cuts the leader's raft links to both followers (real TCP
// through toxiproxy: open connections closed, new ones refused). The old
// leader steps down, answers nothing from the cut (it cannot confirm) and,
// past --leaderless-grace, fails readiness; the majority elects a leader and keeps following KV. After healing there is one leader and all
// three replicas hold identical state.
func TestE2EPartition(t *testing.T) {
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	hs := NewCluster(t, 3, HastateOptions{ConsulAddr: consul.Addr()})
	mesh := newRaftMesh(t, newFaultNet(), hs)
	StartAll(t, hs...)
	op := Operator{ConsulAddr: consul.Addr()}
	op.Run(t, "drain", "be_part/web1")
	op.Run(t, "weight", "50%", "be_part/web2")
	for _, h := range hs {
		h.WaitAnswer(t, "be_part/web1", "drain")
		h.WaitAnswer(t, "be_part/web2", "ready 50%")
	}
	old := WaitLeader(t, 10*time.Second, hs...)
	majority := others(hs, old)

	cut := mesh.Isolate(old)
	cutAt := time.Now()
	t.Logf("cut %d raft links of leader %s", len(cut), old.NodeID)

	// The old leader stops acting as leader: without contact with a quorum
	// for the leader lease it steps down.
	var oldInfo ClusterInfo
	testenv.Eventually(t, 5*time.Second, func() error {
		oldInfo = old.Cluster(t)
		return testenv.Expect(oldInfo.State != "leader", "isolated %s still says it leads: %+v", old.NodeID, oldInfo)
	})
	stepDown := time.Since(cutAt)
	next, seen := firstLeader(t, 15*time.Second, majority...)
	WaitLeader(t, 10*time.Second, majority...)
	t.Logf("partition: isolated leader %s stepped down %s after the cut (now %s); %s elected by the majority %s after the cut",
		old.NodeID, stepDown.Round(time.Millisecond), oldInfo.State, next.NodeID, seen.Sub(cutAt).Round(time.Millisecond))

	// The majority keeps following KV.
	wrote := time.Now()
	op.Run(t, "maint", "be_part/web1")
	if _, err := waitAllAnswer(majority, "be_part/web1", "maint", 10*time.Second); err != nil {
		t.Fatalf("during the partition: %v", err)
	}
	t.Logf("during the partition `hastate maint` was answered by both majority replicas %s after it started", time.Since(wrote).Round(time.Millisecond))

	// The agent never guesses: the isolated replica cannot confirm with a
	// leader (no quorum verifies it), so it answers nothing (HAProxy keeps
	// each server's state), from the cut on; once its last contact with a
	// leader (its own leadership) is older than --leaderless-grace it also
	// fails readiness, so the load balancer takes it out.
	if kind, ans, err := probeAgent(old.AgentAddr, "be_part/web1"); kind != probeUnanswered {
		t.Errorf("isolated %s answers %s after the cut: %v %q %v; want nothing", old.NodeID, time.Since(cutAt).Round(time.Millisecond), kind, ans, err)
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		if code, rd := old.Readiness(t); code != 503 {
			return fmt.Errorf("isolated %s still ready: %d %q", old.NodeID, code, rd.Detail)
		}
		return nil
	})
	withheld := time.Since(cutAt)
	if withheld < 3*time.Second-contactSlack {
		t.Errorf("isolated %s failed readiness %s after the cut, before the default --leaderless-grace 3s", old.NodeID, withheld)
	}
	consistently(t, time.Second, func() bool {
		st, err := old.raftState()
		kind, _, _ := probeAgent(old.AgentAddr, "be_part/web2")
		return err == nil && st != "leader" && kind == probeUnanswered
	}, func() string {
		st, _ := old.raftState()
		return fmt.Sprintf("isolated %s (raft %s) answers %q, want no answer", old.NodeID, st, old.Ask(t, "be_part/web2"))
	})
	if code, rd := old.Readiness(t); code != 503 || !strings.Contains(rd.Detail, "--leaderless-grace") {
		t.Errorf("isolated %s: /-/readiness %d %+v; want 503 naming --leaderless-grace", old.NodeID, code, rd)
	}
	t.Logf("partition: isolated %s answers nothing from the cut and fails readiness %s after it", old.NodeID, withheld.Round(time.Millisecond))

	// Heal.
	for _, l := range cut {
		l.Heal(t)
	}
	healAt := time.Now()
	leader := WaitLeader(t, 20*time.Second, hs...)
	agreed := time.Since(healAt)
	digest := waitMirrorsConsul(t, 10*time.Second, consul, hs...)
	converged := time.Since(healAt)
	want := stateServers(t, hs[0])
	for _, h := range hs[1:] {
		if got := stateServers(t, h); got != want {
			t.Errorf("after healing, /v1/state of %s differs from %s's:\n%s\nvs\n%s", h.NodeID, hs[0].NodeID, got, want)
		}
	}
	for _, h := range hs {
		if got := h.Ask(t, "be_part/web1"); got != "maint" {
			t.Errorf("after healing, %s answers %q for be_part/web1, want maint", h.NodeID, got)
		}
	}
	// One leader, and it follows KV for all three.
	op.Run(t, "clear", "be_part/web2")
	if _, err := waitAllAnswer(hs, "be_part/web2", "ready 100%", 10*time.Second); err != nil {
		t.Fatalf("after healing: %v", err)
	}
	t.Logf("healed: all three agree on leader %s %s after healing; identical state (kv_digest %.12s, /v1/state equal) %s after healing",
		leader.NodeID, agreed.Round(time.Millisecond), digest, converged.Round(time.Millisecond))
}

// TestE2EConsulUnreachableFromLeader: every replica reaches Consul through
// its own link; the leader's is cut. Leadership moves to a follower that can
// reach Consul after --kv-failover-after, and KV changes flow again to all
// three (the old leader through raft).
func TestE2EConsulUnreachableFromLeader(t *testing.T) {
	const failoverAfter = 3 * time.Second
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	hs := NewCluster(t, 3, HastateOptions{ConsulAddr: consul.Addr(), Args: []string{"--kv-failover-after", failoverAfter.String()}})
	fn := newFaultNet()
	links := map[*Hastate]*link{}
	for _, h := range hs {
		links[h] = fn.Link(t, "consul-"+h.NodeID, consul.Addr())
		h.AddArgs("--consul-addr", links[h].Addr) // the last --consul-addr wins
	}
	StartAll(t, hs...)
	op := Operator{ConsulAddr: consul.Addr()}
	op.Run(t, "drain", "be_cu/web1")
	if _, err := waitAllAnswer(hs, "be_cu/web1", "drain", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	old := WaitLeader(t, 10*time.Second, hs...)
	followers := others(hs, old)

	links[old].Cut()
	cutAt := time.Now()
	next, seen := firstLeader(t, failoverAfter+20*time.Second, followers...)
	moved := seen.Sub(cutAt)
	WaitLeader(t, 10*time.Second, hs...)
	t.Logf("Consul cut from leader %s: leadership moved to %s %s after the cut (--kv-failover-after %s)",
		old.NodeID, next.NodeID, moved.Round(time.Millisecond), failoverAfter)
	if moved < failoverAfter {
		t.Errorf("leadership moved %s after the cut, before --kv-failover-after %s", moved, failoverAfter)
	}
	if got := old.Metric(t, "hastate_raft_kv_failovers_total"); got != 1 {
		t.Errorf("%s: hastate_raft_kv_failovers_total = %v, want 1", old.NodeID, got)
	}
	if !old.LogContains(t, "handing leadership to a follower that can") {
		t.Errorf("%s did not log why it handed leadership over", old.NodeID)
	}

	// KV changes flow again, to the old leader too (through raft: its own
	// Consul is still cut).
	wrote := time.Now() // includes the CLI's own run
	op.Run(t, "maint", "be_cu/web1")
	if _, err := waitAllAnswer(hs, "be_cu/web1", "maint", 15*time.Second); err != nil {
		t.Fatalf("after the Consul failover: %v", err)
	}
	t.Logf("a write after the failover reached all three replicas in %s (%s still cut from Consul)",
		time.Since(wrote).Round(time.Millisecond), old.NodeID)
	waitMirrorsConsul(t, 10*time.Second, consul, hs...)
	if code, rd := old.Readiness(t); code != 200 {
		t.Errorf("%s (cut from Consul): /-/readiness %d %+v; want 200", old.NodeID, code, rd)
	}
}

// TestE2EAllRestartWithConsulDown: three synced replicas, Consul dies, all
// three are stopped and started again while it is down. They form a
// cluster, become ready and serve the last known state; once Consul is back
// a new write flows.
func TestE2EAllRestartWithConsulDown(t *testing.T) {
	consul := testenv.StartConsul(t, testenv.ConsulOptions{Persistent: true})
	hs := StartCluster(t, 3, HastateOptions{ConsulAddr: consul.Addr()})
	op := Operator{ConsulAddr: consul.Addr()}
	op.Run(t, "drain", "be_rs/web1")
	op.Run(t, "weight", "25%", "be_rs/web2")
	op.Run(t, "maint", "be_rs2/*")
	want := map[string]string{
		"be_rs/web1":  "drain",
		"be_rs/web2":  "ready 25%",
		"be_rs2/api1": "maint",
		"be_rs/web3":  "ready 100%",
	}
	servers := slices.Sorted(maps.Keys(want))
	digest := waitMirrorsConsul(t, 10*time.Second, consul, hs...)
	for _, h := range hs {
		for _, s := range servers {
			h.WaitAnswer(t, s, want[s])
		}
	}

	consul.Kill()
	leader := WaitLeader(t, 10*time.Second, hs...)
	// Followers first, then the leader: as a rolling restart would, but no
	// replica comes back before all are down.
	for _, h := range append(others(hs, leader), leader) {
		code, took := h.Stop(t)
		if code != 0 {
			t.Fatalf("%s exited with code %d after SIGTERM", h.NodeID, code)
		}
		t.Logf("%s stopped in %s", h.NodeID, took.Round(time.Millisecond))
	}

	start := time.Now()
	StartAll(t, hs...) // all at once (podManagementPolicy: Parallel)
	ready := time.Since(start)
	leader = WaitLeader(t, 10*time.Second, hs...)
	t.Logf("all three restarted with Consul down: ready after %s, leader %s", ready.Round(time.Millisecond), leader.NodeID)
	for _, h := range hs {
		if got := h.Answers(t, servers...); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s after the restart with Consul down answers %v, want %v", h.NodeID, got, want)
		}
		if c := h.Cluster(t); c.KVDigest != digest {
			t.Errorf("%s after the restart holds kv_digest %.12s, want %.12s (the state before)", h.NodeID, c.KVDigest, digest)
		}
	}
	if _, rd := leader.Readiness(t); watch(rd).Reachable {
		t.Errorf("leader %s readiness says Consul is reachable while it is down: %+v", leader.NodeID, rd)
	}

	consul.Restart(t)
	back := time.Now()
	op.Run(t, "drain", "be_rs/web3")
	if _, err := waitAllAnswer(hs, "be_rs/web3", "drain", 30*time.Second); err != nil {
		t.Fatalf("after Consul came back: %v", err)
	}
	t.Logf("Consul back: a new drain was answered by all three %s after Consul was ready", time.Since(back).Round(time.Millisecond))
	waitMirrorsConsul(t, 10*time.Second, consul, hs...)
}

// TestE2EWriteStorm: 1,000 KV changes in about 10s over 200 keys, from
// several writers. Afterwards every replica holds exactly Consul's content
// (kv_digest equals the digest of Consul's own listing) and answers
// accordingly. Snapshots are taken often during the storm, and a replica
// restarted afterwards restores and holds the same content.
func TestE2EWriteStorm(t *testing.T) {
	const (
		changes = 1000
		keys    = 200
		writers = 4
		storm   = 10 * time.Second
	)
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	hs := StartCluster(t, 3, HastateOptions{ConsulAddr: consul.Addr(),
		Args: []string{"--snapshot-interval", "1s", "--snapshot-threshold", "64"}})
	WaitLeader(t, 10*time.Second, hs...)
	kv := consul.Client(t).KV()
	server := func(i int) string { return fmt.Sprintf("be_storm%d/s%03d", i%10, i) }

	var puts, deletes, failures int
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), uint64(start.UnixNano())))
			tick := time.NewTicker(storm / (changes / writers))
			defer tick.Stop()
			for range changes / writers {
				<-tick.C
				key := stateKey(server(rng.IntN(keys)))
				var err error
				del := rng.IntN(10) == 0
				if del {
					_, err = kv.Delete(key, nil)
				} else {
					var v string
					switch r := rng.IntN(4); r {
					case 0:
						v = "ready"
					case 1:
						v = "drain"
					case 2:
						v = "maint"
					default:
						v = fmt.Sprintf("%d%%", rng.IntN(101))
					}
					_, err = kv.Put(&api.KVPair{Key: key, Value: []byte(v)}, nil)
				}
				mu.Lock()
				switch {
				case err != nil:
					failures++
					t.Errorf("storm write %s: %v", key, err)
				case del:
					deletes++
				default:
					puts++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	stormEnd := time.Now()
	if failures > 0 {
		t.Fatalf("%d storm writes failed", failures)
	}
	digest := waitMirrorsConsul(t, 30*time.Second, consul, hs...)
	converged := time.Since(stormEnd)
	final := consulKV(t, consul)
	t.Logf("write storm: %d puts + %d deletes over %d keys in %s; all 3 replicas mirror Consul (%d keys, digest %.12s) %s after the last write",
		puts, deletes, keys, stormEnd.Sub(start).Round(time.Millisecond), len(final), digest, converged.Round(time.Millisecond))

	checkAnswers := func(h *Hastate) {
		t.Helper()
		wrong := 0
		for i := range keys {
			s := server(i)
			want := answerFor(t, final["state/"+s])
			if got := h.Ask(t, s); got != want {
				if wrong++; wrong <= 5 {
					t.Errorf("%s answers %q for %s, want %q (KV %q)", h.NodeID, got, s, want, final["state/"+s])
				}
			}
		}
		if wrong > 0 {
			t.Errorf("%s: %d of %d answers differ from Consul's content", h.NodeID, wrong, keys)
		}
	}
	for _, h := range hs {
		checkAnswers(h)
	}

	// A follower restarted now restores from its snapshot and raft log.
	leader := WaitLeader(t, 10*time.Second, hs...)
	f := others(hs, leader)[0]
	t.Logf("%s took a raft snapshot during the storm: %v; restarting it", f.NodeID, f.LogContains(t, "snapshot complete"))
	f.Kill()
	f.Start(t)
	f.WaitReady(t)
	if c := f.Cluster(t); c.KVDigest != digest {
		t.Errorf("%s restarted after the storm holds kv_digest %.12s (%d keys, applied index %d), want %.12s (%d keys); differences: %v",
			f.NodeID, c.KVDigest, c.KVKeys, c.AppliedIndex, digest, len(final), kvDiff(t, f, final))
	}
	checkAnswers(f)
}

// startDrained starts Consul and three replicas with args, drains server
// and waits until all three answer drain. It returns the leader too.
func startDrained(t *testing.T, server string, args ...string) (*testenv.Consul, []*Hastate, *Hastate) {
	t.Helper()
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	hs := StartCluster(t, 3, HastateOptions{ConsulAddr: consul.Addr(), Args: args})
	Operator{ConsulAddr: consul.Addr()}.Run(t, "drain", server)
	if _, err := waitAllAnswer(hs, server, "drain", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	return consul, hs, WaitLeader(t, 10*time.Second, hs...)
}

// TestE2ELeaderSIGTERM: probes run against all three replicas while the
// leader gets SIGTERM. It hands leadership over before it exits (no
// election timeout), and no probe is answered wrongly: the survivors answer
// every probe correctly, or nothing for the moment leadership moves (no
// leader confirms an answer then; HAProxy keeps its state), and the stopping replica answers correctly until its agent
// listener closes (it closes last, after raft), after which its probes are
// refused, never answered wrongly.
func TestE2ELeaderSIGTERM(t *testing.T) {
	const server = "be_term/web1"
	consul, hs, leader := startDrained(t, server)
	op := Operator{ConsulAddr: consul.Addr()}
	survivors := others(hs, leader)

	p := startProbers(hs, 3, server, "drain")
	p.waitProbes(t, 60)

	// Watch the survivors for a new leader while the old one stops.
	type seenLeader struct {
		h  *Hastate
		at time.Time
	}
	watch := make(chan seenLeader, 1)
	stopWatch := make(chan struct{})
	go func() {
		defer close(watch)
		for {
			for _, h := range survivors {
				if st, _ := h.raftState(); st == "leader" {
					watch <- seenLeader{h, time.Now()}
					return
				}
			}
			select {
			case <-stopWatch:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()

	code, took := leader.Stop(t)
	exited := time.Now()
	sigterm := exited.Add(-took)
	var next seenLeader
	select {
	case next = <-watch:
	case <-time.After(10 * time.Second):
	}
	close(stopWatch)
	if next.h == nil {
		t.Fatalf("no survivor became leader within 10s of %s's exit", leader.NodeID)
	}
	WaitLeader(t, 10*time.Second, survivors...)
	p.waitProbes(t, 60) // the survivors keep answering under the new leader
	counts := p.Stop()

	t.Logf("SIGTERM leader %s: exited with code %d %s after the signal; %s was leader %s after the signal (%s relative to the exit)",
		leader.NodeID, code, took.Round(time.Millisecond), next.h.NodeID,
		next.at.Sub(sigterm).Round(time.Millisecond), next.at.Sub(exited).Round(time.Millisecond))
	t.Logf("SIGTERM: %s", leader.LogLine(t, "leadership transferred"))
	for _, h := range hs {
		t.Logf("probes to %s: %s", h.NodeID, counts[h.NodeID])
	}
	if code != 0 {
		t.Errorf("leader exited with code %d after SIGTERM, want 0", code)
	}
	if !leader.LogContains(t, "leadership transferred before shutdown") {
		t.Errorf("leader %s did not log a leadership transfer before shutdown", leader.NodeID)
	}
	// Handed over, not elected after a timeout: a survivor leads within a
	// second of the exit at the latest (the transfer ends before it).
	if d := next.at.Sub(exited); d > time.Second {
		t.Errorf("%s became leader %s after %s exited; want a handover before the exit", next.h.NodeID, d, leader.NodeID)
	}
	// While leadership moves no leader confirms an answer: the survivors
	// answer nothing for those milliseconds (HAProxy keeps its state),
	// never wrongly, and only until the new leader leads.
	for _, h := range survivors {
		c := counts[h.NodeID]
		if c.Unanswered > 0 && c.Unanswered == c.bad() && !c.LastBad.After(next.at.Add(time.Second)) {
			t.Logf("probes to survivor %s: %d unanswered while leadership moved (last %s after SIGTERM)", h.NodeID, c.Unanswered, c.LastBad.Sub(sigterm).Round(time.Millisecond))
			c.Unanswered = 0
		}
		if c.bad() > 0 || c.OK == 0 {
			t.Errorf("probes to survivor %s: %s; want every one answered %q (or nothing while leadership moved): %v", h.NodeID, c, "drain", c.Bad)
		}
	}
	c := counts[leader.NodeID]
	switch {
	case c.OK == 0:
		t.Errorf("no probe to %s was answered", leader.NodeID)
	case c.Wrong > 0 || c.Failed > 0:
		t.Errorf("probes to the stopping %s: %s; want no wrong answer and no failure: %v", leader.NodeID, c, c.Bad)
	case c.Refused+c.Unanswered > 0 && (c.FirstBad.Before(sigterm) || c.FirstBad.Before(c.LastOK)):
		// Refusals are fine once the agent listener has closed, the last
		// step of the shutdown: from then on the replica never answers
		// again. So every refused probe must have ended after SIGTERM and
		// after the last answered probe began.
		const ts = "15:04:05.000000"
		t.Errorf("probes to the stopping %s: %s; a probe went unanswered at %s, before SIGTERM (%s) or before the last answered probe began (%s): %v",
			leader.NodeID, c, c.FirstBad.Format(ts), sigterm.Format(ts), c.LastOK.Format(ts), c.Bad)
	}
	if c.Refused+c.Unanswered > 0 {
		t.Logf("the stopping %s: last answered probe began %s after SIGTERM, first refused one ended %s after SIGTERM; the process exited %s after SIGTERM",
			leader.NodeID, c.LastOK.Sub(sigterm).Round(time.Millisecond), c.FirstBad.Sub(sigterm).Round(time.Millisecond), took.Round(time.Millisecond))
	}

	// The new leader follows KV.
	op.Run(t, "maint", server)
	if _, err := waitAllAnswer(survivors, server, "maint", 10*time.Second); err != nil {
		t.Fatalf("after the handover: %v", err)
	}
}

// TestE2EShutdownDelay: with --shutdown-delay, a leader that gets SIGTERM
// fails readiness at once (a load balancer takes it out), hands leadership
// over, and keeps answering probes with current answers, following raft as
// a follower, until the delay ends; then it exits cleanly.
func TestE2EShutdownDelay(t *testing.T) {
	const server, delay = "be_delay/web1", 4 * time.Second
	consul, hs, leader := startDrained(t, server, "--shutdown-delay", delay.String())
	survivors := others(hs, leader)

	sent := leader.Signal(t, syscall.SIGTERM)
	testenv.Eventually(t, time.Second, func() error {
		code, _ := leader.Readiness(t)
		return testenv.Expect(code == 503, "%s still ready after SIGTERM", leader.NodeID)
	})
	unready := time.Since(sent)
	next := WaitLeader(t, 2*time.Second, survivors...)
	led := time.Since(sent)
	// The draining replica follows raft: a write now reaches it too.
	consul.Put(t, stateKey(server), "maint")
	if _, err := waitAllAnswer(hs, server, "maint", delay/2); err != nil {
		t.Fatalf("during the shutdown delay: %v", err)
	}
	answered := time.Since(sent)
	if answered >= delay {
		t.Fatalf("the write was answered %s after SIGTERM, after the %s delay: the test proves nothing", answered, delay)
	}
	code, took := leader.Wait(t, sent)
	t.Logf("SIGTERM with --shutdown-delay %s: readiness 503 after %s; %s led after %s; a write answered by all three (the draining one included) %s after SIGTERM; exit code %d after %s",
		delay, unready.Round(time.Millisecond), next.NodeID, led.Round(time.Millisecond), answered.Round(time.Millisecond), code, took.Round(time.Millisecond))
	if code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0", code)
	}
	if took < delay {
		t.Errorf("exited %s after SIGTERM, before the %s shutdown delay", took, delay)
	}
	if !leader.LogContains(t, "leadership transferred before shutdown") {
		t.Errorf("%s did not log a leadership transfer", leader.NodeID)
	}

	// A second signal cuts the delay short.
	f := others(survivors, next)[0]
	sent = f.Signal(t, syscall.SIGTERM)
	testenv.Eventually(t, time.Second, func() error {
		code, _ := f.Readiness(t)
		return testenv.Expect(code == 503, "%s still ready after SIGTERM", f.NodeID)
	})
	f.Signal(t, syscall.SIGTERM)
	if code, took := f.Wait(t, sent); code != 0 || took >= delay {
		t.Errorf("%s after two SIGTERMs: exit code %d after %s; want 0, before the %s delay", f.NodeID, code, took, delay)
	} else {
		t.Logf("%s after two SIGTERMs: exit code 0 after %s", f.NodeID, took.Round(time.Millisecond))
	}
	// A clean shutdown closes raft's inbound connections under it: raft's
	// failed read on them is no error.
	for _, h := range []*Hastate{leader, f} {
		if l := h.LogLine(t, "use of closed network connection"); strings.Contains(l, `"level":"error"`) {
			t.Errorf("%s logged an error at a clean shutdown: %s", h.NodeID, l)
		}
	}
}
