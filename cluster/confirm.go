package cluster

// This file holds the confirmation of agent answers: linearizable reads by
// read index, as etcd's linearizableReadLoop does it. Before a replica
// answers a check, it confirms that its FSM holds every change the cluster
// committed before the check arrived:
//
//   - the leader reads its commit index, then verifies that a quorum still
//     follows it (raft's VerifyLeader: one heartbeat round);
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
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
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
	// confirmRefresh: contactLoop asks for a round when none succeeded
	// for this long, so that an idle replica knows whether it can answer.
	confirmRefresh = 250 * time.Millisecond
	// readIndexQuery is the named query a follower asks the leader for
	// its read index; the connection stays open for the next rounds.
	readIndexQuery = "readindex"
	// readIndexIdle closes a read-index connection that carried no round
	// for this long.
	readIndexIdle = 30 * time.Second
)

// Errors of a confirmation round.
var (
	errNoLeader       = errors.New("no raft leader known")
	errLeaderNotReady = errors.New("the raft leader has not yet applied the entries of its term (barrier)")
	errConfirmTimeout = errors.New("the round did not finish within --confirm-timeout")
	errConfirmStopped = errors.New("replica shutting down")
)

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
	next    atomic.Pointer[readNotifier]
	wakeCh  chan struct{} // buffered 1: a round is wanted
	applied chan struct{} // buffered 1: the FSM advanced
	timers  sync.Pool     // *time.Timer, so that a check does not allocate one

	okIndex   atomic.Uint64 // the index of the last confirmed round
	okAt      atomic.Int64  // unix ns of the last confirmed round (start counts)
	failSince atomic.Int64  // unix ns of the first failed round since the last success; 0: none
	lastErr   atomic.Pointer[error]
	// legacy is the leader that answered "readindex" with null (an older
	// release), asked for its status instead while it leads; only
	// confirmLoop uses it.
	legacy raft.ServerID
}

func (c *confirmer) init(start time.Time) {
	c.wakeCh = make(chan struct{}, 1)
	c.applied = make(chan struct{}, 1)
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

// advanced tells the loop that the FSM applied an entry.
func (c *confirmer) advanced() {
	select {
	case c.applied <- struct{}{}:
	default:
	}
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

// await waits for the next round to end, at most timeout, and reports
// whether it confirmed. It allocates nothing.
func (c *confirmer) await(timeout time.Duration) bool {
	nr := c.next.Load()
	c.wake()
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

// Confirmed returns the serving snapshot for an agent answer that arrived
// now, once a confirmation round that began after it succeeded: nil
// (answer nothing) while any withhold reason is in force, or when no round
// confirms within Options.ConfirmTimeout. It allocates nothing; it blocks
// for a round trip to the leader at most once per batch.
func (n *Node) Confirmed() *state.Snapshot {
	if n.withheld.any() {
		return nil
	}
	if n.confirmOff() {
		return n.fsm.serving.Load()
	}
	if !n.conf.await(n.opts.ConfirmTimeout) {
		n.metrics.unconfirmedChecks.Inc()
		return nil
	}
	if n.withheld.any() {
		return nil
	}
	return n.fsm.serving.Load()
}

// confirmOff reports whether this replica answers without confirmation
// (ConfirmTimeout negative: as releases before it did). Its rounds still
// run: they answer its followers' read-index requests when it leads.
func (n *Node) confirmOff() bool { return n.opts.ConfirmTimeout < 0 }

// roundTimeout bounds a round: ConfirmTimeout, or its default when
// confirmation is off here.
func (n *Node) roundTimeout() time.Duration {
	if n.confirmOff() {
		return DefaultConfirmTimeout
	}
	return n.opts.ConfirmTimeout
}

// confirmLoop runs the rounds: it waits until a round is wanted, waits the
// batching window, swaps in the next notifier and runs the round for every
// reader of the one it took.
func (n *Node) confirmLoop() {
	defer n.wg.Done()
	var window *time.Timer
	if n.opts.ConfirmWindow > 0 {
		window = time.NewTimer(time.Hour)
		window.Stop()
	}
	for {
		select {
		case <-n.stop:
			nr := n.conf.next.Swap(newReadNotifier())
			nr.err = errConfirmStopped
			close(nr.done)
			return
		case <-n.conf.wakeCh:
		}
		if window != nil {
			window.Reset(n.opts.ConfirmWindow)
			select {
			case <-n.stop:
				window.Stop()
				continue
			case <-window.C:
			}
		}
		nr := n.conf.next.Swap(newReadNotifier())
		began := time.Now()
		nr.index, nr.err = n.confirmRound(began.Add(n.roundTimeout()))
		n.noteRound(began, nr.index, nr.err)
		close(nr.done)
	}
}

// noteRound records a round's result for the withhold decision, the
// metrics and the status.
func (n *Node) noteRound(began time.Time, index uint64, err error) {
	d := time.Since(began)
	n.metrics.confirmRound.Observe(d.Seconds())
	if err == nil {
		n.metrics.confirmRounds.WithLabelValues("confirmed").Inc()
		n.conf.okIndex.Store(index)
		n.conf.okAt.Store(time.Now().UnixNano())
		n.conf.failSince.Store(0)
		n.conf.lastErr.Store(nil)
		return
	}
	n.metrics.confirmRounds.WithLabelValues("failed").Inc()
	n.conf.failSince.CompareAndSwap(0, began.UnixNano())
	n.conf.lastErr.Store(&err)
}

// confirmRound runs one round: it learns the leader's read index after the
// round began and waits, until deadline, for the FSM to serve it.
func (n *Node) confirmRound(deadline time.Time) (uint64, error) {
	var (
		index uint64
		err   error
	)
	if n.raft.State() == raft.Leader {
		index, err = n.leaderReadIndex(deadline)
	} else {
		index, err = n.followerReadIndex(deadline)
	}
	if err != nil {
		return 0, err
	}
	return index, n.waitApplied(index, deadline)
}

// leaderReadIndex is the read index on the leader: the commit index read
// now, confirmed by a quorum that still follows this node (VerifyLeader,
// read after it), as the state index that holds it (readIndexTarget). A
// leader that has not finished the barrier of its term may not yet know
// the commit index of the terms before (raft's rule: a leader commits
// nothing of an earlier term until an entry of its own is committed).
func (n *Node) leaderReadIndex(deadline time.Time) (uint64, error) {
	term := n.raft.CurrentTerm()
	if n.barrierTerm.Load() != term {
		return 0, errLeaderNotReady
	}
	commit := n.raft.CommitIndex()
	f := n.raft.VerifyLeader()
	errc := make(chan error, 1)
	go func() { errc <- f.Error() }()
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case err := <-errc:
		if err != nil {
			return 0, fmt.Errorf("verify leadership: %w", err)
		}
	case <-t.C:
		return 0, fmt.Errorf("verify leadership: %w", errConfirmTimeout)
	}
	if n.raft.CurrentTerm() != term {
		return 0, fmt.Errorf("verify leadership: term changed from %d", term)
	}
	return n.readIndexTarget(commit), nil
}

// readIndexTarget is the state index (the FSM's: the raft index of the
// last command entry applied) that a replica must serve to hold every entry
// up to commit: the last command entry at or below commit. Raft's no-op,
// barrier and configuration entries never reach the FSM, so the FSM's
// index may stay below a commit index that ends with one of them. Entries
// the log no longer holds (compacted into a snapshot) end the search: the
// commit index itself is then the target, which can only wait longer.
func (n *Node) readIndexTarget(commit uint64) uint64 {
	have := n.fsm.index.Load()
	var l raft.Log
	for i := commit; i > have; i-- {
		if err := n.logs.GetLog(i, &l); err != nil {
			return commit
		}
		if l.Type == raft.LogCommand {
			return i
		}
	}
	return min(commit, have)
}

// followerReadIndex asks the leader for its read index (the leader's next
// round) over the raft port. A leader of an older release answers the
// query with null: then its status query gives its state index, which is
// what that release's leader served (weaker: it is not verified against a
// quorum; see DESIGN.md, mixed releases).
func (n *Node) followerReadIndex(deadline time.Time) (uint64, error) {
	term := n.raft.CurrentTerm()
	addr, id := n.raft.LeaderWithID()
	if n.raft.CurrentTerm() != term {
		return 0, fmt.Errorf("term changed from %d while asking who leads", term)
	}
	if id == "" || string(id) == n.opts.ID {
		return 0, errNoLeader
	}
	dial := n.dialAddress(raft.Server{ID: id, Address: addr})
	if n.conf.legacy != id {
		ans, err := n.ri.ask(n.stream, dial, readIndexRequest{ID: n.opts.ID, Term: term}, deadline)
		switch {
		case errors.Is(err, errReadIndexUnknown):
			n.conf.legacy = id
			n.log.Info("the raft leader runs an older release without the read-index query; confirming with its status while it leads",
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
	st, err := n.stream.queryStatus(dial, time.Until(deadline))
	switch {
	case err != nil:
		return 0, fmt.Errorf("status of leader %s: %w", id, err)
	case st.ID != string(id) || st.State != stateName(raft.Leader):
		return 0, fmt.Errorf("status of leader %s: it is %s %s", id, st.ID, st.State)
	case st.StateIndex == 0:
		return 0, fmt.Errorf("status of leader %s: no state index", id)
	}
	return st.StateIndex, nil
}

// waitApplied waits until the FSM serves index, at most until deadline.
func (n *Node) waitApplied(index uint64, deadline time.Time) error {
	if n.fsm.index.Load() >= index {
		return nil
	}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	for n.fsm.index.Load() < index {
		select {
		case <-n.conf.applied:
		case <-t.C:
			return fmt.Errorf("apply index %d (at %d): %w", index, n.fsm.index.Load(), errConfirmTimeout)
		case <-n.stop:
			return errConfirmStopped
		}
	}
	return nil
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
// the follower, no heartbeat round). In a larger configuration it answers
// the read index of its next round (VerifyLeader, shared with its own
// checks), which began after the request arrived.
func (n *Node) answerReadIndex(req readIndexRequest) readIndexAnswer {
	term := n.raft.CurrentTerm()
	switch {
	case n.raft.State() != raft.Leader:
		return readIndexAnswer{ID: n.opts.ID, Error: "not the leader"}
	case req.Term != term:
		return readIndexAnswer{ID: n.opts.ID, Error: fmt.Sprintf("term %d, not the follower's %d", term, req.Term)}
	case n.barrierTerm.Load() != term:
		return readIndexAnswer{ID: n.opts.ID, Error: errLeaderNotReady.Error()}
	}
	if n.ackIsQuorum(req.ID) {
		commit := n.raft.CommitIndex()
		if n.raft.State() != raft.Leader || n.raft.CurrentTerm() != term {
			return readIndexAnswer{ID: n.opts.ID, Error: "lost leadership"}
		}
		return readIndexAnswer{ID: n.opts.ID, Index: n.readIndexTarget(commit)}
	}
	nr := n.conf.next.Load()
	n.conf.wake()
	t := time.NewTimer(n.roundTimeout())
	defer t.Stop()
	select {
	case <-nr.done:
	case <-t.C:
		return readIndexAnswer{ID: n.opts.ID, Error: errConfirmTimeout.Error()}
	}
	if nr.err != nil {
		return readIndexAnswer{ID: n.opts.ID, Error: nr.err.Error()}
	}
	return readIndexAnswer{ID: n.opts.ID, Index: nr.index}
}

// ackIsQuorum reports whether this leader's vote and the acknowledgement
// of the voter id make a quorum of the latest configuration.
func (n *Node) ackIsQuorum(id string) bool {
	cf := n.raft.GetConfiguration()
	if cf.Error() != nil {
		return false
	}
	voters, self, peer := 0, false, false
	for _, s := range cf.Configuration().Servers {
		if s.Suffrage != raft.Voter {
			continue
		}
		voters++
		self = self || string(s.ID) == n.opts.ID
		peer = peer || (string(s.ID) == id && id != n.opts.ID)
	}
	return self && peer && 2 >= voters/2+1
}

// serveReadIndex answers read-index requests on one connection, one line
// each ("<id> <term>"), until the peer closes or stays idle for
// readIndexIdle.
func (s *streamLayer) serveReadIndex(c net.Conn, r *bufio.Reader) {
	enc := json.NewEncoder(c)
	for {
		_ = c.SetReadDeadline(time.Now().Add(readIndexIdle))
		line, err := readLine(r, 128)
		if err != nil {
			return
		}
		var req readIndexRequest
		var ans readIndexAnswer
		if _, err := fmt.Sscanf(line, "%s %d", &req.ID, &req.Term); err != nil {
			ans.Error = fmt.Sprintf("read-index request %q: want \"<id> <term>\"", line)
		} else {
			ans = s.readIndex(req)
		}
		_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
		if err := enc.Encode(ans); err != nil {
			return
		}
	}
}

// errReadIndexUnknown: the peer answered the read-index query with null
// (a release before it).
var errReadIndexUnknown = errors.New("the peer does not know the read-index query")

// readIndexConn is a follower's open read-index connection to the leader
// (one round at a time: only confirmLoop uses it).
type readIndexConn struct {
	addr string
	c    net.Conn
	dec  *json.Decoder
}

// ask sends one read-index request to addr, reusing the open connection
// when it goes there, and reads the answer.
func (ri *readIndexConn) ask(s *streamLayer, addr string, req readIndexRequest, deadline time.Time) (readIndexAnswer, error) {
	var ans readIndexAnswer
	if ri.c != nil && ri.addr != addr {
		ri.close()
	}
	line := fmt.Sprintf("%s %d\n", req.ID, req.Term)
	if ri.c == nil {
		c, err := s.dial(addr, connQuery, time.Until(deadline))
		if err != nil {
			return ans, err
		}
		ri.c, ri.addr, ri.dec = c, addr, json.NewDecoder(c)
		line = readIndexQuery + "\n" + line
	}
	_ = ri.c.SetWriteDeadline(deadline)
	if _, err := io.WriteString(ri.c, line); err != nil {
		ri.close()
		return ans, err
	}
	_ = ri.c.SetReadDeadline(deadline)
	var raw json.RawMessage
	if err := ri.dec.Decode(&raw); err != nil {
		ri.close() // a late answer would be taken for the next round's
		return ans, err
	}
	if string(raw) == "null" {
		ri.close()
		return ans, errReadIndexUnknown
	}
	err := json.Unmarshal(raw, &ans)
	return ans, err
}

func (ri *readIndexConn) close() {
	if ri.c != nil {
		ri.c.Close()
	}
	ri.c, ri.dec, ri.addr = nil, nil, ""
}
