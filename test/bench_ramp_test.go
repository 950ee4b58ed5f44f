package test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hastate/hastate/internal/testenv"
)

// BackendRamp: a backend of rampBenchServers servers drained by its
// backend-wide key is undrained at once (the key is deleted), which starts
// one ramp over the whole backend. Meanwhile an HAProxy fleet polls every
// server of that backend every agent-inter, and latency probers ask the
// replicas about servers of other backends. The benchmark reports the raft
// entries the ramp took and the other servers' agent-check latency during
// the ramp against before it, in the same run.
//
// The ramp interval is the smallest allowed (100ms), so the schedule has
// more intervals (200) than weight changes (10% to 100%): the entry count
// shows that a ramp writes at most one entry per weight change.
const (
	rampBenchBackend  = "be_ramp"
	rampBenchServers  = 1000
	rampBenchOthers   = 10000 // keys of the other backends (scaleKV): a mid-size fleet
	rampBenchDuration = 20 * time.Second
	rampBenchInterval = 100 * time.Millisecond
	rampBenchBefore   = 8 * time.Second // latency measured before the ramp
	rampBenchWarmup   = time.Second     // of rampBenchBefore, not counted
	// fleetEvery paces the fleet's polls of the ramping backend: 1,000
	// servers each polled every 2s (HAProxy's agent-inter) is 500 a second.
	fleetEvery = 2 * time.Millisecond
	// latencyWorkers per replica each ask about a server of another
	// backend every latencyEvery.
	latencyWorkers = 2
	latencyEvery   = 5 * time.Millisecond
)

func rampBenchServer(i int) string { return fmt.Sprintf("%s/gke-ramp-%04d", rampBenchBackend, i) }

// latencySample is one agent check of the latency probers.
type latencySample struct {
	at   time.Time // when it began
	took time.Duration
}

// latencyProbe asks replicas about servers whose answer does not change
// and records how long each check took.
type latencyProbe struct {
	stop chan struct{}
	wg   sync.WaitGroup

	mu      sync.Mutex
	samples []latencySample
	bad     int
	badMsg  []string
}

// startLatencyProbe runs latencyWorkers goroutines per replica; each asks
// about a random one of servers (want: server -> answer) every latencyEvery.
func startLatencyProbe(hs []*Hastate, servers []string, want map[string]string) *latencyProbe {
	p := &latencyProbe{stop: make(chan struct{})}
	for i, h := range hs {
		for w := range latencyWorkers {
			rng := rand.New(rand.NewPCG(uint64(i), uint64(w)))
			p.wg.Go(func() {
				everyUntil(p.stop, latencyEvery, func() {
					s := servers[rng.IntN(len(servers))]
					began := time.Now()
					kind, ans, err := probeAgent(h.AgentAddr, s)
					took := time.Since(began)
					p.mu.Lock()
					if kind == probeAnswered && ans == want[s] {
						p.samples = append(p.samples, latencySample{began, took})
					} else {
						p.bad++
						if len(p.badMsg) < 5 {
							p.badMsg = append(p.badMsg, fmt.Sprintf("%s %s: %q, want %q %v", h.NodeID, s, ans, want[s], errOrEmpty(err)))
						}
					}
					p.mu.Unlock()
				})
			})
		}
	}
	return p
}

func (p *latencyProbe) Stop() {
	close(p.stop)
	p.wg.Wait()
}

// between returns the latencies of the checks that began in [from, to).
func (p *latencyProbe) between(from, to time.Time) durations {
	p.mu.Lock()
	defer p.mu.Unlock()
	var d durations
	for _, s := range p.samples {
		if !s.at.Before(from) && s.at.Before(to) {
			d = append(d, s.took)
		}
	}
	return d
}

// fleetPoll polls every server of the ramping backend, as HAProxy does,
// spreading the checks over the replicas like the load balancer; every
// answer must be drain or ready <w>%. It returns the weights it saw.
type fleetPoll struct {
	stop chan struct{}
	wg   sync.WaitGroup

	mu      sync.Mutex
	weights map[string]bool // answers "ready <w>%" seen
	bad     int
	badMsg  []string
}

func startFleetPoll(hs []*Hastate) *fleetPoll {
	p := &fleetPoll{stop: make(chan struct{}), weights: map[string]bool{}}
	p.wg.Go(func() {
		i := -1
		everyUntil(p.stop, fleetEvery, func() {
			i++
			h, s := hs[i%len(hs)], rampBenchServer(i%rampBenchServers)
			kind, ans, err := probeAgent(h.AgentAddr, s)
			p.mu.Lock()
			switch {
			case kind == probeAnswered && ans == "drain":
			case kind == probeAnswered && strings.HasPrefix(ans, "ready ") && strings.HasSuffix(ans, "%"):
				p.weights[ans] = true
			default:
				p.bad++
				if len(p.badMsg) < 5 {
					p.badMsg = append(p.badMsg, fmt.Sprintf("%s %s: %q %v", h.NodeID, s, ans, errOrEmpty(err)))
				}
			}
			p.mu.Unlock()
		})
	})
	return p
}

// everyUntil calls f every d until stop is closed.
func everyUntil(stop <-chan struct{}, d time.Duration, f func()) {
	tick := time.NewTicker(d)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		f()
	}
}

func (p *fleetPoll) Stop() {
	close(p.stop)
	p.wg.Wait()
}

// BenchmarkBackendRamp reports the raft entries a backend-wide ramp over
// rampBenchServers servers takes (target: about 100 at most) and the
// agent-check latency of other servers during the ramp against before it
// (target: p99 within 1.2x). About 45 seconds.
func BenchmarkBackendRamp(b *testing.B) {
	kv := scaleKV(rampBenchOthers)
	otherServers := servers(kv)
	want := make(map[string]string, len(otherServers))
	for _, s := range otherServers {
		want[s] = expectedAnswer(b, kv["state/"+s])
	}
	wildcard := "state/" + rampBenchBackend + "/*"
	kv[wildcard] = "drain"

	consul := testenv.StartConsul(b, testenv.ConsulOptions{})
	loadKV(b, consul, kv)
	hs := StartCluster(b, 3, HastateOptions{ConsulAddr: consul.Addr(), Args: []string{
		"--ramp-duration", rampBenchDuration.String(), "--ramp-interval", rampBenchInterval.String(), "--ramp-start", "10%"}})
	leader := WaitLeader(b, 10*time.Second, hs...)
	waitMirror(b, time.Minute, kv, hs...)
	follower := others(hs, leader)[0]
	// Every replica has been asked about every server of the backend.
	for _, h := range hs {
		for i := range rampBenchServers {
			if kind, ans, err := probeAgent(h.AgentAddr, rampBenchServer(i)); kind != probeAnswered || ans != "drain" {
				b.Fatalf("%s: %s before the ramp: %q %v", h.NodeID, rampBenchServer(i), ans, errOrEmpty(err))
			}
		}
	}

	var (
		entries, steps, ramp float64
		before, during       durations
		weights              int
	)
	for b.Loop() {
		fleet := startFleetPoll(hs)
		lat := startLatencyProbe(hs, otherServers, want)
		time.Sleep(rampBenchBefore)

		idx := follower.samples(b, appliedIx, "hastate_ramp_steps_total")
		if _, err := consul.Client(b).KV().Delete(kvPrefix+wildcard, nil); err != nil {
			b.Fatalf("consul: delete %s: %v", wildcard, err)
		}
		start := time.Now()
		// Polled every 100ms, not in a tight loop: the latency measured
		// meanwhile is the point.
		testenv.Eventually(b, rampBenchDuration+30*time.Second, func() error {
			for _, h := range hs {
				if _, ans, _ := probeAgent(h.AgentAddr, rampBenchServer(0)); ans != "ready 100%" {
					return errors.New("the backend-wide ramp did not reach ready 100% on every replica")
				}
			}
			return nil
		})
		end := time.Now()
		fleet.Stop()
		lat.Stop()
		testenv.Eventually(b, 10*time.Second, func() error {
			for _, h := range hs {
				if h.Metric(b, "hastate_ramps_active") != 0 {
					return errors.New("hastate_ramps_active is not 0 on every replica after the ramp")
				}
			}
			return nil
		})
		after := follower.samples(b, appliedIx, "hastate_ramp_steps_total")
		entries = after[appliedIx] - idx[appliedIx]
		steps = after["hastate_ramp_steps_total"] - idx["hastate_ramp_steps_total"]
		ramp = end.Sub(start).Seconds()
		before = lat.between(start.Add(-rampBenchBefore+rampBenchWarmup), start)
		during = lat.between(start, end)
		weights = len(fleet.weights)
		if fleet.bad > 0 || lat.bad > 0 {
			b.Errorf("wrong or missing answers: fleet %d %v; other servers %d %v", fleet.bad, fleet.badMsg, lat.bad, lat.badMsg)
		}
	}
	if len(before) == 0 || len(during) == 0 {
		b.Fatalf("no latency samples: %d before, %d during", len(before), len(during))
	}
	ratio := float64(during.quantile(0.99)) / float64(before.quantile(0.99))
	b.ReportMetric(entries, "raft_entries")
	b.ReportMetric(steps, "ramp_steps")
	b.ReportMetric(ratio, "p99_ratio")
	b.ReportMetric(float64(before.quantile(0.99))/1e3, "before_p99_us")
	b.ReportMetric(float64(during.quantile(0.99))/1e3, "during_p99_us")
	fmt.Printf("backend-wide ramp over %d servers (%s, interval %s, from 10%%), other backends' agent checks before and during it:\n",
		rampBenchServers, rampBenchDuration, rampBenchInterval)
	fmt.Printf("  raft entries %.0f (target <= ~100), ramp steps %.0f, weights seen by the fleet %d, ramp took %.1fs\n", entries, steps, weights, ramp)
	fmt.Printf("  %-8s %8s %8s %8s %8s\n", "", "checks", "p50_us", "p99_us", "max_us")
	for _, r := range []struct {
		name string
		d    durations
	}{{"before", before}, {"during", during}} {
		fmt.Printf("  %-8s %8d %8.0f %8.0f %8.0f\n", r.name, len(r.d),
			float64(r.d.quantile(0.5))/1e3, float64(r.d.quantile(0.99))/1e3, float64(r.d.max())/1e3)
	}
	fmt.Printf("  p99 during/before %.2f (target <= 1.2)\n", ratio)
}
