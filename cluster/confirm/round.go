package confirm

// This file holds the confirmation of agent answers: linearizable reads by
// read index, as etcd's linearizableReadLoop does it. Before a replica
// answers a check, it confirms that its FSM holds every change the cluster
// committed before the check arrived:
//
//   - the leader reads its commit index, then confirms that a quorum of
//     voters is still in its term with a round of its own, asked after
//     the check arrived (ack.go; not raft's VerifyLeader, which replies to
//     RPCs sent before the check can satisfy);
//   - a follower asks the leader for that index over the raft port (the
//     named query "readindex", on a connection kept open), so the index is
//     learned after the check arrived; its request, in the term it follows
//     the leader, is itself an acknowledgement, so in a cluster of three
//     the leader answers it at once (answerReadIndex);
//   - either then waits until its FSM serves at least that index.
//
// The confirmation is batched: every check that arrives while a round is
// in flight shares the next round. Readers share one notifier (a channel
// closed when its round ends); the loop swaps in a fresh notifier when it
// starts a round, so a reader that took the old one arrived before the
// round read the index. A check costs no allocation: an atomic load, a
// non-blocking send, a pooled timer and a channel receive.

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"github.com/hastate/hastate/state"
	"go.uber.org/zap"
)

const (
	// DefaultConfirmTimeout is Options.ConfirmTimeout's default: how long a
	// check waits for its confirmation before it is answered nothing. A
	// round takes a loopback or LAN round trip or two (cluster/DESIGN.md
	// has the figures); HAProxy's agent-check timeout is `timeout check`,
	// else inter (2s by default).
	DefaultConfirmTimeout = 500 * time.Millisecond
	// DefaultConfirmWindow is Options.ConfirmWindow's default: after the
	// first check that wants a round, the loop waits this long for more
	// before it starts it (0: at once, as etcd does). See DESIGN.md.
	DefaultConfirmWindow = 0
	// maxRoundsInFlight bounds the pipelined rounds (confirmLoop): two let
	// a check that arrives during a round join the next one at once.
	maxRoundsInFlight = 2
	// confirmRefresh: contactLoop asks for a round when none succeeded
	// for this long, so that an idle replica knows whether it can answer.
	confirmRefresh = 250 * time.Millisecond
	// ReadIndexQuery is the named query a follower asks the leader for
	// its read index; the connection stays open for the next rounds.
	ReadIndexQuery = "readindex"
)

// Errors of a confirmation round.
var (
	errNoLeader       = errors.New("no raft leader known")
	errLeaderNotReady = errors.New("the raft leader has not yet applied the entries of its term (barrier)")
	errConfirmTimeout = errors.New("the round did not finish within --confirm-timeout")
	errConfirmStopped = errors.New("replica shutting down")
)

// legacyLeader is a leader of an older release, in the term it leads.
type legacyLeader struct {
	id   raft.ServerID
	term uint64
}

// readNotifier is one round's result, shared by every reader that waits for
// it: done is closed once err (nil: confirmed) and index are set.
type readNotifier struct {
	done  chan struct{}
	err   error
	index uint64
}

func newReadNotifier() *readNotifier { return &readNotifier{done: make(chan struct{})} }

// confirmer is a node's confirmation state: the notifier of the next round,
// the wake-up of the loop and the last results.
type confirmer struct {
	next   atomic.Pointer[readNotifier]
	wakeCh chan struct{} // buffered 1: a round is wanted
	// applied is closed, and replaced, each time the FSM advances: every
	// round waiting for its index (several, pipelined) wakes.
	applied atomic.Pointer[chan struct{}]
	timers  sync.Pool // *time.Timer, so that a check does not allocate one
	// noteMu orders the results of rounds that end out of order.
	noteMu sync.Mutex

	okIndex   atomic.Uint64 // the index of the last confirmed round
	okAt      atomic.Int64  // unix ns of the last confirmed round (start counts)
	failSince atomic.Int64  // unix ns of the first failed round since the last success; 0: none
	okBegan   int64         // unix ns the last confirmed round began (under noteMu)
	lastErr   atomic.Pointer[error]
	// rounds counts the rounds begun.
	rounds atomic.Uint64
	// legacy is the leader that answered "readindex" with null (an older
	// release), asked for its status instead while it leads in that term:
	// an upgrade restarts it, so it leads again, if ever, in a later term,
	// and is asked the new way again. Only confirmLoop sets it.
	legacy atomic.Pointer[legacyLeader]
}

func (c *confirmer) init(start time.Time) {
	c.wakeCh = make(chan struct{}, 1)
	applied := make(chan struct{})
	c.applied.Store(&applied)
	c.next.Store(newReadNotifier())
	c.okAt.Store(start.UnixNano())
	c.timers.New = func() any {
		t := time.NewTimer(time.Hour)
		t.Stop()
		return t
	}
}

// wake asks for a round; it never blocks.
func (c *confirmer) wake() {
	select {
	case c.wakeCh <- struct{}{}:
	default:
	}
}

// advanced tells the rounds waiting for an index that the FSM applied an
// entry (called after the FSM's index moved).
func (c *confirmer) advanced() {
	next := make(chan struct{})
	close(*c.applied.Swap(&next))
}

// lastConfirmed returns the last confirmed index and when it was confirmed.
func (c *confirmer) lastConfirmed() (uint64, time.Time) {
	return c.okIndex.Load(), time.Unix(0, c.okAt.Load())
}

// lastError is why the last round failed (nil after a success).
func (c *confirmer) lastError() error {
	if p := c.lastErr.Load(); p != nil {
		return *p
	}
	return nil
}

// failingFor is how long rounds have failed (0: the last one succeeded).
func (c *confirmer) failingFor(now time.Time) time.Duration {
	s := c.failSince.Load()
	if s == 0 {
		return 0
	}
	return max(now.Sub(time.Unix(0, s)), 0)
}

// arrive takes a check's place in the rounds: the notifier of the next
// round to begin (which the loop swaps out when that round begins, so it
// begins after this load), and asks for that round. It allocates nothing.
func (c *confirmer) arrive() *readNotifier {
	nr := c.next.Load()
	c.wake()
	return nr
}

// await waits, at most timeout, for the round of nr (arrive's) to end and
// reports whether it confirmed. It allocates nothing.
func (c *confirmer) await(nr *readNotifier, timeout time.Duration) bool {
	t := c.timers.Get().(*time.Timer)
	t.Reset(timeout)
	defer c.timers.Put(t)
	defer t.Stop()
	select {
	case <-nr.done:
		return nr.err == nil
	case <-t.C:
		return false
	}
}

// Arrival is a check's place in the confirmation rounds, taken when it
// arrived (Arrived): the rounds that began after that may confirm its
// answer, no earlier one. Its zero value arrives when it is confirmed.
// It is one pointer, so it goes into an interface value without
// allocating.
type Arrival struct{ nr *readNotifier }

// Arrived takes the place of a check that arrives now (the agent server:
// when its connection is accepted, before its request is read) and asks
// for a round, so that the round runs while the request is read. A check
// is invoked before its connection is accepted, so a round that begins
// after this call began after the check: ConfirmedSince waits for the
// next round to begin after it, never one in flight. While an answer is
// withheld it asks for nothing (the zero Arrival). It allocates nothing.
func (rs *Reads) Arrived() Arrival {
	if rs.withheld.bits.Load() != 0 {
		return Arrival{}
	}
	return Arrival{rs.conf.arrive()}
}

// Confirmed returns the serving snapshot for an agent answer that arrived
// now, once a confirmation round that began after it succeeded
// (ConfirmedSince of an arrival taken now).
func (rs *Reads) Confirmed() *state.Snapshot { return rs.ConfirmedSince(Arrival{}) }

// ConfirmedSince returns the serving snapshot for an agent answer that
// arrived at a (Arrived; the zero Arrival: now), once a confirmation round
// that began after a succeeded: nil (answer nothing) while any withhold
// reason is in force, or when no such round confirms within
// Options.ConfirmTimeout from now. It allocates nothing; it blocks for a
// round trip to the leader at most once per batch.
func (rs *Reads) ConfirmedSince(a Arrival) *state.Snapshot {
	if b := rs.withheld.bits.Load(); b != 0 {
		rs.m.withheldCheck(b)
		return nil
	}
	nr := a.nr
	if nr == nil {
		nr = rs.conf.arrive()
	}
	if !rs.conf.await(nr, rs.o.Timeout) {
		rs.m.unconfirmedChecks.Inc()
		rs.m.withheldChecks[withheldTimeout].Inc()
		return nil
	}
	if b := rs.withheld.bits.Load(); b != 0 {
		rs.m.withheldCheck(b)
		return nil
	}
	s := rs.o.State.Serving()
	if s == nil {
		rs.m.withheldChecks[withheldNoState].Inc()
	}
	return s
}

// confirmLoop runs the rounds: maxRoundsInFlight workers (roundWorker),
// each of which waits until a round is wanted, waits the batching window,
// swaps in the next notifier and runs the round for every reader of the
// one it took. Rounds are pipelined: a round may begin while earlier ones
// are in flight (at most maxRoundsInFlight at once, one per worker), so a
// check that arrives during a round waits for the next one to begin, not
// for the one in flight to end first. A check never joins a round that
// began before it arrived: it waits on the notifier that the next round's
// start swaps out. At stop the checks waiting for the next round are
// answered errConfirmStopped.
func (rs *Reads) confirmLoop() {
	defer rs.wg.Done()
	rs.wg.Add(maxRoundsInFlight)
	for range maxRoundsInFlight {
		go rs.roundWorker()
	}
	<-rs.stop
	nr := rs.conf.next.Swap(newReadNotifier())
	nr.err = errConfirmStopped
	close(nr.done)
}

// roundWorker runs one round at a time, each when one is wanted (a
// goroutine that lives as long as the loop: a goroutine per round cost
// its creation and the growth of its stack, every round).
func (rs *Reads) roundWorker() {
	defer rs.wg.Done()
	var window *time.Timer
	if rs.o.Window > 0 {
		window = time.NewTimer(time.Hour)
		window.Stop()
	}
	for {
		select {
		case <-rs.stop:
			return
		case <-rs.conf.wakeCh:
		}
		if window != nil {
			window.Reset(rs.o.Window)
			select {
			case <-rs.stop:
				window.Stop()
				return
			case <-window.C:
			}
		}
		nr := rs.conf.next.Swap(newReadNotifier())
		rs.conf.rounds.Add(1)
		began := time.Now()
		nr.index, nr.err = rs.confirmRound(began.Add(rs.o.Timeout))
		rs.noteRound(began, nr.index, nr.err)
		close(nr.done)
	}
}

// noteRound records a round's result for the withhold decision, the
// metrics and the status.
func (rs *Reads) noteRound(began time.Time, index uint64, err error) {
	d := time.Since(began)
	rs.m.confirmRound.Observe(d.Seconds())
	rs.conf.noteMu.Lock()
	defer rs.conf.noteMu.Unlock()
	if err == nil {
		rs.m.roundsConfirmed.Inc()
		// Rounds may end out of order: the highest index confirmed.
		rs.conf.okIndex.Store(max(rs.conf.okIndex.Load(), index))
		rs.conf.okBegan = max(rs.conf.okBegan, began.UnixNano())
		rs.conf.okAt.Store(time.Now().UnixNano())
		rs.conf.failSince.Store(0)
		rs.conf.lastErr.Store(nil)
		return
	}
	rs.m.roundsFailed.Inc()
	if began.UnixNano() < rs.conf.okBegan {
		return // a round that began before the last confirmed one: it says nothing newer
	}
	rs.conf.failSince.CompareAndSwap(0, began.UnixNano())
	rs.conf.lastErr.Store(&err)
	if ok, hidden := rs.failedLog.Allow(); ok {
		// The checks of this round are answered nothing (HAProxy keeps
		// their state); readiness fails once rounds fail for longer than
		// --leaderless-grace.
		rs.log.Warn("a confirmation round failed: its checks get no answer", zap.Error(err),
			zap.Duration("took", d), zap.Int64("failed_rounds_not_logged", hidden))
	}
}

// confirmRound runs one round: it learns the leader's read index after the
// round began and waits, until deadline, for the FSM to serve it.
func (rs *Reads) confirmRound(deadline time.Time) (uint64, error) {
	var (
		index uint64
		err   error
	)
	if rs.raft.State() == raft.Leader {
		index, err = rs.leaderReadIndex(deadline)
	} else {
		index, err = rs.followerReadIndex(deadline)
	}
	if err != nil {
		return 0, err
	}
	return index, rs.waitApplied(index, deadline)
}

// leaderReadIndex is the read index on the leader: the commit index read
// now, in a term in which this node leads and has finished its barrier,
// confirmed by a quorum of voters that acknowledge that term after the
// round began (confirmLeadership, ack.go), as the state index that holds
// it (readIndexTarget). A leader that has not finished the barrier of its
// term may not yet know the commit index of the terms before (raft's
// rule: a leader commits nothing of an earlier term until an entry of its
// own is committed).
func (rs *Reads) leaderReadIndex(deadline time.Time) (uint64, error) {
	term := rs.raft.CurrentTerm()
	if rs.barrierTerm.Load() != term {
		return 0, errLeaderNotReady
	}
	commit := rs.raft.CommitIndex()
	if rs.raft.State() != raft.Leader || rs.raft.CurrentTerm() != term {
		return 0, fmt.Errorf("lost leadership in term %d", term)
	}
	if err := rs.confirmLeadership(term, deadline); err != nil {
		return 0, err
	}
	return rs.readIndexTarget(commit)
}

// readIndexTarget is the state index (the FSM's: the raft index of the
// last command entry applied) that a replica must serve to hold every entry
// up to commit: the last command entry at or below commit. Raft's no-op,
// barrier and configuration entries never reach the FSM, so the FSM's
// index may stay below a commit index that ends with one of them.
//
// An entry the log no longer holds (below its first index: compacted into
// a snapshot this node took or installed) was applied to this node's FSM
// with everything before it, so the last command at or below it is at or
// below the FSM's index, and the search ends there: the FSM's index is the
// target. (A replica restored from a snapshot taken at a barrier leads
// with a log of only its no-op and barrier after it; taking the commit
// index then asked every replica for an index no command would reach
// until the next write.) An entry missing above the log's first index is
// a store fault: the round fails.
func (rs *Reads) readIndexTarget(commit uint64) (uint64, error) {
	have := rs.o.State.Index()
	var l raft.Log
	for i := commit; i > have; i-- {
		if err := rs.o.Log.GetLog(i, &l); err != nil {
			first, ferr := rs.o.Log.FirstIndex()
			if ferr == nil && (first == 0 || i < first) {
				return have, nil
			}
			return 0, fmt.Errorf("read index: raft log entry %d (log from %d): %w", i, first, err)
		}
		if l.Type == raft.LogCommand {
			return i, nil
		}
	}
	return min(commit, have), nil
}

// followerReadIndex asks the leader for its read index (the leader's next
// round) over the raft port. A leader of an older release answers the
// query with null: then its status query gives its state index, which is
// what that release's leader served (weaker: it is not verified against a
// quorum; see DESIGN.md, mixed releases).
func (rs *Reads) followerReadIndex(deadline time.Time) (uint64, error) {
	term := rs.raft.CurrentTerm()
	addr, id := rs.raft.LeaderWithID()
	if rs.raft.CurrentTerm() != term {
		return 0, fmt.Errorf("term changed from %d while asking who leads", term)
	}
	if id == "" || string(id) == rs.o.ID {
		return 0, errNoLeader
	}
	dial := rs.dial(raft.Server{ID: id, Address: addr})
	if old := rs.conf.legacy.Load(); old == nil || old.id != id || old.term != term {
		rs.conf.legacy.Store(nil)
		var ans readIndexAnswer
		var known bool
		err := rs.withReadIndexConn(deadline, func(ri LineConn) error {
			var err error
			known, err = ri.Ask(dial, ReadIndexQuery, requestLine(rs.o.ID, term), deadline, &ans)
			return err
		})
		switch {
		case !known:
			rs.conf.legacy.Store(&legacyLeader{id: id, term: term})
			rs.log.Info("the raft leader runs an older release without the read-index query; confirming with its status while it leads",
				zap.String("leader_id", string(id)))
		case err != nil:
			return 0, fmt.Errorf("read index from leader %s: %w", id, err)
		case ans.Error != "":
			return 0, fmt.Errorf("read index from leader %s: %s", id, ans.Error)
		case ans.ID != string(id):
			return 0, fmt.Errorf("read index: %s answered for %q, not as the leader", id, ans.ID)
		default:
			return ans.Index, nil
		}
	}
	st, err := rs.o.Transport.Status(dial, time.Until(deadline))
	switch {
	case err != nil:
		return 0, fmt.Errorf("status of leader %s: %w", id, err)
	case st.ID != string(id) || !st.Leader:
		return 0, fmt.Errorf("status of leader %s: it is %s %s", id, st.ID, st.State)
	case st.StateIndex == 0:
		return 0, fmt.Errorf("status of leader %s: no state index", id)
	}
	return st.StateIndex, nil
}

// withReadIndexConn runs ask with one of the follower's kept-open
// read-index connections to its leader (one per round in flight), waiting
// for one until deadline.
func (rs *Reads) withReadIndexConn(deadline time.Time, ask func(LineConn) error) error {
	select {
	case ri := <-rs.ri: // there is one per round in flight: the usual case
		defer func() { rs.ri <- ri }()
		return ask(ri)
	default:
	}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case ri := <-rs.ri:
		defer func() { rs.ri <- ri }()
		return ask(ri)
	case <-t.C:
		return fmt.Errorf("no read-index connection free: %w", errConfirmTimeout)
	case <-rs.stop:
		return errConfirmStopped
	}
}

// waitApplied waits until the FSM serves index, at most until deadline.
func (rs *Reads) waitApplied(index uint64, deadline time.Time) error {
	if rs.o.State.Index() >= index {
		return nil
	}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	for {
		// The channel before the index: an advance after this load
		// closes it.
		applied := *rs.conf.applied.Load()
		if rs.o.State.Index() >= index {
			return nil
		}
		select {
		case <-applied:
		case <-t.C:
			return fmt.Errorf("apply index %d (at %d): %w", index, rs.o.State.Index(), errConfirmTimeout)
		case <-rs.stop:
			return errConfirmStopped
		}
	}
}

// readIndexAnswer is the leader's answer to one read-index request.
type readIndexAnswer struct {
	ID    string `json:"id"`
	Index uint64 `json:"index,omitempty"`
	Error string `json:"error,omitempty"`
}

// readIndexRequest is a follower's read-index request: who asks, and the
// term in which it follows the leader it asks (read after its check
// arrived; it has voted in no later term).
type readIndexRequest struct {
	ID   string
	Term uint64
}

// answerReadIndex is the leader's side. The follower's request is itself
// an acknowledgement of this leader in its term, given after the checks
// it confirms arrived: no leader of a later term can have committed
// anything before it without the follower's vote. With this leader's own
// vote that is a quorum when the configuration has at most three voters,
// so the leader answers its commit index at once (one round trip for
// the follower, no round of its own). In a larger configuration, or when
// the request's ID is not the one the peer's certificate names (peer is
// the certificate of a mutual TLS connection, nil on plain TCP), it
// answers the read index of its next round (ack.go, shared with its own
// checks), which began after the request arrived.
func (rs *Reads) answerReadIndex(req readIndexRequest, peer *x509.Certificate) readIndexAnswer {
	term := rs.raft.CurrentTerm()
	switch {
	case rs.raft.State() != raft.Leader:
		return readIndexAnswer{ID: rs.o.ID, Error: "not the leader"}
	case req.Term != term:
		return readIndexAnswer{ID: rs.o.ID, Error: fmt.Sprintf("term %d, not the follower's %d", term, req.Term)}
	case rs.barrierTerm.Load() != term:
		return readIndexAnswer{ID: rs.o.ID, Error: errLeaderNotReady.Error()}
	}
	if rs.ackIsQuorum(req.ID) && rs.peerIs(peer, req.ID) {
		commit := rs.raft.CommitIndex()
		if rs.raft.State() != raft.Leader || rs.raft.CurrentTerm() != term {
			return readIndexAnswer{ID: rs.o.ID, Error: "lost leadership"}
		}
		index, err := rs.readIndexTarget(commit)
		if err != nil {
			return readIndexAnswer{ID: rs.o.ID, Error: err.Error()}
		}
		return readIndexAnswer{ID: rs.o.ID, Index: index}
	}
	nr := rs.conf.next.Load()
	rs.conf.wake()
	t := time.NewTimer(rs.o.Timeout)
	defer t.Stop()
	select {
	case <-nr.done:
	case <-t.C:
		return readIndexAnswer{ID: rs.o.ID, Error: errConfirmTimeout.Error()}
	}
	if nr.err != nil {
		return readIndexAnswer{ID: rs.o.ID, Error: nr.err.Error()}
	}
	return readIndexAnswer{ID: rs.o.ID, Index: nr.index}
}

// ackIsQuorum reports whether this leader's vote and the acknowledgement
// of the voter id make a quorum of the latest configuration.
func (rs *Reads) ackIsQuorum(id string) bool {
	servers, err := rs.raft.Configuration()
	if err != nil {
		return false
	}
	return ackIsQuorum(servers, rs.o.ID, id)
}

// ackIsQuorum reports whether the acknowledgement of the voter id (another
// voter than self) and self's vote make a quorum of servers. (A self that
// is not a voter needs no check here: isQuorum counts voters only.)
func ackIsQuorum(servers []raft.Server, self, id string) bool {
	voter := slices.ContainsFunc(servers, func(s raft.Server) bool { return string(s.ID) == id && s.Suffrage == raft.Voter })
	if id == self || !voter {
		return false
	}
	return isQuorum(servers, map[raft.ServerID]bool{raft.ServerID(self): true, raft.ServerID(id): true})
}

// peerIs reports whether a read-index request that says it comes from id
// may count as id's acknowledgement: on plain TCP (cert nil) the ID is
// taken as given (anyone who reaches the port can send raft RPCs anyway);
// with mutual TLS the certificate must be valid for the host of id's
// address in the raft configuration (the name its peers dial, which the
// README requires as its SAN). A request whose ID is not bound is still
// answered, from the leader's own round; the mismatch is logged.
func (rs *Reads) peerIs(cert *x509.Certificate, id string) bool {
	if cert == nil {
		return true
	}
	servers, err := rs.raft.Configuration()
	if err != nil {
		return false
	}
	err = certIsFor(servers, cert, id)
	if ok, _ := rs.unboundLog.Allow(); err != nil && ok {
		rs.log.Warn("a read-index request names a member its TLS certificate is not for; it is not taken as that member's acknowledgement (the leader confirms with its own round): give each replica a certificate for the host of its --peers address",
			zap.String("peer_id", id), zap.Error(err))
	}
	return err == nil
}

// certIsFor reports whether cert is valid for the host of id's address in
// servers (nil), or why not.
func certIsFor(servers []raft.Server, cert *x509.Certificate, id string) error {
	for _, s := range servers {
		if string(s.ID) == id {
			return certNamesHost(cert, string(s.Address))
		}
	}
	return fmt.Errorf("%q is not a member", id)
}

// certNamesHost reports whether cert is valid for the host of address (a
// DNS name or an IP, as x509's VerifyHostname matches SANs).
func certNamesHost(cert *x509.Certificate, address string) error {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		host = address
	}
	return cert.VerifyHostname(host)
}

// ServeReadIndex answers one read-index request line ("<id> <term>") of
// a connection kept open (the transport's line handler for
// ReadIndexQuery). peer is the certificate of a mutual TLS connection
// (nil on plain TCP): answerReadIndex binds the request's ID to it.
func (rs *Reads) ServeReadIndex(peer *x509.Certificate, line string) (any, bool) {
	var req readIndexRequest
	var err error
	if req.ID, err = parseRequestLine(line, &req.Term); err != nil {
		return readIndexAnswer{Error: fmt.Sprintf("read-index request %q: want \"<id> <term>\"", line)}, true
	}
	return rs.answerReadIndex(req, peer), true
}
