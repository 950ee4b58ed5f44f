package test

import (
	"cmp"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/hastate/hastate/internal/testenv"
)

// BenchmarkAgentCheckConfirmed is the cost of confirmed answers (issue
// 23: every check waits for a read-index round), measured in one run
// beside the bare responder of BenchmarkAgentCheckRatio: a three-replica
// cluster of real hastate processes serving benchKV from Consul, loaded
// as BenchmarkAgentCheckRatio loads its servers, alternating rounds of
// the bare responder, hastate's agent server without a cluster (static:
// what the agent itself costs), a follower and the leader. For each
// --confirm-window in confirmWindows it reports the throughput ratio to
// the bare responder, the p50/p99 latency added, and each replica's
// raft-port traffic (bytes per second, both directions, through counting
// proxies on every raft link) idle and under 10,000 checks/s on the
// follower.
//
//	go test -run '^$' -bench AgentCheckConfirmed -benchtime 1x ./test/
func BenchmarkAgentCheckConfirmed(b *testing.B) {
	kv, reqs, answers := benchKV()
	consul := testenv.StartConsul(b, testenv.ConsulOptions{})
	putKV(b, consul, kv)
	baseAddr := startBaselineResponder(b, kv)
	staticAddr := startHastateAgent(b, kv)
	for _, w := range confirmWindows {
		b.Run("window="+w.String(), func(b *testing.B) {
			hs := NewCluster(b, 3, HastateOptions{ConsulAddr: consul.Addr(), Args: []string{"--confirm-window", w.String()}})
			mesh := newCountingMesh(b, hs)
			StartAll(b, hs...)
			leader := WaitLeader(b, 10*time.Second, hs...)
			for _, h := range hs {
				h.WaitReady(b)
			}
			follower := others(hs, leader)[0]
			targets := []struct{ name, addr string }{{"baseline", baseAddr}, {"static", staticAddr}, {"follower", follower.AgentAddr}, {"leader", leader.AgentAddr}}
			for _, tg := range targets {
				runAgentLoad(b, tg.addr, 2*benchWorkers, reqs, answers) // warm up (and every replica answers benchKV)
			}
			res := make([][]loadResult, len(targets))
			b.ResetTimer()
			for range b.N {
				for range ratioRounds {
					for i, tg := range targets {
						res[i] = append(res[i], runAgentLoadOf(b, tg.addr, ratioChecks, reqs, answers, i >= 2))
					}
				}
			}
			b.StopTimer()
			base := merge(res[0]...)
			for i, tg := range targets {
				m := merge(res[i]...)
				m.report(b, tg.name+"_")
				if i == 0 {
					continue
				}
				b.ReportMetric(m.rate()/base.rate(), tg.name+"_throughput_ratio")
				b.ReportMetric(float64(m.quantile(0.50)-base.quantile(0.50))/float64(time.Microsecond), tg.name+"_added_p50_us")
				b.ReportMetric(float64(m.quantile(0.99)-base.quantile(0.99))/float64(time.Microsecond), tg.name+"_added_p99_us")
				b.ReportMetric(float64(m.unanswered), tg.name+"_unanswered")
			}
			// The traffic is measured against the leader of the moment.
			leader = WaitLeader(b, 10*time.Second, hs...)
			if follower == leader {
				follower = others(hs, leader)[0]
			}
			rounds0 := confirmedRounds(b, follower)
			idle := mesh.rates()
			time.Sleep(trafficFor) // the idle measure is the time itself
			idleB := idle()
			rounds1 := confirmedRounds(b, follower)
			load := mesh.rates()
			fi, li := mesh.index(follower), mesh.index(leader)
			dialsBefore := mesh.links[[2]int{fi, li}].bytes.Load()
			rate := pacedLoad(b, follower.AgentAddr, 10000, trafficFor, reqs, answers)
			loadB := load()
			dials := mesh.links[[2]int{fi, li}].bytes.Load() - dialsBefore
			rounds2 := confirmedRounds(b, follower)
			if l := WaitLeader(b, 10*time.Second, hs...); l != leader {
				b.Logf("the leader changed from %s to %s while the traffic was measured: its figures are mixed", leader.NodeID, l.NodeID)
			}
			for i, h := range hs {
				role := "follower"
				switch h {
				case leader:
					role = "leader"
				case follower:
					role = "loaded_follower"
				}
				b.ReportMetric(idleB[i], role+"_raft_idle_B/s")
				b.ReportMetric(loadB[i], role+"_raft_10k_B/s")
			}
			b.ReportMetric(rate, "paced_checks/s")
			b.ReportMetric((rounds2-rounds1)/trafficFor.Seconds(), "follower_rounds/s_at_10k")
			// The follower's own dials to the leader carry its read-index
			// connection (and a status query now and then), not raft's
			// replication, which the leader dials.
			b.ReportMetric(float64(dials)/(rounds2-rounds1), "readindex_B/round")
			b.ReportMetric((rounds1-rounds0)/trafficFor.Seconds(), "follower_rounds/s_idle")
			b.Logf("window %s: paced load %.0f checks/s on %s; raft bytes/s idle %v, at load %v (replicas %v)", w, rate, follower.NodeID, idleB, loadB, nodeIDs(hs))
			for i := range res[0] {
				b.Logf("round %d: baseline %.0f/s p99 %v; static %.0f/s; follower %.0f/s p50 %v p99 %v; leader %.0f/s p50 %v p99 %v", i+1,
					res[0][i].rate(), res[0][i].quantile(0.99), res[1][i].rate(), res[2][i].rate(), res[2][i].quantile(0.5), res[2][i].quantile(0.99),
					res[3][i].rate(), res[3][i].quantile(0.5), res[3][i].quantile(0.99))
			}
		})
	}
}

// confirmWindows are the --confirm-window values measured.
var confirmWindows = []time.Duration{0, 200 * time.Microsecond, time.Millisecond}

// trafficFor is how long raft traffic is measured, idle and under load.
const trafficFor = 5 * time.Second

// putKV writes kv to Consul in transactions of 64 keys.
func putKV(tb testing.TB, consul *testenv.Consul, kv map[string]string) {
	tb.Helper()
	var ops consulapi.KVTxnOps
	flush := func() {
		if len(ops) == 0 {
			return
		}
		ok, resp, _, err := consul.Client(tb).KV().Txn(ops, nil)
		if err != nil || !ok {
			tb.Fatalf("consul txn: %v %+v", err, resp)
		}
		ops = ops[:0]
	}
	for k, v := range kv {
		ops = append(ops, &consulapi.KVTxnOp{Verb: consulapi.KVSet, Key: kvPrefix + k, Value: []byte(v)})
		if len(ops) == 64 {
			flush()
		}
	}
	flush()
}

// pacedLoad sends rate checks a second to addr for d, from benchWorkers
// workers, and returns the rate achieved.
func pacedLoad(tb testing.TB, addr string, rate int, d time.Duration, reqs, answers [][]byte) float64 {
	tb.Helper()
	var done atomic.Int64
	var bad atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	every := time.Duration(benchWorkers) * time.Second / time.Duration(rate)
	for w := range benchWorkers {
		wg.Go(func() {
			var buf [64]byte
			next := start.Add(time.Duration(w) * every / benchWorkers)
			for i := w; time.Since(start) < d; i += benchWorkers {
				time.Sleep(time.Until(next)) // the pace of the load
				next = next.Add(every)
				line, err := agentCheck(addr, reqs[i%len(reqs)], buf[:])
				if err != nil {
					bad.Add(1)
					continue
				}
				if string(line) != string(answers[i%len(reqs)]) {
					tb.Errorf("paced load on %s: %q answered %q", addr, reqs[i%len(reqs)], line)
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	if n := bad.Load(); n > 0 {
		tb.Logf("paced load on %s: %d checks failed, got no answer or a wrong one (an election on a loaded machine)", addr, n)
	}
	return float64(done.Load()) / time.Since(start).Seconds()
}

// countingMesh routes each replica's raft dials to each peer through a
// proxy that counts the bytes both ways, as raftMesh does with toxiproxy.
type countingMesh struct {
	hs    []*Hastate
	links map[[2]int]*countingProxy
}

func newCountingMesh(tb testing.TB, hs []*Hastate) *countingMesh {
	tb.Helper()
	m := &countingMesh{hs: hs, links: map[[2]int]*countingProxy{}}
	for i, from := range hs {
		var dial []string
		for j, to := range hs {
			if i == j {
				continue
			}
			p := newCountingProxy(tb, to.RaftAddr)
			m.links[[2]int{i, j}] = p
			dial = append(dial, to.NodeID+"="+p.addr())
		}
		from.AddArgs("--raft-dial", strings.Join(dial, ","))
	}
	return m
}

func (m *countingMesh) index(h *Hastate) int {
	for i, x := range m.hs {
		if x == h {
			return i
		}
	}
	panic("countingMesh: replica " + h.NodeID + " is not in the mesh")
}

// bytesOf is every byte on the links from and to replica i.
func (m *countingMesh) bytesOf(i int) int64 {
	var n int64
	for k, l := range m.links {
		if k[0] == i || k[1] == i {
			n += l.bytes.Load()
		}
	}
	return n
}

// rates starts a measure; the function it returns ends it and gives each
// replica's bytes per second since.
func (m *countingMesh) rates() func() []float64 {
	start := time.Now()
	before := make([]int64, len(m.hs))
	for i := range m.hs {
		before[i] = m.bytesOf(i)
	}
	return func() []float64 {
		s := time.Since(start).Seconds()
		out := make([]float64, len(m.hs))
		for i := range m.hs {
			out[i] = float64(m.bytesOf(i)-before[i]) / s
		}
		return out
	}
}

// countingProxy forwards TCP connections to upstream and counts the bytes.
type countingProxy struct {
	ln       net.Listener
	upstream string
	bytes    atomic.Int64
}

func newCountingProxy(tb testing.TB, upstream string) *countingProxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &countingProxy{ln: ln, upstream: upstream}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		serveEach(ln, &wg, func(c net.Conn) {
			u, err := net.DialTimeout("tcp", upstream, time.Second)
			if err != nil {
				c.Close()
				return
			}
			mu.Lock()
			conns = append(conns, c, u)
			mu.Unlock()
			done := make(chan struct{}, 2)
			go func() { p.copy(u, c); done <- struct{}{} }()
			go func() { p.copy(c, u); done <- struct{}{} }()
			<-done
			c.Close()
			u.Close()
			<-done
		})
	})
	tb.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return p
}

func (p *countingProxy) addr() string { return p.ln.Addr().String() }

func (p *countingProxy) copy(dst io.Writer, src io.Reader) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.bytes.Add(int64(n))
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// leaderRoundBase is the revision whose leader confirmed with raft's
// VerifyLeader (the last before issue 33's ack round); HASTATE_BENCH_BASE
// names another.
const leaderRoundBase = "c5d2ecb"

// BenchmarkLeaderRoundCost is issue 33's cost of the leader's own
// confirmation round (ack.go: a quorum of voters answering "ack" in its
// term) beside the round it replaces (raft's VerifyLeader), in one run:
// two three-replica clusters of real processes on one Consul, this build
// and the base revision's (built from git), loaded in rounds with the
// bare Go responder of BenchmarkAgentCheckRatio, run in a process of its
// own as each replica is (startBaselineProcess; the same responder in
// the bench's own process, which shares the clients' Go runtime, is
// reported beside it as bare_in_process). Each round runs every target
// in an order that rotates from round to round, each between two runs of
// the bare responder (bare, target, bare, next target, ..., bare); a
// target's throughput ratio is the median over the rounds of its rate
// over the mean of the two bare rates beside it (min and max reported
// too), since the machine drifts within a run by more than the round
// costs. It reports, for each cluster's leader and a follower, that
// ratio and the p50/p99 latency added to the bare responder, the
// leader's p50/p99 difference between the two rounds, each replica's
// mean round and checks per round, and the ack leader's requests per
// round, at two loads (metric suffix):
//
//   - c32: 32 closed-loop clients, 11 rounds. Every check in flight waits
//     for the same round, so throughput is bound by latency: 32 /
//     (service + round). Any confirmation that waits for a peer shows
//     here, ack and VerifyLeader alike.
//
//   - c256: 256 closed-loop clients, 11 rounds, enough to keep both cores
//     busy: throughput is bound by CPU, so the ratio is the round's CPU
//     cost (the followers' included: they share the two cores).
//
//     go test -run '^$' -bench LeaderRoundCost -benchtime 1x ./test/
func BenchmarkLeaderRoundCost(b *testing.B) {
	base := cmp.Or(os.Getenv("HASTATE_BENCH_BASE"), leaderRoundBase)
	baseBin := buildRevision(b, base)
	kv, reqs, answers := benchKV()
	consul := testenv.StartConsul(b, testenv.ConsulOptions{})
	putKV(b, consul, kv)
	baseAddr, _ := startBaselineProcess(b, kv)
	inprocAddr := startBaselineResponder(b, kv)
	start := func(bin string) (leader, follower *Hastate) {
		hs := NewCluster(b, 3, HastateOptions{ConsulAddr: consul.Addr()})
		for _, h := range hs {
			h.Use(bin)
		}
		StartAll(b, hs...)
		leader = WaitLeader(b, 10*time.Second, hs...)
		for _, h := range hs {
			h.WaitReady(b)
		}
		return leader, others(hs, leader)[0]
	}
	newL, newF := start("")
	oldL, oldF := start(baseBin)
	failed := func(h *Hastate) float64 { return h.Metric(b, `hastate_confirm_rounds_total{result="failed"}`) }
	failed0 := []float64{failed(newL), failed(oldL)}
	targets := []struct{ name, addr string }{
		{"baseline", baseAddr}, {"ack_leader", newL.AgentAddr}, {"verify_leader", oldL.AgentAddr},
		{"ack_follower", newF.AgentAddr}, {"verify_follower", oldF.AgentAddr}, {"bare_in_process", inprocAddr},
	}
	for _, tg := range targets {
		runAgentLoad(b, tg.addr, 2*benchWorkers, reqs, answers) // warm up
	}
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	b.ResetTimer()
	for _, load := range []struct{ clients, rounds int }{{benchWorkers, latencyBoundRounds}, {256, saturatedRounds}} {
		clients := load.clients
		sfx := fmt.Sprintf("_c%d", clients)
		res := make([][]loadResult, len(targets))
		// ratios[i] is target i's throughput over the bare responder's in
		// each round, the bare responder measured before and after it (the
		// machine drifts within a run: the median of per-round ratios
		// holds where one merged ratio moves with it).
		ratios := make([][]float64, len(targets))
		// The rounds' mean duration on each confirming replica (its own
		// histogram), to tell the round trip from the wait for a round.
		roundHosts := []*Hastate{newL, oldL, newF, oldF}
		roundSum, roundCount := make([]float64, len(roundHosts)), make([]float64, len(roundHosts))
		for i, h := range roundHosts {
			roundSum[i], roundCount[i] = h.Metric(b, "hastate_confirm_round_seconds_sum"), h.Metric(b, "hastate_confirm_round_seconds_count")
		}
		acks0 := ackRequestsOf(b, newL)
		run := func(i int) loadResult {
			return runAgentLoadWith(b, targets[i].addr, clients, pairedChecks, reqs, answers, i > 0)
		}
		for range b.N {
			for r := range load.rounds {
				// bare, a target, bare, the next target, ..., bare: each
				// target's ratio is to the bare runs just before and after
				// it (a second or two apart, not a whole round).
				bare := run(0)
				res[0] = append(res[0], bare)
				for k := range len(targets) - 1 {
					i := 1 + (r+k)%(len(targets)-1) // the order rotates from round to round
					got := run(i)
					next := run(0)
					res[0] = append(res[0], next)
					res[i] = append(res[i], got)
					ratios[i] = append(ratios[i], got.rate()/((bare.rate()+next.rate())/2))
					bare = next
				}
			}
		}
		for i, h := range roundHosts {
			n := h.Metric(b, "hastate_confirm_round_seconds_count") - roundCount[i]
			if n > 0 {
				b.ReportMetric((h.Metric(b, "hastate_confirm_round_seconds_sum")-roundSum[i])/n*1e6, targets[i+1].name+"_round_mean_us"+sfx)
				b.ReportMetric(float64(len(res[i+1])*pairedChecks)/n, targets[i+1].name+"_checks_per_round"+sfx)
				if i == 0 {
					b.ReportMetric((ackRequestsOf(b, newL)-acks0)/n, "ack_leader_requests_per_round"+sfx)
				}
			}
		}
		bare := merge(res[0]...)
		b.ReportMetric(bare.rate(), "baseline_checks/s"+sfx)
		merged := make([]loadResult, len(targets))
		for i, tg := range targets {
			if i == 0 {
				continue
			}
			m := merge(res[i]...)
			merged[i] = m
			lo, med, hi := spread(ratios[i])
			b.ReportMetric(med, tg.name+"_throughput_ratio"+sfx)
			b.ReportMetric(lo, tg.name+"_throughput_ratio_min"+sfx)
			b.ReportMetric(hi, tg.name+"_throughput_ratio_max"+sfx)
			b.ReportMetric(us(m.quantile(0.50)-bare.quantile(0.50)), tg.name+"_added_p50_us"+sfx)
			b.ReportMetric(us(m.quantile(0.99)-bare.quantile(0.99)), tg.name+"_added_p99_us"+sfx)
			b.ReportMetric(float64(m.unanswered), tg.name+"_unanswered"+sfx)
		}
		b.ReportMetric(us(merged[1].quantile(0.50)-merged[2].quantile(0.50)), "ack_vs_verify_leader_p50_us"+sfx)
		b.ReportMetric(us(merged[1].quantile(0.99)-merged[2].quantile(0.99)), "ack_vs_verify_leader_p99_us"+sfx)
		for r := range res[1] {
			first := res[0][r*len(targets)]
			b.Logf("%d clients, round %d: bare %.0f/s first (p50 %v p99 %v); ack leader %.0f/s (%.2f) p50 %v p99 %v; verify leader %.0f/s (%.2f) p50 %v p99 %v; ack follower %.2f; verify follower %.2f; bare in the bench's process %.2f", clients, r+1,
				first.rate(), first.quantile(0.5), first.quantile(0.99),
				res[1][r].rate(), ratios[1][r], res[1][r].quantile(0.5), res[1][r].quantile(0.99),
				res[2][r].rate(), ratios[2][r], res[2][r].quantile(0.5), res[2][r].quantile(0.99), ratios[3][r], ratios[4][r], ratios[5][r])
		}
	}
	b.StopTimer()
	b.ReportMetric(failed(newL)-failed0[0], "ack_leader_failed_rounds")
	b.ReportMetric(failed(oldL)-failed0[1], "verify_leader_failed_rounds")
	if failed(newL) > failed0[0] {
		// Why (a replica logs a failed round, at most one line per 10 s).
		b.Logf("ack leader %s: %s", newL.NodeID, newL.LogLine(b, "a confirmation round failed"))
	}
	b.Logf("base revision %s (VerifyLeader on the leader) beside this build (the ack round)", base)
}

// latencyBoundRounds is BenchmarkLeaderRoundCost's rounds at 32 clients:
// eleven, so that the median of per-round ratios holds when a few rounds
// meet a burst of the machine's other work (three left the leader's
// ratio between 0.87 and 0.92 on a quiet machine; seven of 20,000 checks
// a target, the bare responder measured only at a round's two ends,
// moved a run's medians by ±0.05).
const latencyBoundRounds = 11

// saturatedRounds is BenchmarkLeaderRoundCost's rounds at 256 clients:
// as many as at 32, since their ratio is the round's small CPU cost and
// the machine's drift is of its size.
const saturatedRounds = 11

// pairedChecks is the checks of one run of BenchmarkLeaderRoundCost: half
// of ratioChecks, since every target runs between two runs of the bare
// responder (about a second each at 32 clients).
const pairedChecks = ratioChecks / 2

// spread is the least, the median and the greatest of xs.
func spread(xs []float64) (lo, med, hi float64) {
	s := slices.Sorted(slices.Values(xs))
	if len(s) == 0 {
		return 0, 0, 0
	}
	return s[0], s[len(s)/2], s[len(s)-1]
}

// ackRequestsOf is how many ack requests h, as leader, has made
// (hastate_confirm_acks_total; 0 for a release before it).
func ackRequestsOf(tb testing.TB, h *Hastate) float64 {
	tb.Helper()
	var sum float64
	for _, r := range []string{"acked", "failed", "not_sent"} {
		sum += h.Metric(tb, `hastate_confirm_acks_total{result="`+r+`"}`)
	}
	return sum
}

// buildRevision builds cmd/hastate of the repository's revision rev (git
// archive into a temporary directory; the module cache serves its
// dependencies) and returns the binary.
func buildRevision(tb testing.TB, rev string) string {
	tb.Helper()
	dir := tb.TempDir()
	var stderr strings.Builder
	archive := exec.Command("git", "-C", "..", "archive", "--format=tar", rev)
	archive.Stderr = &stderr
	untar := exec.Command("tar", "-x", "-C", dir)
	pipe, err := archive.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	untar.Stdin = pipe
	if err := untar.Start(); err != nil {
		tb.Fatal(err)
	}
	if err := archive.Run(); err != nil {
		tb.Fatalf("git archive %s: %v: %s (set HASTATE_BENCH_BASE to a revision of this repository)", rev, err, stderr.String())
	}
	if err := untar.Wait(); err != nil {
		tb.Fatalf("untar %s: %v", rev, err)
	}
	return testenv.BuildHastate(tb, dir)
}
