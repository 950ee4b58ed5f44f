package confirm

// This file holds the leader's own confirmation round: before the leader
// answers from its commit index, a quorum of voters acknowledges, after the
// round began, that it is still in the leader's term (etcd's
// linearizableReadLoop sends its heartbeat round with a read-state context
// for the same reason). Each voter's acknowledgement is its answer to the
// named query "ack" ("<leader id> <term> <seq>"), on a connection kept open
// per peer; the answer carries the voter's current term and the round's
// sequence number, so an answer to an earlier round (a reply held in a
// buffer while the leader was paused) never counts for a later one.
//
// Why not raft's VerifyLeader: in hashicorp/raft v1.7.3 a VerifyLeader
// future is registered with every follower's replication (verifyLeader in
// raft.go adds it to repl.notify) and credited by the next successful
// reply on either of its goroutines (heartbeat and replicate call
// s.notifyAll(true) after any successful RPC, replication.go), including
// a reply to an RPC sent before the future was registered. A leader
// paused longer than the election timeout resumes with such replies in
// its socket buffers, from before the new leader's election: they satisfy
// a VerifyLeader asked after the pause although a newer leader has
// committed since (TestPausedLeaderNeverConfirmsWithOldReplies holds those
// replies and shows it).
//
// Why one term is enough: a voter whose current term is T when it answers
// has voted in no later term until then. A leader of a later term needs a
// quorum of votes, and every quorum shares a voter with this leader's
// quorum of acknowledgements (itself included, whose term was T when the
// round read the commit index). So no later leader was elected, let alone
// committed anything, before the round began, and the commit index read in
// term T after the check arrived holds everything committed before it.

import (
	"crypto/x509"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"go.uber.org/zap"
)

const (
	// AckQuery is the named query a leader asks its voters for their term.
	AckQuery = "ack"
	// legacyRecheck is how long a peer that answered a query with null
	// (an older release) is asked the older way before it is asked again
	// (it may have been upgraded meanwhile).
	legacyRecheck = 30 * time.Second
	// ackHedge is how long a round waits for the peers asked first (as
	// many as a quorum needs, the one that confirmed the last round among
	// them) before it asks the others too; a peer that fails is replaced
	// at once. Asking only what a quorum needs halves the followers' ack
	// work in a cluster of three (cluster/DESIGN.md, the leader's round).
	ackHedge = 2 * time.Millisecond
)

// ackRequest is a leader's acknowledgement request: who asks, in which
// term, for which round.
type ackRequest struct {
	ID   string
	Term uint64
	Seq  uint64
}

// ackAnswer is a voter's answer: who answers, its current term (read when
// the request arrived) and the round's sequence number.
type ackAnswer struct {
	ID   string `json:"id"`
	Term uint64 `json:"term"`
	Seq  uint64 `json:"seq"`
}

// answerAck is a voter's side: its current term, read now.
func (rs *Reads) answerAck(req ackRequest) ackAnswer {
	return ackAnswer{ID: rs.o.ID, Term: rs.raft.CurrentTerm(), Seq: req.Seq}
}

// isQuorum reports whether the voters acked (self among them, which the
// caller includes when its own vote counts) make a quorum of servers'
// voters. Non-voters and unknown IDs do not count; neither does self when
// it is not a voter.
func isQuorum(servers []raft.Server, acked map[raft.ServerID]bool) bool {
	voters, yes := 0, 0
	for _, s := range servers {
		if s.Suffrage != raft.Voter {
			continue
		}
		voters++
		if acked[s.ID] {
			yes++
		}
	}
	return voters > 0 && yes >= voters/2+1
}

// ackConns are the leader's open "ack" connections, maxRoundsInFlight per
// peer (one per round in flight), and the peers that answered the query
// with null (an older release): when.
type ackConns struct {
	mu        sync.Mutex
	peers     map[raft.ServerID]*peerConns
	legacy    map[raft.ServerID]time.Time
	preferred raft.ServerID // the peer whose ack made the last quorum
}

// preferredFirst moves the preferred peer to the front of peers.
func (a *ackConns) preferredFirst(peers []raft.Server) {
	a.mu.Lock()
	p := a.preferred
	a.mu.Unlock()
	for i, s := range peers {
		if s.ID == p {
			peers[0], peers[i] = peers[i], peers[0]
			break
		}
	}
}

func (a *ackConns) prefer(id raft.ServerID) {
	a.mu.Lock()
	a.preferred = id
	a.mu.Unlock()
}

// peerConns are one peer's connections: free holds those that carry no
// request (a round takes one, and gives it back once answered).
type peerConns struct {
	free chan *ackConn
	all  []*ackConn
}

// ackConn is one connection; seq is the round whose request it carries
// (0: none).
type ackConn struct {
	lc  LineConn // nil until its first request
	seq atomic.Uint64
}

// inFlight lists the rounds whose requests the peer's connections carry.
func (p *peerConns) inFlight() []uint64 {
	var out []uint64
	for _, c := range p.all {
		if s := c.seq.Load(); s != 0 {
			out = append(out, s)
		}
	}
	slices.Sort(out)
	return out
}

func (a *ackConns) peer(id raft.ServerID) *peerConns {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.peers == nil {
		a.peers = map[raft.ServerID]*peerConns{}
	}
	p, ok := a.peers[id]
	if !ok {
		p = &peerConns{free: make(chan *ackConn, maxRoundsInFlight)}
		for range maxRoundsInFlight {
			c := &ackConn{}
			p.all = append(p.all, c)
			p.free <- c
		}
		a.peers[id] = p
	}
	return p
}

// isLegacy reports whether id answered "ack" with null less than
// legacyRecheck ago.
func (a *ackConns) isLegacy(id raft.ServerID, now time.Time) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	at, ok := a.legacy[id]
	return ok && now.Sub(at) < legacyRecheck
}

func (a *ackConns) setLegacy(id raft.ServerID, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.legacy == nil {
		a.legacy = map[raft.ServerID]time.Time{}
	}
	a.legacy[id] = now
}

// close closes every connection (shutdown; the rounds are over).
func (a *ackConns) close() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, p := range a.peers {
		for range p.all {
			c := <-p.free
			if c.lc != nil {
				c.lc.Close()
			}
			defer func() { p.free <- c }()
		}
	}
}

// ackResult is one peer's part of a round.
type ackResult struct {
	id     raft.ServerID
	ok     bool
	legacy bool
	// otherTerm is the term the peer answered when it was not the
	// round's (0: none).
	otherTerm uint64
	err       error
}

// confirmLeadership runs the leader's round in term: it asks the other
// voters of the latest configuration for their term (what a quorum needs
// at once, the rest on a failure or after the hedge) and returns once a
// quorum (this leader included) answered term, or an error when that can
// no longer happen or deadline passes. A configuration in which the
// acknowledging voters cannot make a quorum without peers of an older
// release (which answer "ack" with null) falls back to raft's VerifyLeader
// for that round, as the release before did (weaker: see the file
// comment; DESIGN.md, mixed releases), unless a voter answered another
// term than the round's: that voter has seen a newer term, and raft's
// VerifyLeader may be credited by replies from before it (a deposed
// leader's held replies), so the round fails. Whatever confirmed it, a
// round succeeds only if this node still leads in term when it ends.
func (rs *Reads) confirmLeadership(term uint64, deadline time.Time) error {
	servers, err := rs.raft.Configuration()
	if err != nil {
		return fmt.Errorf("read the raft configuration: %w", err)
	}
	acked := map[raft.ServerID]bool{raft.ServerID(rs.o.ID): true}
	if isQuorum(servers, acked) {
		return rs.stillLeads(term) // a cluster of one voter
	}
	seq := rs.ackSeq.Add(1)
	// over ends the round for its askAck goroutines that have not sent
	// their request yet (see askAck).
	over := make(chan struct{})
	defer close(over)
	now := time.Now()
	var peers []raft.Server
	legacy, voters, selfVoter := 0, 0, false
	for _, s := range servers {
		if s.Suffrage != raft.Voter {
			continue
		}
		voters++
		if string(s.ID) == rs.o.ID {
			selfVoter = true
			continue
		}
		if rs.acks.isLegacy(s.ID, now) {
			legacy++
			continue
		}
		peers = append(peers, s)
	}
	// What a quorum needs beyond this leader's own vote is asked first,
	// the peer that confirmed the last round among it: with three voters
	// that one acknowledgement alone.
	need := voters/2 + 1
	if selfVoter {
		need--
	}
	rs.acks.preferredFirst(peers)
	results := make(chan ackResult, len(peers))
	asked, next := 0, 0
	ask := func(k int) {
		for ; k > 0 && next < len(peers); k-- {
			s := peers[next]
			next++
			asked++
			rs.wg.Add(1)
			go func() {
				defer rs.wg.Done()
				results <- rs.askAck(s, ackRequest{ID: rs.o.ID, Term: term, Seq: seq}, deadline, over)
			}()
		}
	}
	ask(need)
	var hedge <-chan time.Time
	if next < len(peers) {
		t := time.NewTimer(rs.o.AckHedge)
		defer t.Stop()
		hedge = t.C
	}
	var (
		errs      []string
		otherTerm uint64 // a term another voter answered (0: none)
	)
	for answered := 0; answered < asked; {
		var r ackResult
		select {
		case <-hedge:
			hedge = nil
			ask(len(peers))
			continue
		case r = <-results:
			answered++
		}
		switch {
		case r.ok:
			acked[r.id] = true
			if isQuorum(servers, acked) {
				rs.acks.prefer(r.id)
				return rs.stillLeads(term)
			}
		case r.legacy:
			legacy++
			rs.acks.setLegacy(r.id, time.Now())
			rs.log.Info("a voter runs an older release without the ack query; the leader confirms with raft's VerifyLeader while it is needed for a quorum",
				zap.String("peer_id", string(r.id)))
			ask(1)
		default:
			if r.otherTerm != 0 {
				otherTerm = r.otherTerm
			}
			errs = append(errs, r.err.Error())
			ask(1)
		}
		if answered == asked {
			ask(len(peers)) // every request answered, no quorum yet: ask the rest now
		}
	}
	if legacy > 0 && otherTerm != 0 {
		return fmt.Errorf("confirm leadership in term %d: a voter is in term %d, so raft's VerifyLeader (the older releases' check) is not asked: %v", term, otherTerm, errs)
	}
	if legacy > 0 {
		return rs.verifyLeader(term, deadline)
	}
	return fmt.Errorf("confirm leadership in term %d: no quorum of voters acknowledged it: %v", term, errs)
}

// askAck asks one voter for its acknowledgement of this leader in
// req.Term, on one of the peer's kept-open connections (one per round in
// flight). When each carries a request of an earlier round (a slow peer),
// one is waited for, until the round is over (a quorum answered, or it
// failed) or deadline. A
// goroutine of a round that is over sends nothing: one the scheduler ran
// late would otherwise hold the connection with a request nobody waits
// for, and the next round would find both peers busy and fail (measured:
// 7–14 failed rounds per BenchmarkLeaderRoundCost run on a loaded machine
// before this; cluster/DESIGN.md).
func (rs *Reads) askAck(s raft.Server, req ackRequest, deadline time.Time, over <-chan struct{}) (r ackResult) {
	r.id = s.ID
	notSent := false // the round was over first
	defer func() {
		switch {
		case r.ok:
			rs.m.acksAcked.Inc()
		case notSent:
			rs.m.acksNotSent.Inc()
		default:
			rs.m.acksFailed.Inc()
		}
	}()
	p := rs.acks.peer(s.ID)
	var c *ackConn
	select {
	case c = <-p.free:
	default:
		inFlight := p.inFlight()
		t := time.NewTimer(time.Until(deadline))
		defer t.Stop()
		select {
		case c = <-p.free:
		case <-over:
			notSent = true
			r.err = fmt.Errorf("%s: round %d was over before a request of rounds %v on its connections was answered", s.ID, req.Seq, inFlight)
			return r
		case <-t.C:
			r.err = fmt.Errorf("%s: the requests of rounds %v were still in flight at round %d's deadline", s.ID, inFlight, req.Seq)
			return r
		}
	}
	defer func() {
		c.seq.Store(0)
		p.free <- c
	}()
	select {
	case <-over:
		notSent = true
		r.err = fmt.Errorf("%s: round %d was over before its request was sent", s.ID, req.Seq)
		return r
	default:
	}
	c.seq.Store(req.Seq)
	var ans ackAnswer
	if c.lc == nil {
		c.lc = rs.o.Transport.LineConn()
	}
	known, err := c.lc.Ask(rs.dial(s), AckQuery, requestLine(req.ID, req.Term, req.Seq), deadline, &ans)
	switch {
	case !known:
		r.legacy = true
	case err != nil:
		r.err = fmt.Errorf("%s: %w", s.ID, err)
	case ans.ID != string(s.ID) || ans.Seq != req.Seq:
		c.lc.Close()
		r.err = fmt.Errorf("%s answered as %q for round %d, not as itself for round %d", s.ID, ans.ID, ans.Seq, req.Seq)
	case ans.Term != req.Term:
		r.otherTerm = ans.Term
		r.err = fmt.Errorf("%s is in term %d, not %d", s.ID, ans.Term, req.Term)
	default:
		r.ok = true
	}
	return r
}

// verifyLeader is raft's VerifyLeader, bounded by deadline, in term.
func (rs *Reads) verifyLeader(term uint64, deadline time.Time) error {
	f := rs.raft.VerifyLeader()
	errc := make(chan error, 1)
	go func() { errc <- f.Error() }() // resolved by raft at the latest at shutdown
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case err := <-errc:
		if err != nil {
			return fmt.Errorf("verify leadership: %w", err)
		}
	case <-t.C:
		return fmt.Errorf("verify leadership: %w", errConfirmTimeout)
	}
	return rs.stillLeads(term)
}

// stillLeads is nil when this node leads in term now: a confirmation (a
// quorum's acknowledgements, raft's VerifyLeader) counts only then.
func (rs *Reads) stillLeads(term uint64) error {
	switch cur := rs.raft.CurrentTerm(); {
	case cur != term:
		return fmt.Errorf("confirm leadership: the term changed from %d to %d during the round", term, cur)
	case rs.raft.State() != raft.Leader:
		return fmt.Errorf("confirm leadership: no longer the leader in term %d", term)
	}
	return nil
}

// ServeAck answers one "ack" request line ("<leader id> <term> <seq>")
// of a connection kept open (the transport's line handler for AckQuery).
// A malformed request closes the connection: nothing anyone could take
// for an acknowledgement is sent.
func (rs *Reads) ServeAck(_ *x509.Certificate, line string) (any, bool) {
	var req ackRequest
	var err error
	if req.ID, err = parseRequestLine(line, &req.Term, &req.Seq); err != nil {
		return nil, false
	}
	return rs.answerAck(req), true
}
