package confirm

// This file holds the fakes the unit tests of confirmed reads run on: a
// raft view whose term, state, commit index and configuration a test sets,
// an applied state, and an in-memory transport between members that a test
// can cut or silence per member. No Node, no raft, no sockets.

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/hastate/hastate/state"
)

// fakeRaft is a raft view a test drives.
type fakeRaft struct {
	mu          sync.Mutex
	state       raft.RaftState
	term        uint64
	commit      uint64
	leaderID    raft.ServerID
	leaderAddr  raft.ServerAddress
	lastContact time.Time
	servers     []raft.Server
	// verify is VerifyLeader's result (nil: confirmed at once).
	verify func() error
}

var _ Raft = (*fakeRaft)(nil)

func (f *fakeRaft) State() raft.RaftState {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.state
}

func (f *fakeRaft) CurrentTerm() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.term
}

func (f *fakeRaft) CommitIndex() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.commit
}

func (f *fakeRaft) LeaderWithID() (raft.ServerAddress, raft.ServerID) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.leaderAddr, f.leaderID
}

func (f *fakeRaft) LastContact() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lastContact
}

func (f *fakeRaft) Configuration() ([]raft.Server, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]raft.Server(nil), f.servers...), nil
}

func (f *fakeRaft) VerifyLeader() raft.Future {
	f.mu.Lock()
	v := f.verify
	f.mu.Unlock()
	if v == nil {
		return errFuture{}
	}
	return errFuture{v()}
}

// set changes the view under its lock.
func (f *fakeRaft) set(fn func(*fakeRaft)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

type errFuture struct{ err error }

func (e errFuture) Error() error { return e.err }

// fakeState is an applied state: an index and the snapshot it serves.
type fakeState struct {
	index   atomic.Uint64
	serving atomic.Pointer[state.Snapshot]
	stuck   atomic.Pointer[error]
}

var _ State = (*fakeState)(nil)

func (s *fakeState) Index() uint64            { return s.index.Load() }
func (s *fakeState) Serving() *state.Snapshot { return s.serving.Load() }
func (s *fakeState) NotUnderstood() error {
	if p := s.stuck.Load(); p != nil {
		return *p
	}
	return nil
}

// fakeNet connects members by address: a LineConn's request is answered
// by the member's handler for the query, in the asker's goroutine.
type fakeNet struct {
	mu      sync.Mutex
	members map[string]*Reads        // by address
	cut     map[string]bool          // address: requests fail at once
	silent  map[string]chan struct{} // address: requests wait until closed or their deadline
	legacy  map[string]bool          // address: answers null (an older release)
	stale   map[string]bool          // address: answers "ack" for the round before (a reply held while paused)
	asks    atomic.Int64             // requests sent
}

func newFakeNet() *fakeNet {
	return &fakeNet{members: map[string]*Reads{}, cut: map[string]bool{}, silent: map[string]chan struct{}{}, legacy: map[string]bool{}, stale: map[string]bool{}}
}

func (n *fakeNet) setCut(addr string, cut bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.cut[addr] = cut
}

// setStale makes addr answer every "ack" as if for the round before.
func (n *fakeNet) setStale(addr string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.stale[addr] = true
}

// setLegacy makes addr answer like a release before the query (null).
func (n *fakeNet) setLegacy(addr string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.legacy[addr] = true
}

// silence holds the answers of addr until the returned function is called.
func (n *fakeNet) silence(addr string) (release func()) {
	ch := make(chan struct{})
	n.mu.Lock()
	n.silent[addr] = ch
	n.mu.Unlock()
	return func() {
		n.mu.Lock()
		defer n.mu.Unlock()
		if n.silent[addr] == ch {
			delete(n.silent, addr)
			close(ch)
		}
	}
}

// releaseAll answers every request held by silence.
func (n *fakeNet) releaseAll() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for addr, ch := range n.silent {
		close(ch)
		delete(n.silent, addr)
	}
}

// transport is one member's view of the net.
type transport struct{ n *fakeNet }

var _ Transport = transport{}

func (t transport) LineConn() LineConn { return &fakeConn{n: t.n} }

func (t transport) Status(addr string, _ time.Duration) (Status, error) {
	t.n.mu.Lock()
	m, cut := t.n.members[addr], t.n.cut[addr]
	t.n.mu.Unlock()
	if m == nil || cut {
		return Status{}, fmt.Errorf("dial %s: connection refused", addr)
	}
	leads := m.raft.State() == raft.Leader
	return Status{ID: m.o.ID, Leader: leads, State: m.raft.State().String(), StateIndex: m.o.State.Index()}, nil
}

// fakeConn is a LineConn over fakeNet; open says whether a request was
// ever sent on it (a real one would have dialled).
type fakeConn struct {
	n    *fakeNet
	open bool
}

var errFakeCut = errors.New("connection refused (cut by the test)")

func (c *fakeConn) Ask(addr, query, line string, deadline time.Time, v any) (bool, error) {
	c.n.asks.Add(1)
	c.open = true
	c.n.mu.Lock()
	m, cut, silent, legacy, stale := c.n.members[addr], c.n.cut[addr], c.n.silent[addr], c.n.legacy[addr], c.n.stale[addr]
	c.n.mu.Unlock()
	switch {
	case m == nil || cut:
		c.open = false
		return true, fmt.Errorf("dial %s: %w", addr, errFakeCut)
	case legacy:
		c.open = false
		return false, nil
	}
	if silent != nil {
		t := time.NewTimer(time.Until(deadline))
		defer t.Stop()
		select {
		case <-silent:
		case <-t.C:
			c.open = false
			return true, fmt.Errorf("read from %s: i/o timeout", addr)
		}
	}
	var ans any
	var keep bool
	switch query {
	case AckQuery:
		ans, keep = m.ServeAck(nil, trimLF(line))
	case ReadIndexQuery:
		ans, keep = m.ServeReadIndex(nil, trimLF(line))
	default:
		return false, nil
	}
	if !keep {
		c.open = false
		return true, errors.New("connection closed by the peer")
	}
	switch p := v.(type) {
	case *ackAnswer:
		*p = ans.(ackAnswer)
		if stale {
			p.Seq--
		}
	case *readIndexAnswer:
		*p = ans.(readIndexAnswer)
	default:
		return true, fmt.Errorf("fakeConn: cannot decode into %T", v)
	}
	return true, nil
}

func (c *fakeConn) Close() { c.open = false }

func trimLF(s string) string {
	if len(s) > 0 && s[len(s)-1] == '\n' {
		return s[:len(s)-1]
	}
	return s
}

// member is one fake replica: its raft view, state and Reads.
type member struct {
	id    string
	addr  string
	raft  *fakeRaft
	state *fakeState
	reads *Reads
}

// cluster makes members n1..nK of one configuration (voters unless named
// in nonvoters) on one fakeNet, n1 leading in term 2 with its barrier
// done, every state at index 10 and every commit index at 10. The loops
// are not started unless loops is set: tests drive the rounds (or start
// the confirmation loop alone, startRounds).
func cluster(t *testing.T, k int, nonvoters []string, loops bool, tweak func(*Options)) (*fakeNet, []*member) {
	t.Helper()
	net := newFakeNet()
	var servers []raft.Server
	for i := 1; i <= k; i++ {
		id := fmt.Sprintf("n%d", i)
		s := raft.Server{ID: raft.ServerID(id), Address: raft.ServerAddress(id + ":9779"), Suffrage: raft.Voter}
		for _, nv := range nonvoters {
			if nv == id {
				s.Suffrage = raft.Nonvoter
			}
		}
		servers = append(servers, s)
	}
	var ms []*member
	for i, s := range servers {
		m := &member{id: string(s.ID), addr: string(s.Address), state: &fakeState{}}
		m.state.index.Store(10)
		m.raft = &fakeRaft{state: raft.Follower, term: 2, commit: 10, leaderID: servers[0].ID, leaderAddr: servers[0].Address,
			lastContact: time.Now(), servers: servers}
		if i == 0 {
			m.raft.state = raft.Leader
		}
		o := Options{ID: m.id, State: m.state, Log: raft.NewInmemStore(), Transport: transport{net}, Timeout: time.Second, AckHedge: 50 * time.Millisecond}
		if tweak != nil {
			tweak(&o)
		}
		m.reads = New(o)
		m.reads.raft = m.raft
		t.Cleanup(m.reads.Stop)
		net.mu.Lock()
		net.members[m.addr] = m.reads
		net.mu.Unlock()
		ms = append(ms, m)
	}
	ms[0].reads.BarrierDone(2)
	t.Cleanup(net.releaseAll) // first: a test that failed may leave peers silent
	if loops {
		for _, m := range ms {
			m.reads.Start(m.raft)
		}
	}
	return net, ms
}

// startRounds starts m's confirmation loop alone (no contact loop, which
// asks for rounds of its own): the test decides when rounds are wanted.
func startRounds(m *member) {
	m.reads.wg.Add(1)
	go m.reads.confirmLoop()
}
