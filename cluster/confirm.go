package cluster

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
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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
	next    atomic.Pointer[readNotifier]
	wakeCh  chan struct{} // buffered 1: a round is wanted
	applied chan struct{} // buffered 1: the FSM advanced
	timers  sync.Pool     // *time.Timer, so that a check does not allocate one

	okIndex   atomic.Uint64 // the index of the last confirmed round
	okAt      atomic.Int64  // unix ns of the last confirmed round (start counts)
	failSince atomic.Int64  // unix ns of the first failed round since the last success; 0: none
	lastErr   atomic.Pointer[error]
	// legacy is the leader that answered "readindex" with null (an older
	// release), asked for its status instead while it leads in that term:
	// an upgrade restarts it, so it leads again, if ever, in a later term,
	// and is asked the new way again. Only confirmLoop sets it.
	legacy atomic.Pointer[legacyLeader]
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
	if !n.conf.await(n.opts.ConfirmTimeout) {
		n.metrics.unconfirmedChecks.Inc()
		return nil
	}
	if n.withheld.any() {
		return nil
	}
	return n.fsm.serving.Load()
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
		nr.index, nr.err = n.confirmRound(began.Add(n.opts.ConfirmTimeout))
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
	if ok, hidden := n.failedLog.Allow(); ok {
		// The checks of this round are answered nothing (HAProxy keeps
		// their state); readiness fails once rounds fail for longer than
		// --leaderless-grace.
		n.log.Warn("a confirmation round failed: its checks get no answer", zap.Error(err),
			zap.Duration("took", d), zap.Int64("failed_rounds_not_logged", hidden))
	}
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
// now, in a term in which this node leads and has finished its barrier,
// confirmed by a quorum of voters that acknowledge that term after the
// round began (confirmLeadership, ack.go), as the state index that holds
// it (readIndexTarget). A leader that has not finished the barrier of its
// term may not yet know the commit index of the terms before (raft's
// rule: a leader commits nothing of an earlier term until an entry of its
// own is committed).
func (n *Node) leaderReadIndex(deadline time.Time) (uint64, error) {
	term := n.raft.CurrentTerm()
	if n.barrierTerm.Load() != term {
		return 0, errLeaderNotReady
	}
	commit := n.raft.CommitIndex()
	if n.raft.State() != raft.Leader || n.raft.CurrentTerm() != term {
		return 0, fmt.Errorf("lost leadership in term %d", term)
	}
	if err := n.confirmLeadership(term, deadline); err != nil {
		return 0, err
	}
	return n.readIndexTarget(commit)
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
func (n *Node) readIndexTarget(commit uint64) (uint64, error) {
	have := n.fsm.index.Load()
	var l raft.Log
	for i := commit; i > have; i-- {
		if err := n.logs.GetLog(i, &l); err != nil {
			first, ferr := n.logs.FirstIndex()
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
	if old := n.conf.legacy.Load(); old == nil || old.id != id || old.term != term {
		n.conf.legacy.Store(nil)
		var ans readIndexAnswer
		err := n.ri.ask(n.stream, dial, readIndexQuery, fmt.Sprintf("%s %d\n", n.opts.ID, term), deadline, &ans)
		switch {
		case errors.Is(err, errReadIndexUnknown):
			n.conf.legacy.Store(&legacyLeader{id: id, term: term})
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
// the follower, no round of its own). In a larger configuration, or when
// the request's ID is not the one the peer's certificate names (peer is
// the certificate of a mutual TLS connection, nil on plain TCP), it
// answers the read index of its next round (ack.go, shared with its own
// checks), which began after the request arrived.
func (n *Node) answerReadIndex(req readIndexRequest, peer *x509.Certificate) readIndexAnswer {
	term := n.raft.CurrentTerm()
	switch {
	case n.raft.State() != raft.Leader:
		return readIndexAnswer{ID: n.opts.ID, Error: "not the leader"}
	case req.Term != term:
		return readIndexAnswer{ID: n.opts.ID, Error: fmt.Sprintf("term %d, not the follower's %d", term, req.Term)}
	case n.barrierTerm.Load() != term:
		return readIndexAnswer{ID: n.opts.ID, Error: errLeaderNotReady.Error()}
	}
	if n.ackIsQuorum(req.ID) && n.peerIs(peer, req.ID) {
		commit := n.raft.CommitIndex()
		if n.raft.State() != raft.Leader || n.raft.CurrentTerm() != term {
			return readIndexAnswer{ID: n.opts.ID, Error: "lost leadership"}
		}
		index, err := n.readIndexTarget(commit)
		if err != nil {
			return readIndexAnswer{ID: n.opts.ID, Error: err.Error()}
		}
		return readIndexAnswer{ID: n.opts.ID, Index: index}
	}
	nr := n.conf.next.Load()
	n.conf.wake()
	t := time.NewTimer(n.opts.ConfirmTimeout)
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
	return ackIsQuorum(cf.Configuration().Servers, n.opts.ID, id)
}

// ackIsQuorum reports whether the acknowledgement of the voter id (another
// voter than self) and self's vote make a quorum of servers.
func ackIsQuorum(servers []raft.Server, self, id string) bool {
	voter := func(x string) bool {
		return slices.ContainsFunc(servers, func(s raft.Server) bool { return string(s.ID) == x && s.Suffrage == raft.Voter })
	}
	if id == self || !voter(id) || !voter(self) {
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
func (n *Node) peerIs(cert *x509.Certificate, id string) bool {
	if cert == nil {
		return true
	}
	cf := n.raft.GetConfiguration()
	if cf.Error() != nil {
		return false
	}
	err := certIsFor(cf.Configuration().Servers, cert, id)
	if ok, _ := n.unboundLog.Allow(); err != nil && ok {
		n.log.Warn("a read-index request names a member its TLS certificate is not for; it is not taken as that member's acknowledgement (the leader confirms with its own round): give each replica a certificate for the host of its --peers address",
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

// serveReadIndex answers read-index requests on one connection, one line
// each ("<id> <term>"), until the peer closes or stays idle for
// readIndexIdle. On a mutual TLS connection the peer's certificate goes
// with each request (answerReadIndex binds the request's ID to it).
func (s *streamLayer) serveReadIndex(c net.Conn, r *bufio.Reader) {
	var peer *x509.Certificate
	if tc, ok := c.(*tls.Conn); ok {
		if certs := tc.ConnectionState().PeerCertificates; len(certs) > 0 {
			peer = certs[0]
		}
	}
	serveLines(c, r, func(line string) (any, bool) {
		var req readIndexRequest
		if _, err := fmt.Sscanf(line, "%s %d", &req.ID, &req.Term); err != nil {
			return readIndexAnswer{Error: fmt.Sprintf("read-index request %q: want \"<id> <term>\"", line)}, true
		}
		return s.readIndex(req, peer), true
	})
}

// serveLines answers each request line on a connection kept open with one
// JSON value (answer's; false: close the connection instead), until the
// peer closes or stays idle for readIndexIdle.
func serveLines(c net.Conn, r *bufio.Reader, answer func(line string) (any, bool)) {
	enc := json.NewEncoder(c)
	for {
		_ = c.SetReadDeadline(time.Now().Add(readIndexIdle))
		line, err := readLine(r, 128)
		if err != nil {
			return
		}
		v, ok := answer(line)
		if !ok {
			return
		}
		_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
		if err := enc.Encode(v); err != nil {
			return
		}
	}
}

// errReadIndexUnknown: the peer answered the read-index query with null
// (a release before it).
var errReadIndexUnknown = errors.New("the peer does not know the read-index query")

// lineConn is a connection kept open for one named query answered line
// by line (a follower's "readindex" to its leader, a leader's "ack" to a
// voter); one request at a time.
type lineConn struct {
	addr string
	c    net.Conn
	dec  *json.Decoder
}

// ask sends one request line to addr, reusing the open connection when it
// goes there (a new one starts with the query's name), and decodes the
// answer into v. An answer of null is errReadIndexUnknown: the peer runs a
// release without the query.
func (lc *lineConn) ask(s *streamLayer, addr, query, line string, deadline time.Time, v any) error {
	if lc.c != nil && lc.addr != addr {
		lc.close()
	}
	if lc.c == nil {
		c, err := s.dial(addr, connQuery, time.Until(deadline))
		if err != nil {
			return err
		}
		lc.c, lc.addr, lc.dec = c, addr, json.NewDecoder(c)
		line = query + "\n" + line
	}
	_ = lc.c.SetWriteDeadline(deadline)
	if _, err := io.WriteString(lc.c, line); err != nil {
		lc.close()
		return err
	}
	_ = lc.c.SetReadDeadline(deadline)
	var raw json.RawMessage
	if err := lc.dec.Decode(&raw); err != nil {
		lc.close() // a late answer would be taken for the next round's
		return err
	}
	if string(raw) == "null" {
		lc.close()
		return errReadIndexUnknown
	}
	return json.Unmarshal(raw, v)
}

func (lc *lineConn) close() {
	if lc.c != nil {
		lc.c.Close()
	}
	lc.c, lc.dec, lc.addr = nil, nil, ""
}
