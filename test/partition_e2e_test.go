package test

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hastate/hastate/internal/testenv"
)

// TestE2EPartitionBehindTheLoadBalancer is issue 16's setup with issue
// 23's window: three replicas behind a real HAProxy in TCP mode as the
// internal load balancer (roundrobin, `option httpchk GET /-/readiness`
// every 500ms, fall 2), a second real HAProxy with 20 servers whose agent
// checks go through it every 500ms, and one follower's raft traffic cut
// (its dials and its peers' dials to it go through proxies that are
// closed) while the load balancer still reaches its agent and HTTP ports.
// A backend-wide drain is written IN the window, 100ms, 500ms and 1s after
// the cut, long before --leaderless-grace takes the cut-off replica out of
// the load balancer (about 3.5-4s). From the first answer of drain on, no
// check through the load balancer gets another answer (the cut-off
// replica cannot confirm with the leader and answers nothing), and no
// server goes from DRAIN (agent) back to UP. After the heal the replica is
// back in the load balancer and answers the drain.
func TestE2EPartitionBehindTheLoadBalancer(t *testing.T) {
	for _, after := range []time.Duration{100 * time.Millisecond, 500 * time.Millisecond, time.Second} {
		t.Run("drain "+after.String()+" after the cut", func(t *testing.T) { partitionRun(t, after) })
	}
}

// partitionRun is one run of TestE2EPartitionBehindTheLoadBalancer with
// the drain written after the cut.
func partitionRun(t *testing.T, after time.Duration) {
	const (
		backend = "be_lb"
		servers = 20
		grace   = 3 * time.Second // the default, given explicitly
		lbInter = 500 * time.Millisecond
		lbFall  = 2
	)
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	hs := NewCluster(t, 3, HastateOptions{ConsulAddr: consul.Addr(), Args: []string{"--leaderless-grace", grace.String()}})
	mesh := newRaftMesh(t, newFaultNet(), hs)
	StartAll(t, hs...)
	lb := StartAgentLB(t, hs, LBOptions{Inter: lbInter, Fall: lbFall, Rise: 2})
	be := Backend{Name: backend}
	for i := range servers {
		be.Servers = append(be.Servers, fmt.Sprintf("s%02d", i+1))
	}
	fleet := StartHAProxy(t, lb.Frontend, be)
	leader := WaitLeader(t, 10*time.Second, hs...)
	cutIdx := (mesh.index(leader) + 1) % len(hs)
	cutOff := hs[cutIdx]
	lbRow := agentLBName + "/" + lbServerName(cutIdx)
	majority := others(hs, cutOff)
	for _, h := range hs {
		h.WaitReady(t)
	}
	// The fleet sees every server UP (ready) before the cut.
	samp := startStatSampler(fleet, backend, be.Servers)
	defer samp.stop()
	testenv.Eventually(t, 15*time.Second, func() error {
		return testenv.Expect(samp.allUp(), "not every server UP before the cut: %s", samp)
	})

	// Checks through the load balancer, as the fleet's are, from before
	// the cut to the end. From the first one answered drain on, each must
	// be answered drain or nothing.
	lbp := startLBProbers(lb.Frontend, backend+"/s01")
	defer lbp.stop()
	lbp.waitProbes(t, 20)
	lbp.expectFromFirst("drain")

	cut := mesh.Isolate(cutOff)
	cutAt := time.Now()
	t.Logf("cut the %d raft links of follower %s (leader %s); the load balancer still reaches its agent and HTTP ports", len(cut), cutOff.NodeID, leader.NodeID)

	// The drain, written in the window: the run's schedule, measured from
	// the cut's own timestamp.
	op := Operator{ConsulAddr: consul.Addr()}
	time.Sleep(time.Until(cutAt.Add(after)))
	wroteAt := time.Now()
	op.Run(t, "drain", backend+"/*", "--reason", "partition test")
	majorityAt, err := waitAllAnswer(majority, backend+"/s01", "drain", 10*time.Second)
	if err != nil {
		t.Fatalf("the majority did not follow the drain during the cut: %v", err)
	}
	lbp.expectBy(majorityAt)
	// The cut-off replica, still in the load balancer, answers nothing.
	if kind, ans, _ := probeAgent(cutOff.AgentAddr, backend+"/s01"); kind != probeUnanswered {
		t.Errorf("cut-off %s during the drain (%s after the cut): %v %q; want no answer", cutOff.NodeID, time.Since(cutAt).Round(time.Millisecond), kind, ans)
	}
	inLB := lb.Server(t, lbRow).Status
	var cutInfo string
	if time.Since(cutAt) < grace-contactSlack {
		code, rd := cutOff.Readiness(t)
		cutInfo = fmt.Sprintf("readiness %d %q", code, rd.Detail)
		if code != http.StatusOK || !strings.Contains(rd.Detail, "cannot confirm with the leader for") {
			t.Errorf("cut-off %s within the grace: /-/readiness %d %q; want 200 saying it cannot confirm", cutOff.NodeID, code, rd.Detail)
		}
	}

	// Readiness fails once the grace has passed; the load balancer then
	// takes the replica out.
	var notReadyAt time.Time
	testenv.Eventually(t, grace+10*time.Second, func() error {
		if code, rd := cutOff.Readiness(t); code != http.StatusServiceUnavailable || !strings.Contains(rd.Detail, "--leaderless-grace") {
			return fmt.Errorf("cut-off %s: /-/readiness %d %q", cutOff.NodeID, code, rd.Detail)
		}
		notReadyAt = time.Now()
		return nil
	})
	toNotReady := notReadyAt.Sub(cutAt)
	if toNotReady < grace-contactSlack {
		t.Errorf("cut-off %s failed readiness %s after the cut, before --leaderless-grace %s", cutOff.NodeID, toNotReady, grace)
	}
	if v := cutOff.Metric(t, `hastate_withheld{reason="leaderless"}`); v != 1 {
		t.Errorf("cut-off %s: hastate_withheld{reason=\"leaderless\"} = %v, want 1", cutOff.NodeID, v)
	}
	var lbOutAt time.Time
	testenv.Eventually(t, 10*time.Second, func() error {
		if r := lb.Server(t, lbRow); !strings.HasPrefix(r.Status, "DOWN") {
			return fmt.Errorf("the load balancer keeps %s in: %s", cutOff.NodeID, r)
		}
		lbOutAt = time.Now()
		return nil
	})
	toLBOut := lbOutAt.Sub(cutAt)

	// HAProxy: every server reaches DRAIN (agent); none ever goes back to UP.
	testenv.Eventually(t, 15*time.Second, func() error {
		return testenv.Expect(samp.allDrained(), "not every server shows DRAIN (agent): %s", samp)
	})
	allDrainedAt := time.Now()
	samp.waitSamples(t, 30) // 3s more of the cut, at 100ms a sample

	// Heal: the replica catches up, is ready again, the load balancer
	// takes it back, and it answers the drain.
	for _, l := range cut {
		l.Heal(t)
	}
	healAt := time.Now()
	cutOff.WaitReady(t)
	readyAt := time.Now()
	var lbInAt time.Time
	testenv.Eventually(t, 15*time.Second, func() error {
		if r := lb.Server(t, lbRow); r.Status != "UP" {
			return fmt.Errorf("the load balancer did not take %s back: %s", cutOff.NodeID, r)
		}
		lbInAt = time.Now()
		return nil
	})
	if got := cutOff.Ask(t, backend+"/s01"); got != "drain" {
		t.Errorf("healed %s answers %q, want drain", cutOff.NodeID, got)
	}
	if v := cutOff.Metric(t, `hastate_withheld{reason="leaderless"}`); v != 0 {
		t.Errorf("healed %s: hastate_withheld{reason=\"leaderless\"} = %v, want 0", cutOff.NodeID, v)
	}
	// Checks keep landing on all three; a few more rounds of the fleet.
	lbp.waitProbes(t, 60)
	samp.waitSamples(t, 30)
	samp.stop()
	res := lbp.stop()

	flips, samples, partial := samp.result()
	if flips != 0 {
		t.Errorf("%d times a server went from DRAIN (agent) back to UP (%d samples of show stat)", flips, samples)
	}
	if res.stale != 0 {
		t.Errorf("%d checks through the load balancer got a stale answer after the first drain answer (first: %v)", res.stale, res.firstStale)
	}
	if !samp.allDrained() {
		t.Errorf("after the heal not every server shows DRAIN (agent): %s", samp)
	}
	t.Logf("figures (drain %s after the cut): the cut-off replica was %s in the load balancer when the majority answered drain; %s", after, inLB, cutInfo)
	t.Logf("figures: cut -> cut-off replica fails readiness %s (grace %s); cut -> load balancer took it out %s (check every %s, fall %d)",
		toNotReady.Round(time.Millisecond), grace, toLBOut.Round(time.Millisecond), lbInter, lbFall)
	t.Logf("figures: cut -> drain written %s; write -> both majority replicas answer %s; -> 20/20 servers DRAIN (agent) %s; flips DRAIN (agent) -> UP: %d over %d show-stat samples (%d samples with fewer than %d drained, all before the first 20/20)",
		wroteAt.Sub(cutAt).Round(time.Millisecond), majorityAt.Sub(wroteAt).Round(time.Millisecond), allDrainedAt.Sub(wroteAt).Round(time.Millisecond), flips, samples, partial, servers)
	t.Logf("figures: heal -> cut-off replica ready %s, back in the load balancer %s; checks through the load balancer: %d answered drain from the first drain answer on, %d stale, %d unanswered, %d before",
		readyAt.Sub(healAt).Round(time.Millisecond), lbInAt.Sub(healAt).Round(time.Millisecond), res.ok, res.stale, res.unanswered, res.before)
}

// contactSlack is how much earlier than the grace a replica may withhold in
// the tests' measurements: the cut is measured when the proxies close, the
// grace from the last heartbeat before that.
const contactSlack = 500 * time.Millisecond

// lbProbers check one server through the load balancer every 20ms, as the
// fleet does every agent-inter, and judge each answer once expect is set.
type lbProbers struct {
	addr, server string
	done         chan struct{}
	wg           sync.WaitGroup
	stopOnce     sync.Once

	mu        sync.Mutex
	want      string
	since     time.Time // checks that begin after it are judged (zero: none yet)
	fromFirst bool      // since is set by the first check answered want
	res       lbResult
}

type lbResult struct {
	total, ok, stale, unanswered, before int
	firstStale                           string
}

func startLBProbers(addr, server string) *lbProbers {
	p := &lbProbers{addr: addr, server: server, done: make(chan struct{})}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		tickUntil(p.done, 20*time.Millisecond, func() {
			began := time.Now()
			kind, ans, err := probeAgent(p.addr, p.server)
			p.judge(began, kind, ans, err)
		})
	}()
	return p
}

func (p *lbProbers) judge(began time.Time, kind probeKind, ans string, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.res.total++
	if p.fromFirst && p.since.IsZero() && kind == probeAnswered && ans == p.want {
		p.since = time.Now() // this check ended after the change was committed
	}
	switch {
	case p.want == "" || p.since.IsZero() || began.Before(p.since):
		p.res.before++
	case kind == probeAnswered && ans == p.want:
		p.res.ok++
	case kind == probeUnanswered:
		p.res.unanswered++ // HAProxy keeps its state: not stale
	default:
		p.res.stale++
		if p.res.firstStale == "" {
			p.res.firstStale = fmt.Sprintf("%s: %q %v", began.Format("15:04:05.000"), ans, err)
		}
	}
}

// expectFromFirst makes every check that begins after the first check
// answered want ended be answered want (or nothing): once any HAProxy was
// told want, none is told otherwise (see also expectBy).
func (p *lbProbers) expectFromFirst(want string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.want, p.since = want, time.Time{}
	p.fromFirst = true
}

// expectBy makes every check that begins after at be judged too, if no
// check was answered want before it (at: when a replica was seen
// answering want).
func (p *lbProbers) expectBy(at time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.since.IsZero() || at.Before(p.since) {
		p.since = at
	}
}

func (p *lbProbers) total() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.res.total
}

func (p *lbProbers) waitProbes(t testing.TB, n int) {
	t.Helper()
	want := p.total() + n
	testenv.Eventually(t, 20*time.Second, func() error {
		got := p.total()
		return testenv.Expect(got >= want, "checks through the load balancer did not reach %d (at %d)", want, got)
	})
}

func (p *lbProbers) stop() lbResult {
	p.stopOnce.Do(func() { close(p.done) })
	p.wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.res
}

// statSampler reads `show stat` every 100ms and counts, per server, each
// change from DRAIN (agent) back to UP.
type statSampler struct {
	h        *HAProxy
	backend  string
	servers  []string
	done     chan struct{}
	wg       sync.WaitGroup
	stopOnce sync.Once

	mu      sync.Mutex
	last    map[string]string
	flips   int
	samples int
	partial int // samples with fewer than all drained, after one with all
	seenAll bool
	errs    int
}

func startStatSampler(h *HAProxy, backend string, servers []string) *statSampler {
	s := &statSampler{h: h, backend: backend, servers: servers, done: make(chan struct{}), last: map[string]string{}}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		tickUntil(s.done, 100*time.Millisecond, func() { s.record(h.stat()) })
	}()
	return s
}

func (s *statSampler) record(st map[string]Row, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.errs++
		return
	}
	s.samples++
	drained := 0
	for _, srv := range s.servers {
		cur := st[s.backend+"/"+srv].Status
		if s.last[srv] == statDrainAgent && cur == "UP" {
			s.flips++
		}
		if cur == statDrainAgent {
			drained++
		}
		s.last[srv] = cur
	}
	if drained == len(s.servers) {
		s.seenAll = true
	} else if s.seenAll {
		s.partial++
	}
}

func (s *statSampler) allUp() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, srv := range s.servers {
		if s.last[srv] != "UP" {
			return false
		}
	}
	return true
}

func (s *statSampler) allDrained() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, srv := range s.servers {
		if s.last[srv] != statDrainAgent {
			return false
		}
	}
	return true
}

func (s *statSampler) waitSamples(t testing.TB, n int) {
	t.Helper()
	s.mu.Lock()
	want := s.samples + n
	s.mu.Unlock()
	testenv.Eventually(t, time.Duration(n)*time.Second, func() error {
		s.mu.Lock()
		defer s.mu.Unlock()
		return testenv.Expect(s.samples >= want, "show stat samples did not reach %d (at %d)", want, s.samples)
	})
}

func (s *statSampler) stop() {
	s.stopOnce.Do(func() { close(s.done) })
	s.wg.Wait()
}

// result returns the flips, the samples and the samples after the first
// all-drained one that showed fewer drained.
func (s *statSampler) result() (flips, samples, partial int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.flips, s.samples, s.partial
}

func (s *statSampler) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var b strings.Builder
	for _, srv := range s.servers {
		fmt.Fprintf(&b, "%s=%q ", srv, s.last[srv])
	}
	fmt.Fprintf(&b, "(%d samples, %d errors)", s.samples, s.errs)
	return b.String()
}
