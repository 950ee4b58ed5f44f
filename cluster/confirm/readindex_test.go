package confirm

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
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
	st := &fakeState{}
	st.index.Store(99)
	n := New(Options{ID: "n1", State: st, Log: store, Transport: transport{newFakeNet()}})
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
	st := &fakeState{}
	st.index.Store(10)
	n := New(Options{ID: "n1", State: st, Log: store, Transport: transport{newFakeNet()}})
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
	net, ms := cluster(t, 3, nil, true, nil)
	l, f := ms[0], ms[1]
	for _, m := range ms { // the members' addresses as the certificates name them
		m.raft.set(func(r *fakeRaft) {
			for i := range r.servers {
				r.servers[i].Address = raft.ServerAddress("127.0.0." + r.servers[i].ID[1:] + ":9779")
			}
		})
		net.mu.Lock()
		net.members["127.0.0."+m.id[1:]+":9779"] = m.reads
		net.mu.Unlock()
	}
	own := func() uint64 { return l.reads.Rounds() }
	bound := certFor(t, nil, "127.0.0.2")
	unbound := certFor(t, []string{"elsewhere.example"})
	before := own()
	if a := l.reads.answerReadIndex(readIndexRequest{ID: f.id, Term: 2}, bound); a.Error != "" || a.Index != 10 {
		t.Fatalf("bound request: %+v", a)
	}
	if d := own() - before; d > 1 { // at most a refresh round meanwhile
		t.Errorf("a bound request cost %v rounds of the leader, want none", d)
	}
	before = own()
	a := l.reads.answerReadIndex(readIndexRequest{ID: f.id, Term: 2}, unbound)
	if a.Error != "" || a.Index != 10 {
		t.Fatalf("unbound request: %+v, want the index 10 from the leader's round", a)
	}
	if own() == before {
		t.Errorf("an unbound request was answered without a round of the leader's own")
	}
}

// TestAnswerReadIndexRefuses: the leader answers a read-index request only
// in the follower's term, after its barrier; a requester that is not a
// voter is no acknowledgement (its request waits for a VerifyLeader round,
// which a one-node leader passes at once).
func TestAnswerReadIndexRefuses(t *testing.T) {
	_, ms := cluster(t, 1, nil, true, nil)
	n := ms[0].reads
	term := uint64(2)
	if a := n.answerReadIndex(readIndexRequest{ID: "n2", Term: term + 1}, nil); a.Error == "" || !strings.Contains(a.Error, "term") {
		t.Errorf("a request of another term: %+v, want refused naming the term", a)
	}
	if n.ackIsQuorum("stranger") || n.ackIsQuorum(ms[0].id) {
		t.Errorf("a non-voter or the leader itself counts as an acknowledgement")
	}
	a := n.answerReadIndex(readIndexRequest{ID: "stranger", Term: term}, nil)
	if a.Error != "" || a.Index != 10 || a.ID != ms[0].id {
		t.Errorf("a request in the leader's term: %+v, want the state index 10", a)
	}
	// Before the barrier of its term, and on a follower: refused.
	n.BarrierDone(1)
	if a := n.answerReadIndex(readIndexRequest{ID: "stranger", Term: term}, nil); a.Error == "" || !strings.Contains(a.Error, "barrier") {
		t.Errorf("a request before the leader's barrier: %+v, want refused naming the barrier", a)
	}
	n.BarrierDone(term)
	ms[0].raft.set(func(r *fakeRaft) { r.state = raft.Follower })
	if a := n.answerReadIndex(readIndexRequest{ID: "stranger", Term: term}, nil); a.Error != "not the leader" {
		t.Errorf("a request to a follower: %+v, want refused", a)
	}
}
