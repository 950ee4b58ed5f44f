package cluster

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	"github.com/hastate/hastate/api"
	"go.uber.org/zap"
)

// The bootstrap probe's timing. A round asks every peer at once; a peer
// that did not answer within the round's timeout is asked again with twice
// that timeout (a slow peer is waited for, never taken for an empty one),
// up to bootstrapProbeMaxTimeout. Between rounds the node pauses
// bootstrapRetryMin for the first bootstrapFastFor (peers of a new cluster
// start at about the same time: each bootstraps within that pause of the
// last one up, before any of them times out into an election, as when all
// bootstrapped at start), then doubling up to bootstrapRetryMax.
const (
	bootstrapFastFor         = 5 * time.Second
	bootstrapProbeTimeout    = time.Second
	bootstrapProbeMaxTimeout = 8 * time.Second
	bootstrapRetryMin        = 100 * time.Millisecond
	bootstrapRetryMax        = 2 * time.Second
	// bootstrapLogEvery is how often an unchanged wait is logged again.
	bootstrapLogEvery = 30 * time.Second
)

// bootstrap decides, for a node with no raft state (a first start, or a
// lost --data-dir), whether it bootstraps a new cluster from --peers. Raft
// runs meanwhile with no configuration: it neither votes for itself nor
// leads, and a leader of an existing cluster that has this node in its
// configuration joins it (it sends the log or a snapshot).
//
// The node bootstraps only once every other peer of --peers answers, in
// one round, that it holds no raft state either: then no cluster exists
// among them, and every node of the new one bootstraps with the same
// configuration (identical bootstraps are fine). While a peer does not
// answer (down, unreachable, slower than the round's timeout) it waits and
// asks again, saying which peer and why: a peer that is only briefly away
// may hold the cluster, and two of three empty replicas are a quorum of
// --peers, so bootstrapping then would form a second cluster. When a peer
// holds raft state the node never bootstraps (until it restarts): it waits
// to be joined. A node with no state must not bootstrap into an existing
// cluster anyway: a fresh bootstrap gives it a configuration entry at term
// 1 and no vote record, so it could grant a vote it already gave.
//
// Options.BootstrapWithout names peers an operator declared gone for good
// (docs/runbook.md, "Quorum lost for good"): their silence does not hold
// the bootstrap back. A listed peer that does answer is counted like any
// other, so one that holds state still prevents the bootstrap.
func (n *Node) bootstrap(r *raft.Raft, servers []raft.Server) {
	defer n.wg.Done()
	var peers []raft.Server
	for _, s := range servers {
		if string(s.ID) != n.opts.ID {
			peers = append(peers, s)
		}
	}
	timeouts := map[raft.ServerID]time.Duration{}
	start, pause := time.Now(), bootstrapRetryMin
	var (
		said    string
		saidAt  time.Time
		joining bool // a peer was seen holding the cluster
	)
	for {
		if n.holdsRaftState() {
			n.setBootstrapWait("", nil)
			n.log.Info("raft state received from a leader: this replica joined the cluster, not bootstrapping")
			return
		}
		if !joining {
			w := n.bootstrapRound(peers, timeouts)
			switch {
			case len(w.holder) > 0:
				// Never bootstrap once a peer was seen holding the
				// cluster, even if it later seems empty or gone: wait
				// to be joined.
				st := w.holder[0].st
				n.log.Warn("no raft state in --data-dir but a peer holds the cluster: not bootstrapping; waiting for its leader to send this replica the log or a snapshot",
					zap.String("peer_id", st.ID), zap.String("peer_state", st.State), zap.Uint64("peer_applied_index", st.AppliedIndex))
				n.setBootstrapWait(fmt.Sprintf("no raft state yet: peer %s holds the cluster, so this replica does not bootstrap; it waits for the cluster's leader to send it the log or a snapshot (check that the leader reaches this replica's raft port)", st.ID), nil)
				joining = true
			case len(w.waiting) == 0:
				err := r.BootstrapCluster(raft.Configuration{Servers: servers}).Error()
				n.setBootstrapWait("", nil)
				if errors.Is(err, raft.ErrCantBootstrap) {
					// A peer's leader sent the configuration meanwhile.
					n.log.Info("raft state received from a leader: this replica joined the cluster, not bootstrapping")
					return
				} else if err != nil {
					n.log.Warn("raft bootstrap", zap.Error(err))
				}
				fields := []zap.Field{zap.Int("servers", len(servers))}
				if len(w.without) > 0 {
					fields = append(fields, zap.Strings("without", w.ids(w.without)), zap.String("without_why", w.why(w.without)))
				}
				n.log.Info("raft bootstrapped", fields...)
				return
			default:
				detail := w.detail()
				n.setBootstrapWait(detail, w.ids(w.waiting))
				if detail != said || time.Since(saidAt) > bootstrapLogEvery {
					n.log.Warn("no raft state in --data-dir: not bootstrapping until every peer of --peers answers that it holds no raft state either",
						zap.Strings("waiting_for", w.ids(w.waiting)), zap.String("why", w.why(w.waiting)))
					said, saidAt = detail, time.Now()
				}
			}
		}
		select {
		case <-n.stop:
			return
		case <-time.After(pause):
		}
		if time.Since(start) > bootstrapFastFor {
			pause = min(2*pause, bootstrapRetryMax)
		}
	}
}

// bootstrapRound asks every peer once and sorts the answers.
func (n *Node) bootstrapRound(peers []raft.Server, timeouts map[raft.ServerID]time.Duration) bootstrapWait {
	var w bootstrapWait
	for _, p := range n.probePeers(peers, timeouts) {
		switch {
		case p.holds:
			w.holder = append(w.holder, p)
		case p.empty:
		case slices.Contains(n.opts.BootstrapWithout, p.id):
			w.without = append(w.without, p)
		default:
			w.waiting = append(w.waiting, p)
		}
	}
	return w
}

// peerProbe is one peer's answer to the bootstrap probe.
type peerProbe struct {
	id    string
	st    api.PeerStatus
	holds bool   // it answered that it holds raft state
	empty bool   // it answered that it holds none
	why   string // neither: why this node cannot tell
	slow  bool   // it did not answer within the round's timeout
}

// probePeers asks every peer for its status at once. A peer that timed
// out is given twice the time in the next round (timeouts, by ID).
func (n *Node) probePeers(peers []raft.Server, timeouts map[raft.ServerID]time.Duration) []peerProbe {
	out := make([]peerProbe, len(peers))
	var wg sync.WaitGroup
	for i, s := range peers {
		timeout := cmp.Or(timeouts[s.ID], bootstrapProbeTimeout)
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := peerProbe{id: string(s.ID)}
			st, err := n.stream.QueryStatus(n.dialAddress(s), timeout)
			switch {
			case err != nil && isTimeout(err):
				p.why = fmt.Sprintf("did not answer within %s (%v)", timeout, err)
				p.slow = true
			case err != nil:
				p.why = fmt.Sprintf("unreachable at %s: %v", n.dialAddress(s), err)
			case st.ID != string(s.ID):
				p.why = fmt.Sprintf("%s answers as node %q, not %q (check --peers)", n.dialAddress(s), st.ID, s.ID)
			case st.HoldsRaftState != nil && *st.HoldsRaftState && st.RaftLastIndex <= 1:
				// It bootstrapped from --peers too, or was sent that
				// configuration, and nothing more: no leader was ever
				// elected (a leader's first entry follows it), so
				// nothing was committed. A new cluster is forming from
				// the same list: bootstrapping the same configuration is
				// what receiving it would give.
				p.st, p.empty = st, true
			case st.HoldsRaftState != nil:
				p.st, p.holds, p.empty = st, *st.HoldsRaftState, !*st.HoldsRaftState
			case st.AppliedIndex > 0 || st.State == stateName(raft.Leader):
				// An older release does not say; what it says shows state.
				p.st, p.holds = st, true
			default:
				p.why = "runs an older release, which does not say whether it holds raft state (it may: wait until it has a leader, or upgrade it)"
			}
			out[i] = p
		}()
	}
	wg.Wait()
	for i, s := range peers {
		if out[i].slow {
			timeouts[s.ID] = min(2*cmp.Or(timeouts[s.ID], bootstrapProbeTimeout), bootstrapProbeMaxTimeout)
		}
	}
	return out
}

func isTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}

// bootstrapWait is one round's outcome.
type bootstrapWait struct {
	holder, waiting, without []peerProbe
}

func (bootstrapWait) ids(ps []peerProbe) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.id)
	}
	return out
}

func (bootstrapWait) why(ps []peerProbe) string {
	var parts []string
	for _, p := range ps {
		parts = append(parts, p.id+" "+p.why)
	}
	return strings.Join(parts, "; ")
}

// detail is the readiness detail while the node waits for peers.
func (w bootstrapWait) detail() string {
	return "no raft state, and not bootstrapping while a peer of --peers may hold the cluster: waiting for " + w.why(w.waiting) +
		". It bootstraps once every peer answers that it holds no raft state either; a peer gone for good: see docs/runbook.md \"Quorum lost for good\" (--bootstrap-without)"
}

// holdsRaftState reports whether this node holds raft state: it had some
// in --data-dir, bootstrapped, or was sent a log entry, a snapshot or a
// term by a leader or candidate (raft persists the term before answering).
func (n *Node) holdsRaftState() bool {
	return n.hadState || n.raft.LastIndex() > 0 || n.raft.CurrentTerm() > 0
}

// setBootstrapWait records why the node does not bootstrap yet ("": it
// does not wait) and which peers it waits for, for readiness and metrics.
func (n *Node) setBootstrapWait(detail string, peers []string) {
	n.bootMu.Lock()
	defer n.bootMu.Unlock()
	n.bootDetail, n.bootPeers = detail, peers
}

// bootstrapWaiting returns why the node does not bootstrap yet ("": it
// does not wait) and the peers it waits for.
func (n *Node) bootstrapWaiting() (string, []string) {
	n.bootMu.Lock()
	defer n.bootMu.Unlock()
	return n.bootDetail, n.bootPeers
}
