package confirm

import (
	"cmp"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"github.com/hastate/hastate/internal/ratelog"
	"github.com/hastate/hastate/state"
	"go.uber.org/zap"
)

// Raft is the view of raft that confirmed reads need: a *raft.Raft
// through the node's adapter, or a fake in tests.
type Raft interface {
	State() raft.RaftState
	CurrentTerm() uint64
	CommitIndex() uint64
	LeaderWithID() (raft.ServerAddress, raft.ServerID)
	// LastContact is the last contact with a leader (zero: none).
	LastContact() time.Time
	// Configuration is the latest configuration's servers.
	Configuration() ([]raft.Server, error)
	// VerifyLeader is raft's own check (the fallback of a round that
	// needs a voter of an older release; see ack.go).
	VerifyLeader() raft.Future
}

// Log is what the read index reads of the raft log (a raft.LogStore).
type Log interface {
	GetLog(index uint64, log *raft.Log) error
	FirstIndex() (uint64, error)
}

// State is the replica's applied state (the FSM).
type State interface {
	// Index is the raft index of the last entry the serving snapshot
	// holds.
	Index() uint64
	// Serving is the serving snapshot (nil: no state).
	Serving() *state.Snapshot
	// NotUnderstood is why the replica met an entry it cannot apply
	// (nil: none).
	NotUnderstood() error
}

// Status is what confirmed reads need of a member's status query.
type Status struct {
	ID         string
	Leader     bool   // it leads
	State      string // its raft state, for messages
	StateIndex uint64 // Index of its State
}

// Transport is how confirmed reads reach the other members: the raft
// port's named queries (raftport.Layer through the node's adapter).
type Transport interface {
	// LineConn returns a new connection, closed until asked, for a named
	// query answered line by line.
	LineConn() LineConn
	// Status asks the member at addr for its status.
	Status(addr string, timeout time.Duration) (Status, error)
}

// LineConn is a connection kept open for one named query answered line by
// line, one request at a time (raftport.LineConn).
type LineConn interface {
	// Ask sends line (with its LF) to addr and decodes the answer into v;
	// known is false when the peer answered null (a release without the
	// query).
	Ask(addr, query, line string, deadline time.Time, v any) (known bool, err error)
	Close()
}

// DefaultGrace is Options.Grace's default: a leader heartbeats many times
// a second and a failover takes about 2s.
const DefaultGrace = 3 * time.Second

// Options configure Reads. Required: ID, State, Log, Transport.
type Options struct {
	ID        string // this member's raft server ID
	State     State
	Log       Log
	Transport Transport
	// Dial is the address to dial a member at (nil: its configured
	// address).
	Dial func(id raft.ServerID, addr raft.ServerAddress) string
	// Timeout (0: DefaultConfirmTimeout) is how long a check waits for its
	// round; Window (0: none) how long the loop waits after the first check
	// that wants a round before it starts it; Grace (0: DefaultGrace) how old the last
	// leader contact, or the first of a run of failed rounds, may grow
	// before every answer is withheld; AckHedge (0: 2ms) how long the
	// leader's round waits for the voters it asked first.
	Timeout, Window, Grace, AckHedge time.Duration
	// Started is when the replica started (its grace runs from it).
	Started time.Time
	Logger  *zap.Logger // nil: no logs
}

// Reads confirms agent answers (linearizable reads by read index: this
// file's siblings) and decides whether the replica answers at all (the
// withhold reasons). Make it with New, hand it raft with Start, stop it
// with Stop.
type Reads struct {
	o    Options
	raft Raft
	log  *zap.Logger
	m    *metrics

	// withheld is the set of reasons not to answer (withhold.go);
	// withheldSince is when each reason last came into force.
	withheld      withholdSet
	withheldSince [maxWithholdReasons]atomic.Int64
	// leaderContact is when this node last had contact with a leader
	// (unix nanoseconds, kept by contactLoop); barrierTerm is the term in
	// which this node, as leader, last completed its barrier.
	leaderContact atomic.Int64
	barrierTerm   atomic.Uint64
	// ledUntil is when this node last lost leadership (unix nanoseconds;
	// 0: never led).
	ledUntil atomic.Int64
	// conf is the confirmation of answers (round.go); ri is the
	// follower's open read-index connections to the leader (one per round in
	// flight);
	// acks and ackSeq are the leader's "ack" connections to its voters and
	// the number of its last round (ack.go); unboundLog limits the log of
	// read-index requests whose ID their certificate does not name,
	// failedLog that of failed rounds.
	conf       confirmer
	ri         chan LineConn
	acks       ackConns
	ackSeq     atomic.Uint64
	unboundLog *ratelog.Limiter
	failedLog  *ratelog.Limiter

	stop     chan struct{}
	wg       sync.WaitGroup
	started  atomic.Bool
	stopOnce sync.Once
}

// New returns Reads that withhold every answer until the replica has
// caught up with a leader (catching_up).
func New(o Options) *Reads {
	o.Timeout = cmp.Or(o.Timeout, DefaultConfirmTimeout)
	o.Grace = cmp.Or(o.Grace, DefaultGrace)
	o.AckHedge = cmp.Or(o.AckHedge, ackHedge)
	if o.Started.IsZero() {
		o.Started = time.Now()
	}
	if o.Dial == nil {
		o.Dial = func(_ raft.ServerID, addr raft.ServerAddress) string { return string(addr) }
	}
	rs := &Reads{o: o, log: cmp.Or(o.Logger, zap.NewNop()), m: newMetrics(), stop: make(chan struct{}),
		unboundLog: ratelog.New(10*time.Second, nil), failedLog: ratelog.New(10*time.Second, nil)}
	rs.m.rs = rs
	rs.ri = make(chan LineConn, maxRoundsInFlight)
	for range maxRoundsInFlight {
		rs.ri <- o.Transport.LineConn()
	}
	rs.leaderContact.Store(o.Started.UnixNano())
	rs.conf.init(o.Started)
	// Nothing is answered until the node has caught up with a leader.
	rs.withheld.set(withholdCatchingUp, true)
	rs.withheldSince[bitIndex(withholdCatchingUp)].Store(o.Started.UnixNano())
	return rs
}

// Start hands Reads the raft it confirms with and starts the confirmation
// and contact loops. The answers to peers (ServeReadIndex, ServeAck) and
// Confirmed may be asked only after Start.
func (rs *Reads) Start(r Raft) {
	rs.raft = r
	rs.started.Store(true)
	rs.wg.Add(2)
	go rs.confirmLoop()
	go rs.contactLoop()
}

// Stop stops the loops and the rounds in flight and closes the
// connections to the other members. Safe to call more than once, and
// without Start.
func (rs *Reads) Stop() {
	rs.stopOnce.Do(func() {
		close(rs.stop)
		rs.wg.Wait()
		for range maxRoundsInFlight {
			(<-rs.ri).Close()
		}
		rs.acks.close()
	})
}

// dial is where to dial the server s.
func (rs *Reads) dial(s raft.Server) string { return rs.o.Dial(s.ID, s.Address) }

// BarrierDone records that this node, as leader, completed the barrier of
// term: its FSM holds every entry committed before its leadership, so its
// commit index may be answered in that term.
func (rs *Reads) BarrierDone(term uint64) { rs.barrierTerm.Store(term) }

// BarrierTerm is the term of the last barrier BarrierDone recorded.
func (rs *Reads) BarrierTerm() uint64 { return rs.barrierTerm.Load() }

// LostLeadership records when this node stopped leading (its last
// contact with a leader, itself).
func (rs *Reads) LostLeadership(at time.Time) { rs.ledUntil.Store(at.UnixNano()) }

// Advanced tells the confirmation loop that the FSM applied an entry; it
// never blocks.
func (rs *Reads) Advanced() { rs.conf.advanced() }

// NotUnderstood withholds every answer from now on: the FSM met an entry
// it does not understand (err says which).
func (rs *Reads) NotUnderstood(err error) { rs.withhold(withholdNotUnderstood, true, zap.Error(err)) }

// Withholding reports whether any withhold reason is in force.
func (rs *Reads) Withholding() bool { return rs.withheld.any() }

// CaughtUp reports whether the replica has caught up with a leader since
// it started and since it was last cut off.
func (rs *Reads) CaughtUp() bool { return !rs.withheld.has(withholdCatchingUp) }

// Labels are the metric labels of the withhold reasons in force.
func (rs *Reads) Labels() []string { return rs.withheld.labels() }

// LastError is why the last confirmation round failed (nil after a
// success).
func (rs *Reads) LastError() error { return rs.conf.lastError() }

// FailingSince is when the confirmation rounds began to fail, every one
// since (zero: the last one confirmed).
func (rs *Reads) FailingSince() time.Time {
	if fs := rs.conf.failSince.Load(); fs != 0 {
		return time.Unix(0, fs)
	}
	return time.Time{}
}

// Rounds is the number of confirmation rounds begun so far.
func (rs *Reads) Rounds() uint64 { return rs.conf.rounds.Load() }

// LegacyLeader is the leader of an older release this follower confirms
// with through its status, in the term it leads ("": none).
func (rs *Reads) LegacyLeader() string {
	if l := rs.conf.legacy.Load(); l != nil {
		return string(l.id)
	}
	return ""
}
