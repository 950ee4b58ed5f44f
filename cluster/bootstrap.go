package cluster

import (
	"errors"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	"github.com/hastate/hastate/api"
	"go.uber.org/zap"
)

// bootstrapProbeTimeout bounds the status query to each peer before a node
// with no raft state decides whether to bootstrap.
const bootstrapProbeTimeout = time.Second

// bootstrap runs when the node has no raft state (a first start, or a lost
// --data-dir). Every node of a new cluster bootstraps with the same
// configuration (--peers); identical bootstraps are fine. A node whose disk
// was lost must not: its peers already hold a cluster, and a fresh
// bootstrap would give it a configuration entry at term 1 and no vote
// record, so it could grant a vote it already gave in the current term.
// So it first asks its peers over the raft port; if one of them has raft
// state (it leads, or has applied an entry), the node does not bootstrap
// and joins with an empty log: the leader still has it in its
// configuration and sends it the log or a snapshot, and the node serves
// once it has caught up (withholdCatchingUp).
func (n *Node) bootstrap(r *raft.Raft, servers []raft.Server) {
	if st, ok := n.peerWithState(servers); ok {
		n.log.Warn("no raft state in --data-dir but a peer holds the cluster: not bootstrapping; joining with an empty log, the leader sends what this replica lost",
			zap.String("peer_id", st.ID), zap.String("peer_state", st.State), zap.Uint64("peer_applied_index", st.AppliedIndex))
		return
	}
	// Identical bootstraps on several nodes are fine; an error here only
	// means another node's configuration arrived first.
	if err := r.BootstrapCluster(raft.Configuration{Servers: servers}).Error(); err != nil && !errors.Is(err, raft.ErrCantBootstrap) {
		n.log.Warn("raft bootstrap", zap.Error(err))
	}
	n.log.Info("raft bootstrapped", zap.Int("servers", len(servers)))
}

// peerWithState asks every other server for its status and returns one that
// has raft state.
func (n *Node) peerWithState(servers []raft.Server) (api.PeerStatus, bool) {
	var (
		mu    sync.Mutex
		found api.PeerStatus
		ok    bool
		wg    sync.WaitGroup
	)
	for _, s := range servers {
		if string(s.ID) == n.opts.ID {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, err := n.stream.queryStatus(n.dialAddress(s), bootstrapProbeTimeout)
			if err != nil || st.ID != string(s.ID) || (st.AppliedIndex == 0 && st.State != stateName(raft.Leader)) {
				return
			}
			mu.Lock()
			found, ok = st, true
			mu.Unlock()
		}()
	}
	wg.Wait()
	return found, ok
}
