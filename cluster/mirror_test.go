package cluster

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/cluster/leader"
	"github.com/hastate/hastate/internal/testenv"
	"github.com/hastate/hastate/state"
)

// verdicts is a settable mirror verdict per node.
type verdicts struct {
	mu sync.Mutex
	v  []api.MirrorVerdict
}

func (vs *verdicts) health(i int) func() leader.ConsulHealth {
	return func() leader.ConsulHealth {
		vs.mu.Lock()
		defer vs.mu.Unlock()
		v := vs.v[i]
		return leader.ConsulHealth{Reachable: true, Checked: time.Now(), Verdict: v}
	}
}

func (vs *verdicts) set(i int, v api.MirrorVerdict) {
	vs.mu.Lock()
	vs.v[i] = v
	vs.mu.Unlock()
}

// verdictCluster starts three nodes whose mirror verdicts vs sets (all ok
// at first) and that wait an hour (KVFailoverAfter) before handing over
// for any reason that is not final, with a committed entry; old is the
// leader that committed it.
func verdictCluster(t *testing.T) (vs *verdicts, nodes []*testNode, old *testNode) {
	t.Helper()
	ok := api.MirrorVerdict{Reason: api.MirrorOK}
	vs = &verdicts{v: []api.MirrorVerdict{ok, ok, ok}}
	nodes = startCluster(t, func(i int, o *Options) {
		o.ConsulHealth = vs.health(i)
		o.KVFailoverAfter = time.Hour
	})
	return vs, nodes, applyOnLeader(t, nodes, 5, map[string]string{"state/web/s1": "drain"})
}

// A leader whose Consul is another cluster hands leadership at once (not
// after KVFailoverAfter, an hour here) to the follower that can mirror,
// never to one that cannot; the verdicts are reported over the raft port.
func TestLeaderOfAnotherConsulHandsOverToAFollowerThatMatches(t *testing.T) {
	vs, nodes, old := verdictCluster(t)
	var good *testNode
	for i, n := range nodes {
		switch {
		case n == old:
			vs.set(i, api.MirrorVerdict{Reason: api.MirrorOtherCluster, Detail: "cluster ID b, recorded a"})
		case good == nil:
			good = n
		default:
			vs.set(i, api.MirrorVerdict{Reason: api.MirrorOtherPrefix, Detail: `prefix "x/", recorded "hastate/"`})
		}
	}
	start := time.Now()
	testenv.Eventually(t, 10*time.Second, func() error {
		l := leaderOf(nodes)
		return testenv.Expect(l == good, "leader is %v, want %s, the one follower that can mirror", l, good.opts.ID)
	})
	t.Logf("leadership moved to the matching follower %s after %s", good.opts.ID, time.Since(start).Round(time.Millisecond))
	if got := old.MirrorVerdict(); got.Reason != api.MirrorOtherCluster {
		t.Errorf("old leader's verdict %v, want other_cluster", got)
	}
	info := good.Info()
	if info.Mirror == nil || !info.Mirror.CanMirror() {
		t.Errorf("/v1/cluster mirror of the new leader: %+v, want ok", info.Mirror)
	}
	for _, m := range info.Members {
		if m.Status == nil || m.Status.Mirror == nil {
			t.Errorf("member %s reports no mirror verdict: %+v", m.ID, m.Status)
			continue
		}
		if want := m.ID == good.opts.ID; m.Status.Mirror.CanMirror() != want {
			t.Errorf("member %s reports %v", m.ID, *m.Status.Mirror)
		}
	}
	testenv.Eventually(t, 5*time.Second, func() error {
		ready, d := old.Ready()
		return testenv.Expect(ready && strings.Contains(d, "cannot mirror Consul") && strings.Contains(d, "other_cluster"),
			"readiness of the replica of another Consul: %v %q, want ready (it serves raft's state) naming other_cluster", ready, d)
	})

	// No follower can mirror: the leader keeps leadership. (The leader's
	// own verdict changes last, so that it never sees a follower that
	// can while the others change.)
	for i, n := range nodes {
		if n != good {
			vs.set(i, api.MirrorVerdict{Reason: api.MirrorOtherCluster})
		}
	}
	for i, n := range nodes {
		if n == good {
			vs.set(i, api.MirrorVerdict{Reason: api.MirrorOtherCluster})
		}
	}
	testenv.Consistently(t, 3*time.Second, func() error {
		return testenv.Expect(leaderOf(nodes) == good, "leadership moved although no follower can mirror")
	})
}

// A leader whose token may not read the prefix (Consul answered 403 to
// the read proof) hands leadership at once, not after KVFailoverAfter (an
// hour here), to a follower whose token can.
func TestLeaderWhoseTokenCannotReadHandsOverAtOnce(t *testing.T) {
	vs, nodes, old := verdictCluster(t)
	vs.set(indexOf(nodes, old), api.MirrorVerdict{Reason: api.MirrorTokenCannotRead,
		Detail: "token accessor 1234 may not read hastate/: 403 (Permission denied)"})
	start := time.Now()
	testenv.Eventually(t, 10*time.Second, func() error {
		l := leaderOf(nodes)
		return testenv.Expect(l != nil && l != old, "leadership stayed on %s, whose token cannot read", old.opts.ID)
	})
	t.Logf("leadership moved off the leader whose token cannot read after %s", time.Since(start).Round(time.Millisecond))
}

// A release before 0.15.0 reports only consul_reachable.
func TestPeerStatusVerdictOfAnOlderRelease(t *testing.T) {
	if v := (api.PeerStatus{ConsulReachable: true}).Verdict(); !v.CanMirror() {
		t.Errorf("reachable old release: %v, want ok", v)
	}
	if v := (api.PeerStatus{}).Verdict(); v.Reason != api.MirrorConsulUnreachable {
		t.Errorf("unreachable old release: %v, want consul_unreachable", v)
	}
}

// The leader records the source of its first read once level 3 is in
// force, and applies nothing from another cluster or prefix: the mirror
// holds its state, and the refusal carries the reason. A read below the
// index held, from the recorded cluster, waits for a confirming re-read.
// The operator's Adopt records another cluster, and its reads apply.
func TestMirrorAppliesOnlyFromTheRecordedSource(t *testing.T) {
	nodes := startCluster(t, nil)
	testenv.Eventually(t, 15*time.Second, func() error {
		l := leaderOf(nodes)
		return testenv.Expect(l != nil && l.fsm.Level() == state.LevelRecorded, "level 3 not in force")
	})
	a := state.MirrorSource{ClusterID: "aaaa", Datacenter: "dc1", Servers: "127.0.0.1:8300", Prefix: "hastate/"}
	b := state.MirrorSource{ClusterID: "bbbb", Datacenter: "dc1", Servers: "127.0.0.1:9300", Prefix: "hastate/"}
	drained := map[string]string{"state/web/s1": "drain", "state/web/s2": "maint"}
	if err := applyRead(t, nodes, state.KVRead{Index: 500, KV: drained, Source: &a}); err != nil {
		t.Fatal(err)
	}
	l := nodes[0] // any replica, for what every replica in sync says
	testenv.Eventually(t, 5*time.Second, func() error {
		for _, n := range nodes {
			if rec := n.RecordedSource(); rec == nil || *rec != a {
				return fmt.Errorf("%s records %v, want %v", n.opts.ID, rec, a)
			}
			if got := answer(n.Node, "web/s1"); got != "drain\n" {
				return fmt.Errorf("%s answers %q", n.opts.ID, got)
			}
		}
		return nil
	})
	held := func(when string) {
		t.Helper()
		for _, n := range nodes {
			if s1, s2 := answer(n.Node, "web/s1"), answer(n.Node, "web/s2"); s1 != "drain\n" || s2 != "maint\n" {
				t.Errorf("%s: %s answers %q %q, want the drain and maint held", when, n.opts.ID, s1, s2)
			}
		}
	}
	otherPrefix := a
	otherPrefix.Prefix = "other/"
	for _, tc := range []struct {
		name string
		r    state.KVRead
		want api.MirrorReason
	}{
		{"another cluster, empty", state.KVRead{Index: 1, KV: map[string]string{}, Source: &b}, api.MirrorOtherCluster},
		{"another cluster, ahead", state.KVRead{Index: 900, KV: map[string]string{"state/web/s3": "drain"}, Source: &b}, api.MirrorOtherCluster},
		{"another cluster, re-read", state.KVRead{Index: 1, KV: map[string]string{}, Source: &b, Reread: true}, api.MirrorOtherCluster},
		{"another prefix", state.KVRead{Index: 600, KV: map[string]string{}, Source: &otherPrefix}, api.MirrorOtherPrefix},
	} {
		var me *api.MirrorError
		if err := applyRead(t, nodes, tc.r); !errors.As(err, &me) || me.Verdict.Reason != tc.want {
			t.Errorf("%s: ApplyRead = %v, want a MirrorError %s", tc.name, err, tc.want)
		} else if !strings.Contains(me.Verdict.Detail, "recorded") && !strings.Contains(me.Verdict.Detail, "the mirror in raft is of") {
			t.Errorf("%s: detail %q does not say what differs", tc.name, me.Verdict.Detail)
		}
		held(tc.name)
	}
	// The same cluster described anew (a server replaced) is recorded
	// anew, never poorer (a cluster ID not read this time is kept).
	a2 := a
	a2.Servers, a2.ClusterID = "127.0.0.1:8300,127.0.0.1:8302", ""
	if err := applyRead(t, nodes, state.KVRead{Index: 510, KV: drained, Source: &a2}); err != nil {
		t.Fatalf("a read of the recorded cluster with a server added: %v", err)
	}
	a.Servers = a2.Servers
	testenv.Eventually(t, 5*time.Second, func() error {
		rec := l.RecordedSource()
		return testenv.Expect(rec != nil && *rec == a, "recorded %v, want %v", rec, a)
	})
	// The same cluster behind the index held: only a re-read applies it.
	if err := applyRead(t, nodes, state.KVRead{Index: 400, KV: map[string]string{}, Source: &a}); !errors.Is(err, state.ErrIndexBehind) {
		t.Errorf("a read behind the index held: %v, want ErrIndexBehind", err)
	}
	held("behind")
	if err := applyRead(t, nodes, state.KVRead{Index: 400, KV: map[string]string{"state/web/s1": "drain"}, Source: &a, Reread: true}); err != nil {
		t.Errorf("a confirmed read behind the index held: %v", err)
	}
	testenv.Eventually(t, 5*time.Second, func() error {
		return testenv.Expect(answer(leaderOf(nodes).Node, "web/s2") == "ready 100%\n", "the confirmed read was not applied")
	})

	// The verdict of a replica that reads b (leader's TestVerdict has the
	// rule): other_cluster, as the node reports it.
	if v := leader.Verdict(leader.ConsulHealth{Reachable: true, Source: &b}, l.RecordedSource()); v.Reason != api.MirrorOtherCluster {
		t.Errorf("verdict for b against the recorded a: %v", v)
	}

	// Adopt: refused for another ID than the one confirmed, then b.
	if _, err := adopt(t, nodes, b, "cccc"); !errors.Is(err, ErrAdoptRefused) {
		t.Errorf("Adopt with another ID: %v, want ErrAdoptRefused", err)
	}
	old, err := adopt(t, nodes, b, "bbbb")
	if err != nil || old == nil || *old != a {
		t.Fatalf("Adopt = %v, %v, want a", old, err)
	}
	if err := applyRead(t, nodes, state.KVRead{Index: 3, KV: map[string]string{"state/web/s9": "maint"}, Source: &b}); err != nil {
		t.Errorf("a read of the adopted cluster at a low index: %v", err)
	}
	testenv.Eventually(t, 5*time.Second, func() error {
		for _, n := range nodes {
			if rec := n.RecordedSource(); rec == nil || *rec != b || answer(n.Node, "web/s9") != "maint\n" {
				return fmt.Errorf("%s records %v, answers %q", n.opts.ID, rec, answer(n.Node, "web/s9"))
			}
		}
		return nil
	})
	if err := applyRead(t, nodes, state.KVRead{Index: 700, KV: map[string]string{}, Source: &a}); err == nil {
		t.Errorf("a read of the cluster adopted away from was applied")
	}
}

// While a voter runs 0.14.0 (level 2) no source entry is written: reads
// apply as before, and nothing is recorded. Once that voter runs this
// release the level rises, and the leader records the source of the reads
// it applied, with no change in Consul needed.
func TestSourceWaitsForLevelRecorded(t *testing.T) {
	nodes := startCluster(t, func(i int, o *Options) {
		if i == 1 {
			o.MaxLevel = state.LevelMeta
		}
	})
	capped := nodes[1]
	src := state.MirrorSource{ClusterID: "aaaa", Prefix: "hastate/"}
	read := state.KVRead{Index: 5, KV: map[string]string{"state/web/s1": "drain"}, Source: &src}
	var (
		applier *testNode
		term    uint64
	)
	testenv.Eventually(t, 15*time.Second, func() error {
		l := leaderOf(nodes)
		applier = l
		if l != nil {
			term = l.raft.CurrentTerm()
		}
		switch {
		case l == nil:
			return errors.New("no leader")
		case l == capped:
			// The leader that applied the read records its source
			// later: keep it past the capped replica's restart.
			_ = l.raft.LeadershipTransfer().Error()
			return errors.New("the capped replica leads")
		}
		return l.ApplyRead(context.Background(), read)
	})
	testenv.Consistently(t, 3*leader.LevelEvery, func() error {
		for _, n := range nodes {
			if n.RecordedSource() != nil || n.fsm.Level() > state.LevelMeta || n.fsm.NotUnderstood() != nil {
				return fmt.Errorf("%s: recorded %v at level %d (not understood: %v)", n.opts.ID, n.RecordedSource(), n.fsm.Level(), n.fsm.NotUnderstood())
			}
		}
		return nil
	})
	if _, err := leaderOf(nodes).Adopt(context.Background(), src, ""); !errors.Is(err, ErrAdoptRefused) || !strings.Contains(err.Error(), "rolling upgrade") {
		t.Errorf("Adopt below level 3: %v", err)
	}
	o := capped.opts
	if err := capped.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	o.MaxLevel = 0
	nodes[1] = startNode(t, o)
	testenv.Eventually(t, 15*time.Second, func() error {
		if l := leaderOf(nodes); l != nil && (l != applier || l.raft.CurrentTerm() != term) && l.RecordedSource() == nil {
			// An election on a loaded machine: the leader of the new
			// term records with its watch's first read, as in the
			// product.
			t.Logf("a new term (leader %s, was %s): its first read records the source", l.opts.ID, applier.opts.ID)
			applier, term = l, l.raft.CurrentTerm()
			if err := l.ApplyRead(context.Background(), read); err != nil && !errors.Is(err, ErrNotLeader) {
				return err
			}
		}
		for _, n := range nodes {
			if rec := n.RecordedSource(); rec == nil || *rec != src || n.fsm.Level() != state.LevelRecorded {
				return fmt.Errorf("%s: recorded %v at level %d", n.opts.ID, rec, n.fsm.Level())
			}
		}
		return nil
	})
}

// applyRead is ApplyRead on the current leader, again on the next one
// while it answers ErrNotLeader (an election on a loaded machine); it
// returns the first other answer.
func applyRead(t *testing.T, nodes []*testNode, r state.KVRead) error {
	t.Helper()
	return onLeader(t, nodes, func(l *testNode) error { return l.ApplyRead(context.Background(), r) })
}

// adopt is Adopt on the current leader, as applyRead.
func adopt(t *testing.T, nodes []*testNode, src state.MirrorSource, want string) (old *state.MirrorSource, err error) {
	t.Helper()
	err = onLeader(t, nodes, func(l *testNode) error {
		var err error
		old, err = l.Adopt(context.Background(), src, want)
		return err
	})
	return old, err
}

// onLeader runs f on the current leader until it answers something other
// than ErrNotLeader, and returns that.
func onLeader(t *testing.T, nodes []*testNode, f func(l *testNode) error) error {
	t.Helper()
	var err error
	testenv.Eventually(t, 10*time.Second, func() error {
		l := leaderOf(nodes)
		if l == nil {
			return errors.New("no leader")
		}
		if err = f(l); errors.Is(err, ErrNotLeader) {
			return err
		}
		return nil
	})
	return err
}

// sourceHealth is a settable Consul health per node, with the source it
// reads (nil: its identity not read yet).
type sourceHealth struct {
	mu     sync.Mutex
	since  []time.Time // zero: reachable
	source []*state.MirrorSource
}

func (sh *sourceHealth) health(i int) func() leader.ConsulHealth {
	return func() leader.ConsulHealth {
		sh.mu.Lock()
		defer sh.mu.Unlock()
		return leader.ConsulHealth{Reachable: sh.since[i].IsZero(), FailingSince: sh.since[i], Checked: time.Now(), Source: sh.source[i]}
	}
}

func (sh *sourceHealth) set(i int, since time.Time, src *state.MirrorSource) {
	sh.mu.Lock()
	sh.since[i], sh.source[i] = since, src
	sh.mu.Unlock()
}

// A leader whose Consul comes back after an outage longer than
// KVFailoverAfter, but which has not read Consul's identity again yet (it
// started while Consul was down, so it cannot tell which cluster it
// reads), keeps leadership while the identity is read: the wait starts
// again when Consul answers. Before, the outage's streak went on, and it
// handed over to a follower in the seconds before the re-read (soak seed
// ...117). If the identity stays unread for KVFailoverAfter, it hands over.
func TestLeaderKeepsLeadershipWhileConsulIdentityIsReadAgain(t *testing.T) {
	const failoverAfter = 3 * time.Second
	a := state.MirrorSource{ClusterID: "aaaa", Datacenter: "dc1", Servers: "127.0.0.1:8300", Prefix: "hastate/"}
	sh := &sourceHealth{since: make([]time.Time, 3), source: []*state.MirrorSource{&a, &a, &a}}
	nodes := startCluster(t, func(i int, o *Options) {
		o.ConsulHealth = sh.health(i)
		o.KVFailoverAfter = failoverAfter
	})
	testenv.Eventually(t, 15*time.Second, func() error {
		l := leaderOf(nodes)
		return testenv.Expect(l != nil && l.fsm.Level() == state.LevelRecorded, "level 3 not in force")
	})
	if err := applyRead(t, nodes, state.KVRead{Index: 500, KV: map[string]string{"state/web/s1": "drain"}, Source: &a}); err != nil {
		t.Fatal(err)
	}
	l := leaderOf(nodes)
	li := indexOf(nodes, l)
	stays := func(d time.Duration, phase string) {
		t.Helper()
		testenv.Consistently(t, d, func() error {
			return testenv.Expect(leaderOf(nodes) == l, "%s: leadership moved off %s", phase, l.opts.ID)
		})
	}

	// Every replica's Consul has been down for 10s; the leader's has
	// restarted without an identity. No follower can mirror, so it keeps
	// leadership (and its first tick tries a hand-over: the old streak's
	// retry falls inside the next phase).
	long := time.Now().Add(-10 * time.Second)
	for i := range nodes {
		sh.set(i, long, &a)
	}
	sh.set(li, long, nil)
	stays(2500*time.Millisecond, "every Consul down")
	// Consul answers every replica; the leader has not read its identity
	// yet (a new streak: no hand-over for failoverAfter), the followers
	// can mirror.
	for i := range nodes {
		sh.set(i, time.Time{}, &a)
	}
	sh.set(li, time.Time{}, nil)
	stays(failoverAfter-750*time.Millisecond, "Consul back, the leader's identity not read yet")
	if v := l.MirrorVerdict(); v.Reason != api.MirrorConsulUnreachable {
		t.Fatalf("verdict of a leader that has not read Consul's identity: %v, want consul_unreachable", v)
	}
	sh.set(li, time.Time{}, &a)
	stays(2*time.Second, "identity read again")

	// The identity stays unread: it hands over after failoverAfter.
	sh.set(li, time.Time{}, nil)
	start := time.Now()
	testenv.Eventually(t, failoverAfter+5*time.Second, func() error {
		return testenv.Expect(leaderOf(nodes) != l && leaderOf(nodes) != nil, "leadership stayed on %s, whose Consul identity stays unread", l.opts.ID)
	})
	took := time.Since(start)
	if took < failoverAfter-time.Second {
		t.Errorf("handed over %s after the identity went unread, want about %s (KVFailoverAfter)", took.Round(time.Millisecond), failoverAfter)
	}
	t.Logf("the leader whose identity stayed unread handed over after %s", took.Round(time.Millisecond))
}
