package kvsync

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/hashicorp/consul/api"
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
}

func (i Identity) String() string {
	if i.Datacenter == "" {
		return "servers " + i.Cluster
	}
	return fmt.Sprintf("datacenter %s, servers %s", i.Datacenter, i.Cluster)
}

// Same reports whether two identities name the same cluster: they share a
// server (two clusters never do; a server being replaced can make the
// lists differ for a moment), and the same datacenter where both know it.
func (i Identity) Same(o Identity) bool {
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
	return id, nil
}
