package raftport

import (
	"fmt"
	"maps"

	"github.com/hashicorp/raft"
)

// DialOverride maps server IDs to the address they are dialled at when it
// is not the one in the raft configuration (a local proxy, a sidecar). As
// raft's ServerAddressProvider an unknown ID is an error, which makes raft
// use the configured address; raft logs a warning for every error, and
// asks on every RPC (its own ID included), so NewDialOverride fills the
// map with every known server.
type DialOverride map[string]string

// NewDialOverride returns nil without overrides (raft dials the
// configured addresses); else the overrides on top of the known servers'
// addresses (ID to host:port: the initial peers and this node).
func NewDialOverride(known, overrides map[string]string) DialOverride {
	if len(overrides) == 0 {
		return nil
	}
	d := DialOverride(maps.Clone(known))
	if d == nil {
		d = DialOverride{}
	}
	maps.Copy(d, overrides)
	return d
}

// ServerAddr is raft's ServerAddressProvider.
func (d DialOverride) ServerAddr(id raft.ServerID) (raft.ServerAddress, error) {
	if a, ok := d[string(id)]; ok {
		return raft.ServerAddress(a), nil
	}
	return "", fmt.Errorf("no dial override for %s", id)
}
