package cluster

// This file holds the adapters through which the node hands its parts
// what they need of raft and of the raft port: each part declares the
// small interface it uses (confirm.Raft, confirm.Transport, leader.Peers).

import (
	"crypto/x509"
	"time"

	"github.com/hashicorp/raft"
	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/cluster/confirm"
	"github.com/hastate/hastate/cluster/raftport"
)

// raftView is raft as confirmed reads see it.
type raftView struct{ *raft.Raft }

var _ confirm.Raft = raftView{}

func (v raftView) Configuration() ([]raft.Server, error) {
	f := v.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, err
	}
	return f.Configuration().Servers, nil
}

// portTransport is the raft port as confirmed reads see it.
type portTransport struct{ *raftport.Layer }

var _ confirm.Transport = portTransport{}

func (p portTransport) LineConn() confirm.LineConn { return p.Layer.LineConn() }

func (p portTransport) Status(addr string, timeout time.Duration) (confirm.Status, error) {
	st, err := p.QueryStatus(addr, timeout)
	return confirm.Status{ID: st.ID, Leader: st.State == stateName(raft.Leader), State: st.State, StateIndex: st.StateIndex}, err
}

// lineQueries are the queries the raft port answers line by line:
// confirmed reads' read index and acknowledgements (none while the node
// plays a release before them: Options.legacyReadIndex).
func (n *Node) lineQueries() map[string]raftport.LineHandler {
	if n.opts.legacyReadIndex {
		return nil
	}
	return map[string]raftport.LineHandler{
		confirm.ReadIndexQuery: func(peer *x509.Certificate, line string) (any, bool) { return n.reads.ServeReadIndex(peer, line) },
		confirm.AckQuery:       func(peer *x509.Certificate, line string) (any, bool) { return n.reads.ServeAck(peer, line) },
	}
}

// peers is the node as the leader's duties see it.
type peers struct{ n *Node }

func (p peers) Statuses(timeout time.Duration) map[string]api.PeerStatus {
	return p.n.PeerStatuses(timeout)
}

// Seen merges every replica's sightings: the latest poll of each source.
func (p peers) Seen() map[string]time.Time {
	seen, _ := p.n.PeerSightings()
	merged := map[string]time.Time{}
	for _, s := range seen {
		for src, at := range s {
			if at.After(merged[src]) {
				merged[src] = at
			}
		}
	}
	return merged
}
