package cluster

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/hastate/hastate/internal/testenv"
)

// TestReadIndexTargetAcrossASnapshot: a replica restored from a snapshot
// taken at a barrier (raft index 100, the FSM's last command 99) whose log
// starts after it, then leads with only its own no-op (101) and barrier
// (102): the target is the FSM's 99, which it serves, not 102, which no
// command reaches until the next write (every confirmation would time
// out, the whole fleet unanswered).
func TestReadIndexTargetAcrossASnapshot(t *testing.T) {
	store := raft.NewInmemStore()
	for _, l := range []*raft.Log{
		{Index: 101, Term: 3, Type: raft.LogNoop},
		{Index: 102, Term: 3, Type: raft.LogBarrier},
	} {
		if err := store.StoreLog(l); err != nil {
			t.Fatal(err)
		}
	}
	n := &Node{fsm: newFSM(), logs: newLogCache(8, store)}
	n.fsm.index.Store(99)
	for _, c := range []struct {
		commit, want uint64
	}{
		{102, 99}, // no-op and barrier after the snapshot: the FSM's index
		{101, 99},
		{100, 99}, // the snapshot's own index (compacted)
		{99, 99},
	} {
		got, err := n.readIndexTarget(c.commit)
		if err != nil || got != c.want {
			t.Errorf("readIndexTarget(%d) = %d, %v; want %d (the FSM serves 99; the log holds 101..102)", c.commit, got, err, c.want)
		}
	}
	// A command after the snapshot is the target once committed.
	if err := store.StoreLog(&raft.Log{Index: 103, Term: 3, Type: raft.LogCommand}); err != nil {
		t.Fatal(err)
	}
	if got, err := n.readIndexTarget(103); err != nil || got != 103 {
		t.Errorf("readIndexTarget(103) = %d, %v; want 103 (a command)", got, err)
	}
}

// TestReadIndexTargetMissingEntryInTheLog: an entry above the first one
// the log holds that cannot be read is a store fault, not a compacted
// entry: the round fails (it does not guess an index).
func TestReadIndexTargetMissingEntryInTheLog(t *testing.T) {
	store := raft.NewInmemStore()
	for _, l := range []*raft.Log{
		{Index: 10, Term: 1, Type: raft.LogCommand},
		{Index: 12, Term: 1, Type: raft.LogNoop}, // 11 missing
	} {
		if err := store.StoreLog(l); err != nil {
			t.Fatal(err)
		}
	}
	n := &Node{fsm: newFSM(), logs: store}
	n.fsm.index.Store(10)
	if got, err := n.readIndexTarget(12); err == nil {
		t.Errorf("readIndexTarget(12) with entry 11 unreadable = %d, nil; want an error", got)
	}
}

func voters(ids ...string) []raft.Server {
	var out []raft.Server
	for _, id := range ids {
		out = append(out, raft.Server{ID: raft.ServerID(id), Address: raft.ServerAddress(id + ":1"), Suffrage: raft.Voter})
	}
	return out
}

// TestAckIsQuorum: a follower's read-index request stands for a quorum
// with the leader's vote only where two voters are one (up to three
// voters); a non-voter, an unknown ID or the leader itself is no
// acknowledgement; the leader's own round (isQuorum) needs a majority of
// the voters, whatever the non-voters say.
func TestAckIsQuorum(t *testing.T) {
	nonvoter := raft.Server{ID: "n9", Address: "n9:1", Suffrage: raft.Nonvoter}
	five := voters("n1", "n2", "n3", "n4", "n5")
	threeAndNonvoter := append(voters("n1", "n2", "n3"), nonvoter)
	for _, c := range []struct {
		name    string
		servers []raft.Server
		id      string
		want    bool
	}{
		{"1 voter: nobody else is a voter", voters("n1"), "n2", false},
		{"2 voters: the other one", voters("n1", "n2"), "n2", true},
		{"3 voters: a follower", voters("n1", "n2", "n3"), "n2", true},
		{"3 voters: the leader itself", voters("n1", "n2", "n3"), "n1", false},
		{"3 voters: a stranger", voters("n1", "n2", "n3"), "x", false},
		{"3 voters and a non-voter: the non-voter", threeAndNonvoter, "n9", false},
		{"3 voters and a non-voter: a voter", threeAndNonvoter, "n3", true},
		{"4 voters: two are not a quorum", voters("n1", "n2", "n3", "n4"), "n2", false},
		{"5 voters: two are not a quorum", five, "n2", false},
		{"the leader is a non-voter", append(voters("n2", "n3"), raft.Server{ID: "n1", Suffrage: raft.Nonvoter}), "n2", false},
	} {
		if got := ackIsQuorum(c.servers, "n1", c.id); got != c.want {
			t.Errorf("%s: ackIsQuorum(n1, %s) = %v, want %v", c.name, c.id, got, c.want)
		}
	}
	acked := func(ids ...string) map[raft.ServerID]bool {
		m := map[raft.ServerID]bool{}
		for _, id := range ids {
			m[raft.ServerID(id)] = true
		}
		return m
	}
	for _, c := range []struct {
		name    string
		servers []raft.Server
		acked   map[raft.ServerID]bool
		want    bool
	}{
		{"1 voter: itself", voters("n1"), acked("n1"), true},
		{"3 voters: itself alone", voters("n1", "n2", "n3"), acked("n1"), false},
		{"3 voters: itself and one", voters("n1", "n2", "n3"), acked("n1", "n3"), true},
		{"3 voters and a non-voter: itself and the non-voter", threeAndNonvoter, acked("n1", "n9"), false},
		{"5 voters: itself and one", five, acked("n1", "n2"), false},
		{"5 voters: itself and two", five, acked("n1", "n2", "n5"), true},
		{"5 voters: four, not itself", five, acked("n2", "n3", "n4", "n5"), true},
		{"5 voters: two and strangers", five, acked("n1", "n2", "x", "y"), false},
		{"no voters", nil, acked("n1"), false},
	} {
		if got := isQuorum(c.servers, c.acked); got != c.want {
			t.Errorf("%s: isQuorum = %v, want %v", c.name, got, c.want)
		}
	}
}

// TestNoAnswerBeforeTheBarrier: a follower that becomes leader answers
// nothing, and confirms nothing for the others, until the barrier of its
// term is done: until then its commit index may miss entries the leader
// before it committed. (The barrier is held open by a test hook.)
func TestNoAnswerBeforeTheBarrier(t *testing.T) {
	var hold [3]atomic.Bool
	release := make(chan struct{})
	nodes, _, l, f := startMesh(t, 3*time.Second, func(i int, o *Options) {
		o.ConfirmTimeout = 200 * time.Millisecond
		o.afterBarrier = func() {
			if hold[i].Load() {
				<-release
			}
		}
	})
	hold[indexOf(nodes, f)].Store(true)
	released := sync.OnceFunc(func() { close(release) })
	defer released()
	if err := l.raft.LeadershipTransferToServer(raft.ServerID(f.opts.ID), raft.ServerAddress(f.opts.Advertise)).Error(); err != nil {
		t.Fatalf("transfer leadership to %s: %v", f.opts.ID, err)
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		return testenv.Expect(f.IsLeader(), "%s does not lead", f.opts.ID)
	})
	testenv.Consistently(t, time.Second, func() error {
		for _, n := range nodes {
			if got := confirmedAnswer(n.Node, "web/a"); got != "" {
				return fmt.Errorf("%s answered %q while the new leader %s has not finished its barrier", n.opts.ID, got, f.opts.ID)
			}
		}
		return nil
	})
	if err := f.conf.lastError(); err == nil || !strings.Contains(err.Error(), "barrier") {
		t.Errorf("new leader %s: last round's error %v, want it to name the barrier", f.opts.ID, err)
	}
	released()
	for _, n := range nodes {
		testenv.Eventually(t, 10*time.Second, func() error {
			return testenv.Expect(confirmedAnswer(n.Node, "web/a") == "ready 1%\n", "%s does not answer after the barrier", n.opts.ID)
		})
	}
}

// certFor is a self-signed certificate with the given DNS and IP SANs
// (certIsFor reads SANs only; the TLS handshake verified the chain).
func certFor(t *testing.T, dns []string, ips ...string) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "peer"}, DNSNames: dns,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	for _, ip := range ips {
		tmpl.IPAddresses = append(tmpl.IPAddresses, net.ParseIP(ip))
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestReadIndexIDIsBoundToTheCertificate: a read-index request counts as
// member id's acknowledgement only when the peer's certificate is valid
// for the host of id's raft address (its SAN, as the README's certificates
// carry); a certificate of another member, or of no member, is not.
func TestReadIndexIDIsBoundToTheCertificate(t *testing.T) {
	servers := []raft.Server{
		{ID: "hastate-0", Address: "hastate-0.hastate.ops.svc:9779", Suffrage: raft.Voter},
		{ID: "hastate-1", Address: "hastate-1.hastate.ops.svc:9779", Suffrage: raft.Voter},
		{ID: "ip-2", Address: "10.1.2.3:9779", Suffrage: raft.Voter},
	}
	one := certFor(t, []string{"hastate-1.hastate.ops.svc"})
	wild := certFor(t, []string{"*.hastate.ops.svc"})
	ip := certFor(t, nil, "10.1.2.3")
	for _, c := range []struct {
		cert *x509.Certificate
		id   string
		ok   bool
	}{
		{one, "hastate-1", true},
		{one, "hastate-0", false}, // another member's ID
		{one, "stranger", false},
		{wild, "hastate-0", true},
		{wild, "ip-2", false},
		{ip, "ip-2", true},
		{ip, "hastate-1", false},
	} {
		if err := certIsFor(servers, c.cert, c.id); (err == nil) != c.ok {
			t.Errorf("certificate %v %v for %s: %v, want ok %v", c.cert.DNSNames, c.cert.IPAddresses, c.id, err, c.ok)
		}
	}

	// On a leader: an unbound ID is answered from the leader's own round
	// (still the right index, one round more), a bound one at once.
	_, _, l, f := startMesh(t, 3*time.Second, nil)
	term := l.raft.CurrentTerm()
	own := func() float64 { return metricOf(t, l, "hastate_confirm_rounds_total", "result=confirmed") }
	bound := certFor(t, nil, "127.0.0.1")
	unbound := certFor(t, []string{"elsewhere.example"})
	before := own()
	if a := l.answerReadIndex(readIndexRequest{ID: f.opts.ID, Term: term}, bound); a.Error != "" || a.Index == 0 {
		t.Fatalf("bound request: %+v", a)
	}
	if d := own() - before; d > 1 { // at most a refresh round meanwhile
		t.Errorf("a bound request cost %v rounds of the leader, want none", d)
	}
	a := l.answerReadIndex(readIndexRequest{ID: f.opts.ID, Term: term}, unbound)
	if a.Error != "" || a.Index != l.fsm.index.Load() {
		t.Fatalf("unbound request: %+v, want the index %d from the leader's round", a, l.fsm.index.Load())
	}
}

// TestWipedReplicaLeadsAfterASnapshotAtABarrier is issue 33's liveness
// fault on a real cluster: the leader snapshots right after its barrier
// (the snapshot's raft index is the barrier, the FSM's index the last
// command before it), a replica whose disk was lost rejoins and installs
// that snapshot, and then leads with only its own no-op and barrier in its
// log. Every replica must go on answering without any write: the read
// index is the FSM's, not the barrier's (before the fix every round timed
// out and the whole fleet went unanswered until the next write).
func TestWipedReplicaLeadsAfterASnapshotAtABarrier(t *testing.T) {
	nodes, _, _, f := startMesh(t, 3*time.Second, func(_ int, o *Options) {
		o.SnapshotThreshold, o.SnapshotInterval = 8, 100*time.Millisecond
		o.ConfirmTimeout = 300 * time.Millisecond
	})
	for i := range 40 {
		applyOnLeader(t, nodes, uint64(i+2), map[string]string{"state/web/a": fmt.Sprintf("%d%%", i+2)})
	}
	const want = "ready 41%\n"
	// Leadership moves (a no-op and a barrier of the new term), then the
	// new leader snapshots at its barrier.
	m := leaderOf(nodes)
	if err := m.raft.LeadershipTransfer().Error(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		m = leaderOf(nodes)
		return testenv.Expect(m != nil && m.barrierTerm.Load() == m.raft.CurrentTerm(), "no new leader past its barrier")
	})
	if err := m.raft.Snapshot().Error(); err != nil {
		t.Fatalf("snapshot on %s: %v", m.opts.ID, err)
	}
	snapIndex := m.raft.LastIndex()
	if fi := m.fsm.index.Load(); fi >= snapIndex {
		t.Fatalf("the snapshot at %d is at a command (FSM index %d): the scenario needs it past one", snapIndex, fi)
	}

	// f loses its disk and rejoins (the same ID and address).
	if f == m {
		f = followerOf(nodes, m)
	}
	if err := f.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	o := f.opts
	o.DataDir = t.TempDir()
	w := startNode(t, o)
	nodes[indexOf(nodes, f)] = w
	testenv.Eventually(t, 15*time.Second, func() error {
		return testenv.Expect(answer(w.Node, "web/a") == want && w.raft.Stats()["last_snapshot_index"] != "0",
			"wiped %s has not installed a snapshot (stats %v)", w.opts.ID, w.raft.Stats()["last_snapshot_index"])
	})
	if first, _ := w.logs.FirstIndex(); first != 0 && first <= snapIndex {
		t.Fatalf("wiped %s's log starts at %d, at or before the snapshot %d: it did not start from the snapshot", w.opts.ID, first, snapIndex)
	}
	if err := m.raft.LeadershipTransferToServer(raft.ServerID(w.opts.ID), raft.ServerAddress(w.opts.Advertise)).Error(); err != nil {
		t.Fatalf("transfer leadership to %s: %v", w.opts.ID, err)
	}
	testenv.Eventually(t, 10*time.Second, func() error { return testenv.Expect(w.IsLeader(), "%s does not lead", w.opts.ID) })
	for _, n := range nodes {
		testenv.Eventually(t, 5*time.Second, func() error {
			got := confirmedAnswer(n.Node, "web/a")
			return testenv.Expect(got == want, "%s answers %q with %s leading from its snapshot at %d (FSM %d); last round: %v",
				n.opts.ID, got, w.opts.ID, snapIndex, n.fsm.index.Load(), n.conf.lastError())
		})
	}
}

// TestBarrierOfAnEarlierTermDoesNotCount: a barrier that returns after
// the node lost leadership and led again in a later term proves nothing
// about that term (its no-op may not be committed): the term is read
// before the barrier and recorded only if unchanged, so the new term's
// leader duty starts with its own barrier not yet recorded. (Before the
// fix the term read after the barrier was recorded: the later term
// looked done before its own barrier.)
func TestBarrierOfAnEarlierTermDoesNotCount(t *testing.T) {
	var armed atomic.Bool
	var calls atomic.Int32
	var premature atomic.Bool // barrierTerm said the new term was done before its barrier
	var n0 *testNode
	var hookErr atomic.Pointer[string]
	var nodes []*testNode
	nodes, _ = meshClusterWith(t, 3*time.Second, func(i int, o *Options) {
		if i != 0 {
			return
		}
		o.afterBarrier = func() {
			if !armed.Load() {
				return
			}
			switch calls.Add(1) {
			case 1:
				// Leadership goes away and comes back before this
				// barrier's term is checked.
				term := n0.raft.CurrentTerm()
				if err := n0.raft.LeadershipTransfer().Error(); err != nil {
					msg := "transfer away: " + err.Error()
					hookErr.Store(&msg)
					return
				}
				deadline := time.Now().Add(10 * time.Second)
				for !(n0.IsLeader() && n0.raft.CurrentTerm() > term+1) && time.Now().Before(deadline) {
					if x := leaderOf(nodes[1:]); x != nil {
						_ = x.raft.LeadershipTransferToServer(raft.ServerID(n0.opts.ID), raft.ServerAddress(n0.opts.Advertise)).Error()
					}
					<-time.After(20 * time.Millisecond)
				}
				if !n0.IsLeader() {
					msg := "leadership did not come back"
					hookErr.Store(&msg)
				}
			case 2:
				premature.Store(n0.barrierTerm.Load() == n0.raft.CurrentTerm())
			}
		}
	})
	n0 = nodes[0]
	testenv.Eventually(t, 10*time.Second, func() error { return testenv.Expect(leaderOf(nodes) != nil, "no leader") })
	if x := leaderOf(nodes); x == n0 {
		if err := n0.raft.LeadershipTransfer().Error(); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		x := leaderOf(nodes)
		return testenv.Expect(x != nil && x != n0, "no leader other than %s", n0.opts.ID)
	})
	applyOnLeader(t, nodes, 1, map[string]string{"state/web/a": "drain"})
	armed.Store(true)
	x := leaderOf(nodes)
	if err := x.raft.LeadershipTransferToServer(raft.ServerID(n0.opts.ID), raft.ServerAddress(n0.opts.Advertise)).Error(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, func() error {
		return testenv.Expect(calls.Load() >= 2, "%s's leader duty ran its barrier %d times, want 2", n0.opts.ID, calls.Load())
	})
	if e := hookErr.Load(); e != nil {
		t.Fatalf("the scenario did not happen: %s", *e)
	}
	if premature.Load() {
		t.Errorf("%s recorded the term it led again in as done with the barrier of the term before", n0.opts.ID)
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		return testenv.Expect(!n0.IsLeader() || n0.barrierTerm.Load() == n0.raft.CurrentTerm(), "%s never finished its own barrier", n0.opts.ID)
	})
}
