package test

import (
	"fmt"
	"os"
	"strconv"
	"strings"
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
					before := cpuSeconds(b, procs)
					results[t] = runAgentLoadWith(b, targets[t].addr, clients, pairedChecks, reqs, answers, t > 0)
					after := cpuSeconds(b, procs)
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
				} else {
					b.ReportMetric(bare/server, tg.name+"_cpu_ratio"+sfx)
				}
				b.Logf("%d clients, %s's checks: µs per check (medians of %d rounds): %s; server %.1f", clients, tg.name, rounds, strings.Join(line, ", "), server)
			}
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
