package test

// Issue 37: the mirror applies only Consul's own answer, from the cluster
// and prefix recorded in raft. One replica is pointed at another Consul
// (a fresh dev agent) or started with another --kv-prefix, then made
// leader by a leadership transfer while servers are drained: it applies
// nothing, says why everywhere, and hands leadership to a replica that
// matches; no HAProxy-like prober is ever told anything but the drain.

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/internal/testenv"
)

func TestE2EReplicaOfAnotherConsulNeverLeadsTheMirror(t *testing.T) {
	consulA := testenv.StartConsul(t, testenv.ConsulOptions{})
	consulB := testenv.StartConsul(t, testenv.ConsulOptions{}) // a fresh, empty dev agent: another cluster
	hs, odd, _ := mirrorMismatch(t, consulA, api.MirrorOtherCluster, func(h *Hastate) { h.AddArgs("--consul-addr", consulB.Addr()) })

	// Adopting: every replica is pointed at B, which holds the state to
	// serve from now on. No replica can mirror (B is not the recorded
	// cluster); the leader keeps leadership, applies nothing, says so.
	consulB.Put(t, stateKey("web/s1"), "drain")
	consulB.Put(t, stateKey("web/s2"), "maint")
	consulB.Put(t, stateKey("web/s3"), "maint") // B's state differs for s3
	for _, h := range hs {
		if h == odd {
			continue
		}
		h.Stop(t)
		h.AddArgs("--consul-addr", consulB.Addr())
		h.Start(t)
		h.WaitReady(t)
	}
	leader := WaitLeader(t, 20*time.Second, hs...)
	testenv.Eventually(t, 20*time.Second, func() error {
		for _, h := range hs {
			if m := h.Cluster(t).Mirror; m == nil || m.Reason != api.MirrorOtherCluster {
				return fmt.Errorf("%s: mirror %v, want other_cluster (every replica reads B)", h.NodeID, m)
			}
		}
		return nil
	})
	consistently(t, 3*time.Second, func() bool { return hs[0].Ask(t, "web/s3") == "ready 100%" },
		func() string { return "B's web/s3 was applied before anyone adopted B: " + hs[0].Ask(t, "web/s3") })
	leader = WaitLeader(t, 20*time.Second, hs...)
	op := leader.Operator()
	if out := op.Run(t, "status"); !strings.Contains(out, "warning: no replica can mirror Consul (") || !strings.Contains(out, "other_cluster") {
		t.Errorf("hastate status while no replica can mirror: no warning naming other_cluster:\n%s", out)
	}
	plan := op.RunExit(t, 2, "adopt-consul")
	in := leader.Cluster(t)
	if in.Consul == nil || in.Consul.ClusterID == "" || !strings.Contains(plan, in.Consul.ClusterID) || !strings.Contains(plan, "recorded in raft: cluster ") {
		t.Fatalf("adopt-consul without --cluster: %q; /v1/cluster consul %+v", plan, in.Consul)
	}
	t.Logf("adopt-consul plan:\n%s", plan)
	// The marker goes into B (CONSUL_HTTP_ADDR): another ID is refused,
	// nothing written; any replica can be asked (the leader adopts by
	// the marker in its own read of B).
	op.ConsulAddr = consulB.Addr()
	if out := op.RunExit(t, 1, "adopt-consul", "--cluster", "not-this-one"); !strings.Contains(out, "nothing written, nothing adopted") {
		t.Errorf("adopt-consul with another cluster ID: %q", out)
	}
	out := op.Run(t, "adopt-consul", "--cluster", in.Consul.ClusterID)
	t.Logf("adopt-consul: %s", out)
	if _, err := waitAllAnswer(hs, "web/s3", "maint", 20*time.Second); err != nil {
		t.Fatalf("after the adoption: %v", err)
	}
	for _, h := range hs {
		if src := h.Cluster(t).Source; src == nil || src.ClusterID != in.Consul.ClusterID {
			t.Errorf("%s records %v after the adoption, want cluster %s", h.NodeID, src, in.Consul.ClusterID)
		}
		if a := h.Answers(t, "web/s1", "web/s2"); a["web/s1"] != "drain" || a["web/s2"] != "maint" {
			t.Errorf("%s answers %v after the adoption", h.NodeID, a)
		}
	}
	if !leader.LogContains(t, "operator adopted a Consul cluster") {
		t.Errorf("the leader did not log the adoption")
	}
}

func TestE2EReplicaOfAnotherPrefixNeverLeadsTheMirror(t *testing.T) {
	consulA := testenv.StartConsul(t, testenv.ConsulOptions{})
	// another/ holds nothing: applied, it would undrain the fleet.
	mirrorMismatch(t, consulA, api.MirrorOtherPrefix, func(h *Hastate) { h.AddArgs("--kv-prefix", "another/") })
}

// A replica whose --consul-addr is a real HAProxy that answers 404 (no
// Consul headers) for every KV path and passes the rest to the right Consul
// reads an answer that is not Consul's: it never applies it (a bare 404
// read as "nothing set" would undrain the fleet), says not_consul, and
// hands leadership back when made leader (after --kv-failover-after, 5s
// here: unlike another cluster, prefix or a refused token, a proxy's 404
// may be a moment's misroute, so it is not taken as final at once).
func TestE2EReplicaBehindAProxyThatAnswers404NeverLeadsTheMirror(t *testing.T) {
	consulA := testenv.StartConsul(t, testenv.ConsulOptions{})
	proxy := StartConsulProxy404(t, consulA.Addr(), "/v1/kv/")
	mirrorMismatch(t, consulA, api.MirrorNotConsul, func(h *Hastate) {
		h.AddArgs("--consul-addr", proxy.Frontend, "--kv-failover-after", "5s")
	})
}

// mirrorMismatch starts three replicas on consulA with web/s1 drained and
// web/s2 in maint, restarts one follower with repoint (another Consul,
// another prefix), checks that it says want everywhere, makes it leader by
// a leadership transfer and checks that it applies nothing and hands
// leadership back to a replica that matches, while probers count every
// answer. It returns the replicas, the odd one and its leader's successor.
func mirrorMismatch(t *testing.T, consulA *testenv.Consul, want api.MirrorReason, repoint func(*Hastate)) (hs []*Hastate, odd, back *Hastate) {
	t.Helper()
	consulA.Put(t, stateKey("web/s1"), "drain")
	consulA.Put(t, stateKey("web/s2"), "maint")
	hs = StartCluster(t, 3, HastateOptions{ConsulAddr: consulA.Addr(), Args: []string{"--shutdown-delay", "3s"}})
	if _, err := waitAllAnswer(hs, "web/s1", "drain", 20*time.Second); err != nil {
		t.Fatal(err)
	}
	var recorded *api.MirrorSource
	testenv.Eventually(t, 20*time.Second, func() error {
		for _, h := range hs {
			in := h.Cluster(t)
			if in.Source == nil || in.Level.Applied != 3 {
				return fmt.Errorf("%s: level %d, source %v: not recorded yet", h.NodeID, in.Level.Applied, in.Source)
			}
			recorded = in.Source
		}
		return nil
	})
	t.Logf("recorded in raft: %s", recorded)

	leader := WaitLeader(t, 20*time.Second, hs...)
	for _, h := range hs {
		if h != leader {
			odd = h
			break
		}
	}
	odd.Stop(t)
	repoint(odd)
	odd.Start(t)
	odd.WaitReady(t)
	var verdict api.MirrorVerdict
	testenv.Eventually(t, 20*time.Second, func() error {
		if m := odd.Cluster(t).Mirror; m != nil {
			verdict = *m
		}
		return testenv.Expect(verdict.Reason == want, "%s: mirror %v, want %s", odd.NodeID, verdict, want)
	})
	t.Logf("%s says: %s", odd.NodeID, verdict)
	code, rd := odd.Readiness(t)
	if code != 200 || !strings.Contains(rd.Detail, "cannot mirror Consul") || !strings.Contains(rd.Detail, string(want)) {
		t.Errorf("%s readiness: %d %q, want ready (it serves raft's state) naming %s", odd.NodeID, code, rd.Detail, want)
	}
	if m := odd.Metric(t, fmt.Sprintf(`hastate_mirror_verdict{reason="%s"}`, want)); m != 1 {
		t.Errorf("%s hastate_mirror_verdict{reason=%q} = %v, want 1", odd.NodeID, want, m)
	}
	_, page, err := leader.get("/")
	if err != nil || !strings.Contains(string(page), "replica "+odd.NodeID+" cannot mirror Consul ("+string(want)+")") {
		t.Errorf("the leader's status page does not name %s (err %v)", odd.NodeID, err)
	}

	// Make the odd replica leader by a leadership transfer: the leader is
	// stopped (SIGTERM hands leadership on) while the other follower is
	// frozen and behind, so the transfer can only go to the odd one.
	var other *Hastate
	for _, h := range hs {
		if h != leader && h != odd {
			other = h
		}
	}
	s1 := startProbers(hs, 2, "web/s1", "drain")
	s2 := startProbers(hs, 2, "web/s2", "maint")
	s1.waitProbes(t, 200)
	other.Signal(t, syscall.SIGSTOP)
	consulA.Put(t, stateKey("web/s4"), "drain") // the frozen follower falls behind
	if _, err := waitAllAnswer([]*Hastate{leader, odd}, "web/s4", "drain", 10*time.Second); err != nil {
		other.Signal(t, syscall.SIGCONT)
		t.Fatal(err)
	}
	sigterm := leader.Signal(t, syscall.SIGTERM)
	var ledAt time.Time
	testenv.Eventually(t, 10*time.Second, func() error {
		if st, err := odd.raftState(); err == nil && st == "leader" {
			ledAt = time.Now()
			return nil
		}
		return fmt.Errorf("%s did not become leader by the transfer", odd.NodeID)
	})
	other.Signal(t, syscall.SIGCONT)
	t.Logf("%s became leader %s after the SIGTERM of %s", odd.NodeID, ledAt.Sub(sigterm).Round(time.Millisecond), leader.NodeID)
	if code, _ := leader.Wait(t, sigterm); code != 0 {
		t.Errorf("%s exited %d", leader.NodeID, code)
	}
	// With the old leader gone, the frozen-then-thawed follower is the
	// one replica that matches: leadership must end there.
	testenv.Eventually(t, 30*time.Second, func() error {
		st, _ := odd.raftState()
		return testenv.Expect(WaitLeader(t, 10*time.Second, odd, other) == other,
			"leadership is not back on %s (%s is %s)", other.NodeID, odd.NodeID, st)
	})
	back = other
	t.Logf("leadership back on %s, %s after %s led", back.NodeID, time.Since(ledAt).Round(time.Millisecond), odd.NodeID)
	if !odd.LogContains(t, "leader cannot mirror Consul; handing leadership to a follower that can") {
		t.Errorf("%s did not log its hand-over", odd.NodeID)
	}
	leader.Start(t)
	leader.WaitReady(t)
	consistently(t, 5*time.Second, func() bool { st, err := odd.raftState(); return err == nil && st != "leader" },
		func() string { return odd.NodeID + " leads again" })

	counts := map[string]string{}
	for name, p := range map[string]*probers{"web/s1": s1, "web/s2": s2} {
		for id, c := range p.Stop() {
			counts[name+"@"+id] = c.String()
			if c.Wrong > 0 {
				t.Errorf("%s on %s: %s: %v", name, id, c, c.Bad)
			}
		}
	}
	t.Logf("answers (wrong must be 0; refused/unanswered/failed are the stopped, frozen and withholding replicas): %v", counts)
	for _, h := range hs {
		if a := h.Answers(t, "web/s1", "web/s2", "web/s4"); a["web/s1"] != "drain" || a["web/s2"] != "maint" || a["web/s4"] != "drain" {
			t.Errorf("%s answers %v, want the drains and maint of the recorded Consul", h.NodeID, a)
		}
		if src := h.Cluster(t).Source; src == nil || *src != *recorded {
			t.Errorf("%s records %v, want %v", h.NodeID, src, recorded)
		}
	}
	return hs, odd, back
}
