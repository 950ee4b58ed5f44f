package test

import (
	"context"
	"fmt"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/internal/testenv"
)

// Issue 34: the operator path holds with a replica down. HAProxy A polls
// through the agent load balancer (a real HAProxy in TCP mode that
// health-checks each replica's readiness) from 127.0.0.2; HAProxy C polls
// n3 directly (from 127.0.0.1), as a node with its own route would.
//
//  1. n2 is SIGKILLed and the load balancer takes it out: every precheck
//     and wait that starts one load-balancer check plus two agent
//     intervals after the kill passes without a flag (and none before
//     says "blocked": they pass or cannot confirm); a write needs no flag.
//  2. n2 is back; n3 is SIGKILLed: HAProxy C is seen by no live replica,
//     so precheck, wait and a write exit 4 naming it; once n3 is back,
//     they pass again.
func TestE2EOneReplicaDown(t *testing.T) {
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	hs := StartCluster(t, 3, HastateOptions{ConsulAddr: consul.Addr()})
	web := Backend{Name: "web", Servers: []string{"s1", "s2", "s3"}}
	hapA := StartHAProxyLBFrom(t, hs, "127.0.0.2", web)
	StartHAProxy(t, hs[2].AgentAddr, web) // C: to n3 only, from 127.0.0.1
	op := hs[0].Operator()
	waitRecorded(t, hs[0], "127.0.0.1", "127.0.0.2")
	op.Run(t, "precheck", "web")

	// 1. n2 dies.
	kill := time.Now()
	hs[1].Kill()
	window := lbCheck + 2*agentInter
	runs := gateRuns(t, op, [][]string{{"precheck", "web"}, {"wait", "web", "--timeout", "5s"}}, kill, window, 4*time.Second)
	t.Logf("precheck and wait, in turn, with n2 killed at +0s: %s", runs)
	out := op.Run(t, "drain", "web/s1", "--reason", "a replica down")
	if strings.Contains(out, "guard lifted") || strings.Contains(out, "allow-no-replica") {
		t.Errorf("a write with one replica down lifted a guard:\n%s", out)
	}
	op.Run(t, "wait", "web/s1", "--timeout", "10s")
	if r, ok := shows(t, hapA, "web/s1", "DRAIN", -1); !ok {
		t.Errorf("wait returned with HAProxy A showing web/s1 %s", r)
	}
	op.RunExit(t, 1, "precheck", "web/s1")
	op.Run(t, "ready", "web/s1")
	op.Run(t, "wait", "web/s1", "--timeout", "10s")

	// 2. n2 is back; n3 dies: only n3 saw HAProxy C.
	hs[1].Start(t)
	hs[1].WaitReady(t)
	testenv.Eventually(t, 15*time.Second, func() error {
		_, code := op.RunCode(t, "precheck", "web")
		return testenv.Expect(code == 0, "precheck with every replica back: exit %d", code)
	})
	hs[2].Kill()
	for _, cmd := range [][]string{{"precheck", "web"}, {"wait", "web", "--timeout", "3s"}, {"drain", "web/s2", "--reason", "must not pass"}} {
		out, code := op.RunCode(t, cmd...)
		if code != 4 || !strings.Contains(out, "127.0.0.1") || !strings.Contains(out, "n3") {
			t.Errorf("%s while HAProxy 127.0.0.1 is seen only by the dead n3: exit %d, want 4 naming it and n3:\n%s", cmd[0], code, out)
		}
	}
	if got, _, _ := consul.Client(t).KV().Get(kvPrefix+"state/web/s2", nil); got != nil {
		t.Errorf("the refused drain wrote %s", got.Value)
	}
	hs[2].Start(t)
	hs[2].WaitReady(t)
	testenv.Eventually(t, 15*time.Second, func() error {
		_, code := op.RunCode(t, "precheck", "web")
		return testenv.Expect(code == 0, "precheck once n3 is back: exit %d", code)
	})
}

// shows reports whether HAProxy shows server with status (and weight, when
// not -1) within the moment it takes to apply an agent answer it was told
// (100 ms): wait returns once HAProxy was told, which it applies on receipt.
func shows(t *testing.T, hap *HAProxy, server, status string, weight int) (Row, bool) {
	t.Helper()
	var r Row
	for deadline := time.Now().Add(100 * time.Millisecond); ; {
		r = hap.Server(t, server)
		if (r.Status == status || strings.HasPrefix(r.Status, status+" ")) && (weight < 0 || r.Weight == weight) {
			return r, true
		}
		if time.Now().After(deadline) {
			return r, false
		}
	}
}

// lbCheck is the agent load balancer's health-check interval (fall 1:
// one failed check takes a replica out); see startHAProxy.
const lbCheck = 200 * time.Millisecond

// waitRecorded waits until the cluster records every source as an HAProxy
// node (level 3 in force, the leader's next gathering).
func waitRecorded(t *testing.T, h *Hastate, sources ...string) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, func() error {
		var v api.HAProxiesView
		h.GetJSON(t, "/v1/haproxies", &v)
		var got []string
		for _, n := range v.HAProxies {
			if !n.LastSeen.IsZero() {
				got = append(got, n.HAProxy)
			}
		}
		for _, s := range sources {
			if !v.Recorded || !slices.Contains(got, s) {
				return fmt.Errorf("the cluster does not record %v yet (recorded %v: %v)", sources, v.Recorded, got)
			}
		}
		return nil
	})
}

// gateRun is one run of a gate command: which, when it started (since
// the kill) and its exit.
type gateRun struct {
	cmd   string
	start time.Duration
	code  int
}

type gateRunList []gateRun

// String counts the runs by command and exit, and says when the last run
// that did not pass started.
func (l gateRunList) String() string {
	counts := map[string]int{}
	var lastFail time.Duration = -1
	for _, r := range l {
		counts[fmt.Sprintf("%s exit %d", r.cmd, r.code)]++
		if r.code != 0 {
			lastFail = r.start
		}
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(counts)) {
		parts = append(parts, fmt.Sprintf("%s: %d", k, counts[k]))
	}
	out := fmt.Sprintf("%d runs (%s)", len(l), strings.Join(parts, ", "))
	if lastFail >= 0 {
		out += fmt.Sprintf("; the last that did not pass started +%s after the kill", lastFail.Round(time.Millisecond))
	} else {
		out += "; every run passed, the first at +" + l[0].start.Round(time.Millisecond).String()
	}
	return out
}

// gateRuns runs the commands in turn, again and again, from since until
// since+window+d: each run exits 0 or 4 (nothing is drained: "blocked"
// would be wrong), and every run that starts at since+window or later
// exits 0. It fails the test otherwise, or when a command has fewer than 2
// runs that start after the window.
func gateRuns(t *testing.T, op Operator, cmds [][]string, since time.Time, window, d time.Duration) gateRunList {
	t.Helper()
	var runs gateRunList
	after := map[string]int{}
	for i := 0; time.Since(since) < window+d; i++ {
		cmd := cmds[i%len(cmds)]
		at := time.Since(since)
		out, code := op.RunCode(t, cmd...)
		runs = append(runs, gateRun{cmd[0], at, code})
		switch {
		case code != 0 && code != 4:
			t.Fatalf("%s +%s after the kill: exit %d, want 0 or 4 (nothing is drained):\n%s\nruns: %s", cmd[0], at.Round(time.Millisecond), code, out, runs)
		case at >= window && code != 0:
			t.Fatalf("%s started +%s after the kill (window %s): exit %d, want 0:\n%s\nruns: %s", cmd[0], at.Round(time.Millisecond), window, code, out, runs)
		case at >= window:
			after[cmd[0]]++
		}
	}
	for _, cmd := range cmds {
		if after[cmd[0]] < 2 {
			t.Fatalf("%s: only %d runs after the window: %s", cmd[0], after[cmd[0]], runs)
		}
	}
	return runs
}

// startHTTPLB starts an HAProxy in TCP mode in front of the replicas' HTTP
// ports, health-checking /-/readiness as the agent load balancer does: the
// address an operator's HASTATE_ADDR points at. It returns its address.
func startHTTPLB(t *testing.T, replicas []*Hastate) string {
	t.Helper()
	return startHTTPLBMode(t, replicas, "tcp")
}

// startHTTPLBMode is startHTTPLB in HAProxy's mode tcp or http (http: with
// no replica ready it answers 503 itself, as the demo's and many cloud
// load balancers do).
func startHTTPLBMode(t *testing.T, replicas []*Hastate, mode string) string {
	t.Helper()
	h := newHAProxy(t, haproxyRelease{})
	var cfg strings.Builder
	cfg.WriteString(h.global(0, "", ""))
	fmt.Fprintf(&cfg, "\nlisten http_lb\n    bind %s\n    mode %s\n    balance roundrobin\n    option httpchk GET /-/readiness\n", h.Frontend, mode)
	for i, r := range replicas {
		fmt.Fprintf(&cfg, "    server %s %s check inter %dms fall 1 rise 2\n", lbServerName(i), r.HTTPAddr, lbCheck.Milliseconds())
	}
	h.run(t, cfg.String(), func(st map[string]Row) string {
		for i := range replicas {
			if r := st["http_lb/"+lbServerName(i)]; r.Status != "UP" {
				return fmt.Sprintf("%s: %+v", lbServerName(i), r)
			}
		}
		return ""
	})
	return h.Frontend
}

// A rolling restart of all three replicas, one at a time (SIGTERM, start,
// ready), while a deploy pipeline loops: precheck of a ready server, then
// drain, wait, ready, wait of another, through an HTTP load balancer in
// front of the replicas. The pipeline retries a step that cannot confirm
// (exit 4) and never blocks on one for longer than one restart takes; it
// never passes wrongly: precheck never passes on the drained server, and
// when wait returns HAProxy shows what it waited for.
func TestE2ERollingRestartPipeline(t *testing.T) {
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	hs := StartCluster(t, 3, HastateOptions{ConsulAddr: consul.Addr(), Args: []string{"--shutdown-delay", "1s"}})
	web := Backend{Name: "web", Servers: []string{"s1", "s2", "s3"}}
	hap := StartHAProxyLB(t, hs, web)
	op := hs[0].Operator()
	op.Addr = startHTTPLB(t, hs)
	waitRecorded(t, hs[0], "127.0.0.1")

	type step struct {
		name    string
		blocked time.Duration // from the first attempt to the pass
		tries   int
	}
	var (
		mu     sync.Mutex
		steps  []step
		cycles int
		wrong  []string
	)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// run retries args while it cannot confirm (4); want is the exit that
	// passes the step.
	run := func(name string, want int, args ...string) bool {
		first := time.Now()
		for tries := 1; ; tries++ {
			if ctx.Err() != nil {
				return false
			}
			out, code := op.RunCode(t, args...)
			if code == want {
				mu.Lock()
				steps = append(steps, step{name, time.Since(first), tries})
				mu.Unlock()
				return true
			}
			if code != 4 {
				mu.Lock()
				wrong = append(wrong, fmt.Sprintf("%s: exit %d, want %d (or 4, retried):\n%s", name, code, want, out))
				mu.Unlock()
				return false
			}
		}
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for ctx.Err() == nil {
			if !run("precheck web/s2", 0, "precheck", "web/s2") ||
				!run("drain web/s1", 0, "drain", "web/s1", "--reason", "pipeline") ||
				!run("wait web/s1", 0, "wait", "web/s1", "--timeout", "20s") {
				return
			}
			if r, ok := shows(t, hap, "web/s1", "DRAIN", -1); !ok {
				mu.Lock()
				wrong = append(wrong, fmt.Sprintf("wait web/s1 passed with HAProxy showing %s", r))
				mu.Unlock()
			}
			if !run("precheck web/s1 (drained: blocks)", 1, "precheck", "web/s1") ||
				!run("ready web/s1", 0, "ready", "web/s1") ||
				!run("wait web/s1 (ready)", 0, "wait", "web/s1", "--timeout", "20s") {
				return
			}
			if r, ok := shows(t, hap, "web/s1", "UP", serverWeight); !ok {
				mu.Lock()
				wrong = append(wrong, fmt.Sprintf("wait web/s1 (ready) passed with HAProxy showing %s", r))
				mu.Unlock()
			}
			mu.Lock()
			cycles++
			mu.Unlock()
		}
	})
	var restarts durations
	for _, h := range slices.Backward(hs) {
		start := time.Now()
		if code, took := h.Stop(t); code != 0 {
			t.Fatalf("%s exited %d after SIGTERM (%s)", h.NodeID, code, took)
		}
		h.Start(t)
		h.WaitReady(t)
		// Back in both load balancers (rise 2).
		testenv.Eventually(t, 10*time.Second, func() error {
			c, err := net.DialTimeout("tcp", h.AgentAddr, time.Second)
			if err == nil {
				c.Close()
			}
			return err
		})
		restarts = append(restarts, time.Since(start)+2*lbCheck)
		t.Logf("%s restarted in %s", h.NodeID, time.Since(start).Round(time.Millisecond))
	}
	// One more cycle after the last restart.
	mu.Lock()
	done := cycles
	mu.Unlock()
	testenv.Eventually(t, 60*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		return testenv.Expect(cycles > done || len(wrong) > 0, "the pipeline did not complete a cycle after the restarts")
	})
	cancel()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if len(wrong) > 0 {
		t.Fatalf("the pipeline passed wrongly or failed:\n%s", strings.Join(wrong, "\n"))
	}
	longest := restarts.max()
	var worst step
	retried := 0
	for _, s := range steps {
		if s.tries > 1 {
			retried++
		}
		if s.blocked > worst.blocked {
			worst = s
		}
	}
	t.Logf("%d cycles, %d steps (%d retried), longest block %s (%s, %d tries), longest restart %s", cycles, len(steps), retried, worst.blocked.Round(time.Millisecond), worst.name, worst.tries, longest.Round(time.Millisecond))
	if worst.blocked > longest {
		t.Errorf("step %s blocked the pipeline %s, longer than one restart (%s)", worst.name, worst.blocked.Round(time.Millisecond), longest.Round(time.Millisecond))
	}
}
