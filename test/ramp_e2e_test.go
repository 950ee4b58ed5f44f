package test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hastate/hastate/internal/testenv"
)

// The ramp of these tests: 10% to 100% in 10 s, one step a second
// (9 percentage points a step), with HAProxy asking every 500 ms.
const (
	rampDuration = 10 * time.Second
	rampInterval = time.Second
	rampStep     = 9
)

// rampWeight reads "ready N%": 55 for "ready 55%"; false for anything else.
func rampWeight(ans string) (int, bool) {
	n, ok := strings.CutPrefix(ans, "ready ")
	if !ok {
		return 0, false
	}
	w, err := strconv.Atoi(strings.TrimSuffix(n, "%"))
	return w, err == nil && strings.HasSuffix(n, "%")
}

// rampWatch samples each HAProxy's weight of servers (and every live
// replica's answer) until all reach UP at 100, failing on any step back.
type rampWatch struct {
	t       *testing.T
	haps    HAProxies
	hs      []*Hastate
	servers []string
	seen    map[string][]int // distinct weights in order, per "<release> <server>"
	start   time.Time
	// loose suspends the one-step check between replicas: a new leader
	// resumes a ramp at the schedule's weight, which may be several steps
	// above the last one, and the replicas apply that entry a few
	// milliseconds apart.
	loose bool
}

func watchRamp(t *testing.T, haps HAProxies, hs []*Hastate, servers ...string) *rampWatch {
	return &rampWatch{t: t, haps: haps, hs: hs, servers: servers, seen: map[string][]int{}, start: time.Now()}
}

// key names server as seen by h in seen.
func (w *rampWatch) key(h *HAProxy, server string) string { return h.Release.String() + " " + server }

// sample takes one look; it reports whether every server is UP at 100.
func (w *rampWatch) sample(live func(*Hastate) bool) bool {
	t := w.t
	t.Helper()
	done := true
	for _, h := range w.haps {
		st := h.Stat(t)
		for _, s := range w.servers {
			r := st[s]
			if r.Status != statUp {
				done = false
				continue
			}
			k := w.key(h, s)
			ws := w.seen[k]
			if n := len(ws); n == 0 || ws[n-1] != r.Weight {
				if n > 0 && r.Weight < ws[n-1] {
					t.Fatalf("%s: HAProxy weight went down from %d to %d after %s (seen %v)", k, ws[n-1], r.Weight, time.Since(w.start), ws)
				}
				w.seen[k] = append(ws, r.Weight)
			}
			done = done && r.Weight == 100
		}
	}
	// Every live replica answers within one step of the others.
	for _, s := range w.servers {
		lo, hi := 101, -2
		var got []string
		for _, h := range w.hs {
			if !live(h) {
				continue
			}
			a := h.Ask(t, s)
			got = append(got, h.NodeID+"="+a)
			if wt, ok := rampWeight(a); ok && wt >= 0 {
				lo, hi = min(lo, wt), max(hi, wt)
			}
		}
		if hi >= 0 && hi-lo > rampStep+1 && !w.loose {
			t.Fatalf("%s: replicas more than one step apart: %v", s, got)
		}
	}
	return done
}

// run samples until done or the deadline, and returns how long it took.
func (w *rampWatch) run(deadline time.Duration, live func(*Hastate) bool, during func(elapsed time.Duration, weight int)) time.Duration {
	t := w.t
	t.Helper()
	for !w.sample(live) {
		if time.Since(w.start) > deadline {
			t.Fatalf("ramp not finished within %s: HAProxy weights seen %v", deadline, w.seen)
		}
		if during != nil {
			ws := w.seen[w.key(w.haps[0], w.servers[0])]
			last := -1
			if len(ws) > 0 {
				last = ws[len(ws)-1]
			}
			during(time.Since(w.start), last)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return time.Since(w.start)
}

// check asserts the shape of a finished ramp: it started near --ramp-start
// and climbed in several steps.
func (w *rampWatch) check() {
	t := w.t
	t.Helper()
	for _, h := range w.haps {
		for _, s := range w.servers {
			k := w.key(h, s)
			ws := w.seen[k]
			if len(ws) < 5 || ws[0] > 10+rampStep || ws[len(ws)-1] != 100 {
				t.Fatalf("%s: HAProxy weights %v; want a rise in steps from about 10 to 100", k, ws)
			}
			t.Logf("%s: HAProxy weights during the ramp: %v", k, ws)
		}
	}
}

func alive(*Hastate) bool { return true }

func TestE2ERamp(t *testing.T) {
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	hs := StartCluster(t, 3, HastateOptions{ConsulAddr: consul.Addr(), Args: []string{
		"--ramp-duration", rampDuration.String(), "--ramp-interval", rampInterval.String(), "--ramp-start", "10%"}})
	hap := StartHAProxiesLB(t, hs, beWeb, beAPI) // Debian's 2.6 and 3.0 LTS
	op := hs[0].Operator("--allow-unknown")      // writes before HAProxy has polled

	t.Run("undrain rises step by step on every replica", func(t *testing.T) {
		op.Run(t, "drain", "be_web/web1")
		hap.WaitServer(t, "be_web/web1", statDrainAgent, -1)
		op.Run(t, "clear", "be_web/web1")
		leader := WaitLeader(t, 5*time.Second, hs...)
		w := watchRamp(t, hap, hs, "be_web/web1")
		sawMetrics := false
		took := w.run(rampDuration+5*time.Second, alive, func(_ time.Duration, weight int) {
			if sawMetrics || weight < 30 || weight >= 90 {
				return
			}
			// Every replica reports the ramp in its metrics.
			for _, h := range hs {
				if h.Metric(t, "hastate_ramps_active") != 1 {
					return
				}
				if pw := h.Metric(t, `hastate_server_weight_percent{backend="be_web",server="web1"}`); pw < 19 || pw > 100 {
					t.Fatalf("%s: hastate_server_weight_percent %v during the ramp", h.NodeID, pw)
				}
			}
			sawMetrics = true
		})
		w.check()
		if !sawMetrics {
			t.Error("hastate_ramps_active never read 1 on every replica during the ramp")
		}
		for _, h := range hs {
			if h.Metric(t, "hastate_ramps_active") != 0 || h.Metric(t, "hastate_ramp_steps_total") < 10 {
				t.Errorf("%s: after the ramp: ramps_active %v, ramp_steps_total %v", h.NodeID, h.Metric(t, "hastate_ramps_active"), h.Metric(t, "hastate_ramp_steps_total"))
			}
		}
		if !leader.LogContains(t, `"msg":"ramp started"`) || !leader.LogContains(t, `"msg":"ramp ended"`) {
			t.Errorf("the leader %s did not log the ramp's start and end", leader.NodeID)
		}
		t.Logf("ramp of %s seen complete in HAProxy after %s", rampDuration, took)
		var st struct {
			Servers []struct {
				Backend, Server string
				Ramping         any `json:"ramping"`
			} `json:"servers"`
		}
		hs[0].GetJSON(t, "/v1/state", &st)
		for _, r := range st.Servers {
			if r.Ramping != nil {
				t.Fatalf("a ramp is still listed after it finished: %+v", r)
			}
		}
	})

	t.Run("drain during a ramp wins at once", func(t *testing.T) {
		op.Run(t, "drain", "be_web/web2")
		hap.WaitServer(t, "be_web/web2", statDrainAgent, -1)
		op.Run(t, "clear", "be_web/web2")
		for _, h := range hap {
			testenv.Eventually(t, 10*time.Second, func() error {
				r := h.Server(t, "be_web/web2")
				return testenv.Expect(r.Status == statUp && r.Weight >= 28 && r.Weight < 100, "%s: ramp never reached 28%%: %s", h.Release, r)
			})
		}
		out := op.Run(t, "status", "--addr", "http://"+hs[1].HTTPAddr, "be_web/web2")
		if !strings.Contains(out, "eta") {
			t.Errorf("hastate status does not show the ramp:\n%s", out)
		}
		// Written straight to Consul, so that the clock starts at the
		// write, not at a CLI process's start or exit.
		start := time.Now()
		consul.Put(t, stateKey("be_web/web2"), "drain")
		hap.WaitServer(t, "be_web/web2", statDrainAgent, -1)
		if took := time.Since(start); took > agentInter+time.Second {
			t.Fatalf("DRAIN (agent) after %s, want within agent-inter + 1s", took)
		} else {
			t.Logf("drain during the ramp shown by HAProxy after %s", took)
		}
		op.Run(t, "clear", "be_web/web2")
		watchRamp(t, hap, hs, "be_web/web2").run(rampDuration+5*time.Second, alive, nil)
	})

	t.Run("a backend wildcard ramps every server of the backend", func(t *testing.T) {
		op.Run(t, "drain", "be_api/*")
		hap.WaitServer(t, "be_api/api1", statDrainAgent, -1)
		hap.WaitServer(t, "be_api/api2", statDrainAgent, -1)
		op.Run(t, "clear", "be_api/*")
		w := watchRamp(t, hap, hs, "be_api/api1", "be_api/api2")
		w.run(rampDuration+5*time.Second, alive, nil)
		w.check()
		hap.Expect(t, "be_web/web1", "UP at 100 (be_web untouched by be_api's ramp)", func(r Row) bool { return r.Status == statUp && r.Weight == 100 })
	})

	t.Run("leader SIGKILL mid-ramp", func(t *testing.T) {
		op.Run(t, "drain", "be_web/web1")
		hap.WaitServer(t, "be_web/web1", statDrainAgent, -1)
		op.Run(t, "clear", "be_web/web1")
		var killed *Hastate
		var killedAt time.Duration
		live := func(h *Hastate) bool { return h != killed }
		w := watchRamp(t, hap, hs, "be_web/web1")
		var weightAtKill int
		took := w.run(rampDuration+10*time.Second, live, func(elapsed time.Duration, weight int) {
			if killed != nil {
				// Strict again once HAProxy saw the new leader's first step.
				w.loose = weight == weightAtKill
				return
			}
			if weight < 40 {
				return
			}
			// Kill right after a step has reached every replica, as a
			// crash between two steps.
			ans := map[string]bool{}
			for _, h := range hs {
				ans[h.Ask(t, "be_web/web1")] = true
			}
			if len(ans) != 1 {
				return
			}
			killed = WaitLeader(t, 5*time.Second, hs...)
			killed.Kill()
			killedAt, weightAtKill, w.loose = elapsed, weight, true
			t.Logf("killed leader %s at %s, weight %d", killed.NodeID, elapsed.Round(time.Millisecond), weight)
		})
		if killed == nil {
			t.Fatal("the leader was never killed mid-ramp")
		}
		w.check()
		var survivors []*Hastate
		for _, h := range hs {
			if h != killed {
				survivors = append(survivors, h)
			}
		}
		WaitLeader(t, 10*time.Second, survivors...)
		t.Logf("ramp of %s complete after %s with the leader killed at %s", rampDuration, took.Round(time.Millisecond), killedAt.Round(time.Millisecond))
		if took > rampDuration+5*time.Second+rampInterval {
			t.Fatalf("ramp took %s, more than duration + failover + one interval", took)
		}
		killed.Start(t)
		killed.WaitReady(t)
		if a := killed.Ask(t, "be_web/web1"); a != "ready 100%" {
			t.Fatalf("restarted replica answers %q", a)
		}
	})
}
