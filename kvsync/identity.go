package kvsync

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/hashicorp/consul/api"
	"github.com/hastate/hastate/state"
)

// Identity names the Consul cluster a client reads, so that the CLI can
// check that a replica reads the same one as the write (DESIGN.md,
// Operator commands). Both come from endpoints that need no ACL token
// beyond what any client has: the raft peers of the Consul servers
// (/v1/status/peers: the same list from every agent of one cluster, and
// distinct clusters have distinct servers), and the datacenter the agent
// reports (/v1/agent/self, empty when the token may not read it).
type Identity struct {
	Datacenter string
	Cluster    string // the Consul servers' raft addresses, sorted, comma-separated
	// ClusterID is the cluster's own ID, from its Connect CA's trust
	// domain (/v1/connect/ca/roots, which needs no ACL): the same on
	// every agent of the cluster and across a snapshot restore; empty
	// when Connect is off.
	ClusterID string
}

func (i Identity) String() string {
	s := "servers " + i.Cluster
	if i.Datacenter != "" {
		s = fmt.Sprintf("datacenter %s, servers %s", i.Datacenter, i.Cluster)
	}
	if i.ClusterID != "" {
		s = "cluster " + i.ClusterID + ", " + s
	}
	return s
}

// Same reports whether two identities name the same cluster: they share a
// server (two clusters never do; a server being replaced can make the
// lists differ for a moment), and the same datacenter where both know it.
func (i Identity) Same(o Identity) bool {
	if i.ClusterID != "" && o.ClusterID != "" {
		return i.ClusterID == o.ClusterID && (i.Datacenter == "" || o.Datacenter == "" || i.Datacenter == o.Datacenter)
	}
	if i.Datacenter != "" && o.Datacenter != "" && i.Datacenter != o.Datacenter {
		return false
	}
	theirs := strings.Split(o.Cluster, ",")
	for _, s := range strings.Split(i.Cluster, ",") {
		if s != "" && slices.Contains(theirs, s) {
			return true
		}
	}
	return false
}

// ReadIdentity reads the identity of the Consul cluster c talks to.
func ReadIdentity(ctx context.Context, c *api.Client) (Identity, error) {
	peers, err := c.Status().PeersWithQueryOptions((&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return Identity{}, fmt.Errorf("read the Consul servers (/v1/status/peers): %w", err)
	}
	if len(peers) == 0 {
		return Identity{}, fmt.Errorf("Consul names no servers (/v1/status/peers is empty): it has no leader yet")
	}
	slices.Sort(peers)
	id := Identity{Cluster: strings.Join(peers, ",")}
	var self struct{ Config struct{ Datacenter string } }
	if _, err := c.Raw().Query("/v1/agent/self", &self, (&api.QueryOptions{}).WithContext(ctx)); err == nil {
		id.Datacenter = self.Config.Datacenter
	}
	var roots struct{ TrustDomain string }
	if _, err := c.Raw().Query("/v1/connect/ca/roots", &roots, (&api.QueryOptions{}).WithContext(ctx)); err == nil {
		id.ClusterID = strings.TrimSuffix(roots.TrustDomain, ".consul")
	} else if ctx.Err() != nil {
		return Identity{}, fmt.Errorf("read the Consul cluster ID (/v1/connect/ca/roots): %w", err)
	}
	return id, nil
}

// Source is the mirror source of a replica that reads prefix, in
// namespace and partition, from the Consul cluster id names.
func (i Identity) Source(prefix, namespace, partition string) state.MirrorSource {
	return state.MirrorSource{ClusterID: i.ClusterID, Datacenter: i.Datacenter, Servers: i.Cluster, Namespace: namespace, Partition: partition, Prefix: prefix}
}

// Scope returns the Consul Enterprise namespace and admin partition a
// client for addr reads (CONSUL_NAMESPACE, CONSUL_PARTITION; empty: the
// defaults).
func Scope(addr string) (namespace, partition string) {
	cfg := ClientConfig(addr)
	return cfg.Namespace, cfg.Partition
}
