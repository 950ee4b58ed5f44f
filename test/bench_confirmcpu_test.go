package test

import (
	"bufio"
	"fmt"
	"math"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hastate/hastate/internal/testenv"
)

// BenchmarkConfirmCPU is where the CPU of a confirmed answer goes: a
// three-replica cluster of this build and the bare responder in its own
// process (BenchmarkLeaderRoundCost's), loaded in turn, rounds rotating
// the order, with the CPU time each process spent (/proc/<pid>/stat)
// divided by the checks answered. The replicas' idle CPU (raft's own
// traffic, measured while the bare responder is loaded) is taken off, so
// a figure is what answering costs that process: for a follower's checks,
// the follower's own and the leader's answers to its read-index rounds.
// It reports, per load and target, the median over rounds of each
// process's µs per check, their sum ("server"), and the bare responder's
// server figure over the target's: the throughput ratio the target would
// reach if the servers' CPU were all that bound it (on the shared test
// machine the load generator takes about half of it, and a round's wait
// counts too: BenchmarkLeaderRoundCost measures the throughput itself).
// It reports the checks per confirmed round too, and, beside the
// leader's CPU per round of the follower's, a floor: the CPU per round
// trip of the echo process (echoProcessMain, a process that answers a
// line with a line and does nothing else), asked one round trip per as
// many of the bare responder's checks as the follower's rounds took,
// under the same load. A leader near or under that floor spends on a
// round what any process woken for one does on this machine.
//
//	go test -run '^$' -bench ConfirmCPU -benchtime 1x ./test/
func BenchmarkConfirmCPU(b *testing.B) {
	kv, reqs, answers := benchKV()
	consul := testenv.StartConsul(b, testenv.ConsulOptions{})
	putKV(b, consul, kv)
	bareAddr, barePid := startBaselineProcess(b, kv)
	hs := NewCluster(b, 3, HastateOptions{ConsulAddr: consul.Addr()})
	StartAll(b, hs...)
	leader := WaitLeader(b, 10*time.Second, hs...)
	for _, h := range hs {
		h.WaitReady(b)
	}
	fs := others(hs, leader)
	procs := []benchProc{{"bare", barePid}, {"leader", leader.Pid()}, {"follower", fs[0].Pid()}, {"other_follower", fs[1].Pid()}}
	targets := []struct{ name, addr string }{{"bare", bareAddr}, {"leader", leader.AgentAddr}, {"follower", fs[0].AgentAddr}}
	answering := []*Hastate{nil, leader, fs[0]} // by target: the replica that confirms its checks
	echo := startEcho(b)
	for _, tg := range targets {
		runAgentLoad(b, tg.addr, 2*benchWorkers, reqs, answers) // warm up
	}
	const rounds = 5
	b.ResetTimer()
	for range b.N {
		for _, clients := range []int{benchWorkers, 256} {
			sfx := fmt.Sprintf("_c%d", clients)
			// us[t][p] is process p's µs per check for target t, one per round.
			us := make([][][]float64, len(targets))
			perRound := make([][]float64, len(targets)) // checks per confirmed round, per round of the benchmark
			// The leader's µs per round of the follower's and the echo
			// process's per round trip, one per round.
			var leaderRound, echoTrip, roundRate, tripRate []float64
			for t := range us {
				us[t] = make([][]float64, len(procs))
			}
			for r := range rounds {
				// idle[p] is process p's CPU seconds per second while the
				// bare responder is loaded: its own background work.
				idle := make([]float64, len(procs))
				spent := make([][]float64, len(targets))
				results := make([]loadResult, len(targets))
				for k := range targets {
					t := (r + k) % len(targets)
					// The answering replica's rounds, read outside the CPU
					// measured (a scrape costs the replica CPU).
					var rounds0 float64
					if t > 0 {
						rounds0 = confirmedRounds(b, answering[t])
					}
					before := cpuSeconds(b, procs)
					results[t] = runAgentLoadWith(b, targets[t].addr, clients, pairedChecks, reqs, answers, t > 0)
					after := cpuSeconds(b, procs)
					if t > 0 {
						perRound[t] = append(perRound[t], float64(results[t].checks)/(confirmedRounds(b, answering[t])-rounds0))
					}
					spent[t] = make([]float64, len(procs))
					for p := range procs {
						spent[t][p] = after[p] - before[p]
					}
				}
				for p := range procs {
					if p > 0 {
						idle[p] = spent[0][p] / results[0].elapsed.Seconds()
					}
				}
				for t := range targets {
					for p := range procs {
						if (t == 0) != (p == 0) {
							continue // the bare responder serves only its own checks; the replicas only theirs
						}
						own := spent[t][p] - idle[p]*results[t].elapsed.Seconds()
						us[t][p] = append(us[t][p], own/float64(results[t].checks)*1e6)
					}
				}
				// The floor: the bare responder's load again, with a round
				// trip to the echo process begun every k checks, k the
				// follower's checks per round just measured, as the
				// follower's rounds ask the leader under its load.
				k := perRound[2][r]
				leaderRound = append(leaderRound, us[2][1][r]*k)
				roundRate = append(roundRate, float64(results[2].checks)/k/results[2].elapsed.Seconds())
				cpu, rate := echo.cpuPerTrip(b, func(tick chan<- struct{}) loadResult {
					return runAgentLoadTicking(b, bareAddr, clients, pairedChecks, reqs, answers, false, max(1, int(math.Round(k))), tick)
				})
				echoTrip, tripRate = append(echoTrip, cpu), append(tripRate, rate)
			}
			var bare float64
			for t, tg := range targets {
				var server float64
				var line []string
				for p, pr := range procs {
					if len(us[t][p]) == 0 {
						continue
					}
					_, med, _ := spread(us[t][p])
					server += med
					b.ReportMetric(med, tg.name+"_"+pr.name+"_us/check"+sfx)
					line = append(line, fmt.Sprintf("%s %.1f", pr.name, med))
				}
				b.ReportMetric(server, tg.name+"_server_us/check"+sfx)
				if t == 0 {
					bare = server
					b.Logf("%d clients, %s's checks: µs per check (medians of %d rounds): %s; server %.1f", clients, tg.name, rounds, strings.Join(line, ", "), server)
					continue
				}
				b.ReportMetric(bare/server, tg.name+"_cpu_ratio"+sfx)
				_, perR, _ := spread(perRound[t])
				b.ReportMetric(perR, tg.name+"_checks/round"+sfx)
				b.Logf("%d clients, %s's checks: µs per check (medians of %d rounds): %s; server %.1f; %.1f checks per round", clients, tg.name, rounds, strings.Join(line, ", "), server, perR)
			}
			_, lr, _ := spread(leaderRound)
			_, et, _ := spread(echoTrip)
			_, rr, _ := spread(roundRate)
			_, tr, _ := spread(tripRate)
			b.ReportMetric(lr, "follower_leader_us/round"+sfx)
			b.ReportMetric(et, "echo_us/trip"+sfx)
			b.Logf("%d clients: the leader's CPU per round of the follower %.1f µs (%.0f rounds/s); the echo process's per round trip beside the bare responder's load, one per as many checks, %.1f µs (%.0f trips/s) (medians of %d rounds)", clients, lr, rr, et, tr, rounds)
		}
	}
}

// benchProc is a process whose CPU time a benchmark reads.
type benchProc struct {
	name string
	pid  int
}

// cpuSeconds is the CPU time (user and system) each process has used.
func cpuSeconds(tb testing.TB, procs []benchProc) []float64 {
	tb.Helper()
	out := make([]float64, len(procs))
	for i, p := range procs {
		data, err := os.ReadFile("/proc/" + strconv.Itoa(p.pid) + "/stat")
		if err != nil {
			tb.Fatalf("CPU time of %s: %v", p.name, err)
		}
		// The fields after the command's closing parenthesis: utime and
		// stime are the 12th and 13th, in clock ticks (USER_HZ, 100 on
		// Linux).
		s := string(data)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) < 13 {
			tb.Fatalf("CPU time of %s: /proc/%d/stat has %d fields after the command", p.name, p.pid, len(f))
		}
		for _, v := range f[11:13] {
			ticks, err := strconv.ParseFloat(v, 64)
			if err != nil {
				tb.Fatalf("CPU time of %s: %v", p.name, err)
			}
			out[i] += ticks / 100
		}
	}
	return out
}

// confirmedRounds is the confirmation rounds h has run so far.
func confirmedRounds(tb testing.TB, h *Hastate) float64 {
	tb.Helper()
	return h.Metric(tb, `hastate_confirm_rounds_total{result="confirmed"}`)
}

// echoProc is the echo process (echoProcessMain) and connections to it
// kept open, one per round trip in flight (as a follower keeps one per
// round in flight).
type echoProc struct {
	pid   int
	conns []echoConn
}

type echoConn struct {
	c net.Conn
	r *bufio.Reader
}

// echoInFlight is the echo round trips in flight at most: a follower's
// rounds in flight (cluster/confirm).
const echoInFlight = 2

func startEcho(tb testing.TB) *echoProc {
	tb.Helper()
	addr, pid := startHelperProcess(tb, "echo", echoProcessEnv+"=1")
	e := &echoProc{pid: pid}
	for range echoInFlight {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			tb.Fatalf("echo process: %v", err)
		}
		tb.Cleanup(func() { c.Close() }) // before the process stops: cleanups run last first
		e.conns = append(e.conns, echoConn{c, bufio.NewReaderSize(c, 512)})
	}
	return e
}

// cpuPerTrip runs load, which offers its tick channel a value as each
// batch of checks begins, and a round trip to the echo process per value
// taken (echoInFlight at once; a tick finding them all busy waits in the
// channel's buffer, or is dropped when that is full), and returns the
// echo process's CPU per round trip in µs and the round trips a second.
func (e *echoProc) cpuPerTrip(tb testing.TB, load func(tick chan<- struct{}) loadResult) (us, perSecond float64) {
	tb.Helper()
	tick := make(chan struct{}, 2*echoInFlight)
	var trips atomic.Int64
	errs := make(chan error, len(e.conns))
	for _, ec := range e.conns {
		go func() {
			var err error
			req := []byte("n2 7\n") // a read-index request's size
			for range tick {
				if err != nil {
					continue
				}
				_ = ec.c.SetDeadline(time.Now().Add(5 * time.Second))
				if _, err = ec.c.Write(req); err == nil {
					_, err = ec.r.ReadSlice('\n')
				}
				trips.Add(1)
			}
			errs <- err
		}()
	}
	procs := []benchProc{{"echo", e.pid}}
	before := cpuSeconds(tb, procs)
	res := load(tick)
	after := cpuSeconds(tb, procs)
	close(tick)
	for range e.conns {
		if err := <-errs; err != nil {
			tb.Fatalf("echo round trip: %v", err)
		}
	}
	n := trips.Load()
	if n == 0 {
		tb.Fatal("no echo round trip was asked for")
	}
	return (after[0] - before[0]) / float64(n) * 1e6, float64(n) / res.elapsed.Seconds()
}
