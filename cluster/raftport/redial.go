package raftport

import (
	"errors"
	"net"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// redialEvery is how often a leader tries again to reach a follower it
// cannot dial (see PatientTransport).
const redialEvery = 50 * time.Millisecond

// PatientTransport is raft's NetworkTransport with two changes. The leader
// keeps trying to reach a follower that cannot be dialled, every
// redialEvery, instead of letting raft back off.
//
// Why: raft's replication to a follower backs off after each failed
// AppendEntries, doubling from 10ms up to 10.24s (replication.go,
// maxFailureScale 12), and only a success resets it. A follower down for
// more than a few seconds (killed, or stopped while its pod is
// rescheduled) piles up failures, so when it comes back the leader's next
// AppendEntries may be up to 10s away. Heartbeats back off at most to half
// the heartbeat timeout, so the follower learns at once who leads, but a
// heartbeat carries no commit index: the restarted follower applies
// nothing, cannot reach the leader's state index and withholds
// (catching_up). That was the ~10s of silence after `scripts/demo.sh
// restart` of a replica that had been killed a while before; a quick
// SIGTERM-and-start piled up few failures and answered in about a second.
//
// So an AppendEntries that replicates the log (a heartbeat is left to
// raft: it carries no commit index and no entries) and fails because the
// follower cannot be dialled is retried here until the dial succeeds, this
// node no longer leads in the request's term, the follower left the
// configuration, or raft shuts down. Raft sees one slow RPC instead of a
// string of failures, and the first AppendEntries after the follower is
// back leaves within redialEvery. Retrying is what raft would do itself;
// the request is the same (raft does not change it while it waits).
//
// The cost: while a follower is down, one refused connect per redialEvery
// from the leader, and a leadership transfer that picks that follower
// fails after the election timeout rather than at once (raft picks the
// most up-to-date follower, and the transfer waits for its replication).
//
// The second: raft's heartbeat fast path runs behind a guard that
// StopHeartbeats closes (heartbeat.go), so that no heartbeat writes to the
// raft store once it is closed.
type PatientTransport struct {
	*raft.NetworkTransport
	raft atomic.Pointer[Leading] // set once raft runs (SetRaft); nil: no retries
	hb   heartbeatGuard
}

// Leading is what PatientTransport asks raft (a *raft.Raft): whether this
// node still leads in a term, and its configuration.
type Leading interface {
	State() raft.RaftState
	CurrentTerm() uint64
	GetConfiguration() raft.ConfigurationFuture
}

// SetRaft hands the transport the raft it carries, once raft runs.
func (t *PatientTransport) SetRaft(r Leading) { t.raft.Store(&r) }

func (t *PatientTransport) AppendEntries(id raft.ServerID, target raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	for {
		err := t.NetworkTransport.AppendEntries(id, target, args, resp)
		if err == nil || isHeartbeat(args) || !isDialError(err) || !t.stillReplicating(id, args.Term) {
			return err
		}
		time.Sleep(redialEvery)
		if !t.stillReplicating(id, args.Term) {
			return err
		}
	}
}

// isHeartbeat: raft's heartbeats carry only the header and the term.
func isHeartbeat(a *raft.AppendEntriesRequest) bool {
	return len(a.Entries) == 0 && a.PrevLogEntry == 0 && a.LeaderCommitIndex == 0
}

// isDialError: the connection could not be opened (refused, unreachable,
// no such host, dial timeout); an error on an open connection is not one.
func isDialError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// stillReplicating: this node leads in term and id is in its configuration.
func (t *PatientTransport) stillReplicating(id raft.ServerID, term uint64) bool {
	p := t.raft.Load()
	if p == nil {
		return false
	}
	r := *p
	if r.State() != raft.Leader || r.CurrentTerm() != term {
		return false
	}
	f := r.GetConfiguration()
	if f.Error() != nil {
		return false
	}
	for _, s := range f.Configuration().Servers {
		if s.ID == id {
			return true
		}
	}
	return false
}
