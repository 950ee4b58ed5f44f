package test

import (
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hastate/hastate/internal/testenv"
)

// The timings of the rollout model, scaled down from GKE's so that a step
// takes seconds: the kubelet's readiness probe as the chart sets it (every
// 1 s, 2 failures), the load balancer's node health check at a quarter of
// GKE's (every 2 s, 3 failures: 6 s against 24 s), and the chart's
// shutdown delay formula on those (2 s × 3 + 2 s).
const (
	rolloutProbePeriod   = time.Second
	rolloutProbeFailures = 2
	rolloutLBInterval    = 2 * time.Second
	rolloutLBUnhealthy   = 3
	rolloutShutdownDelay = rolloutLBInterval*rolloutLBUnhealthy + 2*time.Second
)

// k8sNode models a GKE node running one replica under externalTrafficPolicy
// Local, as Kubernetes 1.28 (KEP-1669, ProxyTerminatingEndpoints) behaves:
//   - the kubelet probes /-/readiness every rolloutProbePeriod; the
//     endpoint is serving after one success, not after
//     rolloutProbeFailures failures in a row;
//   - kube-proxy forwards a connection that reaches the node to the local
//     endpoint while it is serving, terminating or not, and drops it
//     otherwise (counted);
//   - the node's health check port (healthCheckNodePort) passes only while
//     the local endpoint is serving and not terminating.
type k8sNode struct {
	h  *Hastate
	ln net.Listener // the node's port for the load balancer

	serving, terminating atomic.Bool
	dropped, forwarded   atomic.Int64
}

func (n *k8sNode) healthy() bool { return n.serving.Load() && !n.terminating.Load() }

// kubelet probes readiness until stop is closed.
func (n *k8sNode) kubelet(stop <-chan struct{}) {
	c := http.Client{Timeout: rolloutProbePeriod}
	fails := 0
	tickUntil(stop, rolloutProbePeriod, func() {
		ok := false
		if resp, err := c.Get("http://" + n.h.HTTPAddr + "/-/readiness"); err == nil {
			ok = resp.StatusCode == http.StatusOK
			resp.Body.Close()
		}
		switch {
		case ok:
			fails = 0
			n.serving.Store(true)
		default:
			if fails++; fails >= rolloutProbeFailures {
				n.serving.Store(false)
			}
		}
	})
}

// proxy is kube-proxy on the node.
func (n *k8sNode) proxy(wg *sync.WaitGroup) {
	defer wg.Done()
	for {
		c, err := n.ln.Accept()
		if err != nil {
			return
		}
		if !n.serving.Load() {
			n.dropped.Add(1)
			c.Close()
			continue
		}
		n.forwarded.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			splice(c, n.h.AgentAddr)
		}()
	}
}

// splice forwards c to addr both ways until the backend closes, then
// closes c: an agent check is one request and one answer.
func splice(c net.Conn, addr string) {
	defer c.Close()
	b, err := net.DialTimeout("tcp", addr, probeTimeout)
	if err != nil {
		return
	}
	defer b.Close()
	_ = c.SetDeadline(time.Now().Add(probeTimeout))
	_ = b.SetDeadline(time.Now().Add(probeTimeout))
	go func() {
		_, _ = io.Copy(b, c)
		_ = b.(*net.TCPConn).CloseWrite()
	}()
	_, _ = io.Copy(c, b)
}

// gcpILB models GKE's internal passthrough load balancer: each new
// connection goes to a node its health check holds healthy (healthy after
// one passing check, unhealthy after rolloutLBUnhealthy failing ones, every
// rolloutLBInterval); with none healthy, to any node.
type gcpILB struct {
	ln    net.Listener
	nodes []*k8sNode
	up    []atomic.Bool
}

func (lb *gcpILB) healthCheck(stop <-chan struct{}) {
	fails := make([]int, len(lb.nodes))
	tickUntil(stop, rolloutLBInterval, func() {
		for i, n := range lb.nodes {
			if n.healthy() {
				fails[i] = 0
				lb.up[i].Store(true)
			} else if fails[i]++; fails[i] >= rolloutLBUnhealthy {
				lb.up[i].Store(false)
			}
		}
	})
}

func (lb *gcpILB) serve(wg *sync.WaitGroup) {
	defer wg.Done()
	for {
		c, err := lb.ln.Accept()
		if err != nil {
			return
		}
		var up []*k8sNode
		for i, n := range lb.nodes {
			if lb.up[i].Load() {
				up = append(up, n)
			}
		}
		if len(up) == 0 {
			up = lb.nodes
		}
		n := up[rand.IntN(len(up))]
		wg.Add(1)
		go func() {
			defer wg.Done()
			splice(c, n.ln.Addr().String())
		}()
	}
}

// rolloutStep is what HAProxy-like pollers saw through the load balancer
// during one StatefulSet rollout step of one replica.
type rolloutStep struct {
	probes, ok, wrong, unanswered int
	dropped                       int64         // connections kube-proxy dropped on the rolled node
	badFirst, badLast             time.Duration // since SIGTERM
	lbOut                         time.Duration // SIGTERM until the load balancer took the node out
	step                          time.Duration // SIGTERM until the new pod is back in the load balancer
}

// runRolloutStep starts three replicas with args, each behind a k8sNode,
// one gcpILB in front, and pollers asking the load balancer for a drained
// server every 20ms; then rolls the replica of the highest ordinal as the
// StatefulSet does (terminating, SIGTERM, exit, a new pod on the same
// node and volume) and waits until it is back in the load balancer.
func runRolloutStep(t *testing.T, args ...string) rolloutStep {
	const server = "be_roll/web1"
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	hs := StartCluster(t, 3, HastateOptions{ConsulAddr: consul.Addr(), Args: append([]string{"--shutdown-delay", rolloutShutdownDelay.String()}, args...)})
	hs[0].Operator("--allow-unknown").Run(t, "drain", server)
	if _, err := waitAllAnswer(hs, server, "drain", 10*time.Second); err != nil {
		t.Fatal(err)
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	lb := &gcpILB{up: make([]atomic.Bool, len(hs))}
	var lns []net.Listener
	listen := func() net.Listener {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		return ln
	}
	for _, h := range hs {
		n := &k8sNode{h: h, ln: listen()}
		lb.nodes = append(lb.nodes, n)
		wg.Add(2)
		go func() { defer wg.Done(); n.kubelet(stop) }()
		go n.proxy(&wg)
	}
	lb.ln = listen()
	wg.Add(2)
	go func() { defer wg.Done(); lb.healthCheck(stop) }()
	go lb.serve(&wg)
	t.Cleanup(func() {
		close(stop)
		for _, ln := range lns {
			ln.Close()
		}
		wg.Wait()
	})
	allUp := func() error {
		for i := range lb.nodes {
			if !lb.up[i].Load() {
				return fmt.Errorf("node %d not in the load balancer", i)
			}
		}
		return nil
	}
	testenv.Eventually(t, 20*time.Second, allUp)

	var (
		mu  sync.Mutex
		res rolloutStep
		t0  time.Time // SIGTERM; zero before
	)
	pstop := make(chan struct{})
	var pwg sync.WaitGroup
	for range 3 {
		pwg.Add(1)
		go func() {
			defer pwg.Done()
			tickUntil(pstop, 20*time.Millisecond, func() {
				kind, ans, _ := probeAgent(lb.ln.Addr().String(), server)
				mu.Lock()
				defer mu.Unlock()
				res.probes++
				switch {
				case kind == probeAnswered && ans == "drain":
					res.ok++
					return
				case kind == probeAnswered:
					res.wrong++
				default:
					res.unanswered++
				}
				if !t0.IsZero() {
					since := time.Since(t0)
					if res.badFirst == 0 {
						res.badFirst = since
					}
					res.badLast = since
				}
			})
		}()
	}
	probes := func() int { mu.Lock(); defer mu.Unlock(); return res.probes }
	waitMore := func(n int) {
		want := probes() + n
		testenv.Eventually(t, 20*time.Second, func() error {
			return testenv.Expect(probes() >= want, "pollers stuck at %d probes", probes())
		})
	}
	waitMore(100)

	// The rollout step: the pod of the highest ordinal is deleted.
	rolled, node := hs[len(hs)-1], lb.nodes[len(hs)-1]
	mu.Lock()
	t0 = time.Now()
	mu.Unlock()
	node.terminating.Store(true)
	droppedBefore := node.dropped.Load()
	rolled.Signal(t, syscall.SIGTERM)
	var lbOut time.Duration
	watchOut := make(chan struct{})
	go func() { // owned: waited for below; ends when the node leaves the LB
		defer close(watchOut)
		for time.Since(t0) < time.Minute {
			if !lb.up[len(hs)-1].Load() {
				lbOut = time.Since(t0)
				return
			}
			time.Sleep(10 * time.Millisecond) // a poll of an atomic: the measured time is late by at most this
		}
	}()
	if code, took := rolled.Wait(t, t0); code != 0 {
		t.Fatalf("%s exited with %d after SIGTERM (took %s)", rolled.NodeID, code, took)
	}
	<-watchOut
	mu.Lock()
	res.lbOut = lbOut
	mu.Unlock()
	// The new pod: same node, same volume.
	node.terminating.Store(false)
	rolled.Start(t)
	rolled.WaitReady(t)
	testenv.Eventually(t, 30*time.Second, allUp)
	res.step = time.Since(t0)
	waitMore(100)
	close(pstop)
	pwg.Wait()
	res.dropped = node.dropped.Load() - droppedBefore
	return res
}

// The shutdown of a replica under externalTrafficPolicy Local, one rollout
// step measured through a model of GKE's load balancer, kube-proxy and the
// kubelet (k8sNode, gcpILB) with GKE's health check scaled to a quarter:
//
//   - readiness failing at SIGTERM (the chart before issue 36, and what
//     hastate does without --ready-while-stopping): the kubelet marks the
//     endpoint not serving within two probes, kube-proxy drops what still
//     reaches the node, and the load balancer goes on sending a third of
//     the checks there until its health check takes the node out;
//   - --ready-while-stopping (the chart's default now): the endpoint stays
//     serving while terminating, the node's health check fails at once
//     (terminating), and every check is answered until the load balancer
//     has taken the node out, within the shutdown delay.
//
// Both must give 0 wrong answers; the second must drop no connection.
func TestE2ERolloutStepExternalTrafficPolicyLocal(t *testing.T) {
	var before, after rolloutStep
	t.Run("readiness fails at SIGTERM", func(t *testing.T) { before = runRolloutStep(t) })
	t.Run("ready while stopping", func(t *testing.T) { after = runRolloutStep(t, "--ready-while-stopping") })
	for _, r := range []struct {
		name string
		rolloutStep
	}{{"readiness fails at SIGTERM", before}, {"--ready-while-stopping", after}} {
		t.Logf("%s: %d probes through the load balancer, %d answered right, %d wrong, %d without an answer (first %s, last %s after SIGTERM); %d dropped by kube-proxy on the rolled node; node out of the load balancer %s after SIGTERM; step %s",
			r.name, r.probes, r.ok, r.wrong, r.unanswered, r.badFirst.Round(time.Millisecond), r.badLast.Round(time.Millisecond), r.dropped,
			r.lbOut.Round(time.Millisecond), r.step.Round(time.Millisecond))
		if r.wrong != 0 {
			t.Errorf("%s: %d wrong answers", r.name, r.wrong)
		}
	}
	if after.dropped != 0 {
		t.Errorf("--ready-while-stopping: kube-proxy dropped %d connections on the rolled node: it stopped serving before the load balancer took the node out", after.dropped)
	}
	if before.dropped == 0 {
		t.Errorf("readiness failing at SIGTERM dropped no connection: the model does not reproduce the window it is meant to show")
	}
	if after.lbOut == 0 || after.lbOut > rolloutShutdownDelay {
		t.Errorf("--ready-while-stopping: the node left the load balancer %s after SIGTERM, not within the shutdown delay %s", after.lbOut, rolloutShutdownDelay)
	}
}
