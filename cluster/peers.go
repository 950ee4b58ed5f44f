package cluster

import (
	"fmt"
	"net"
	"strings"
)

// Peer is one member of the initial cluster configuration.
type Peer struct {
	ID      string
	Address string // host:port, a DNS name or an IP
}

// ParsePeers parses --peers: "id=host:port,id=host:port,...". Empty input
// gives no peers (a one-node cluster of the node itself).
func ParsePeers(s string) ([]Peer, error) {
	var out []Peer
	seen := map[string]bool{}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		id, addr, ok := strings.Cut(part, "=")
		if !ok || id == "" || addr == "" {
			return nil, fmt.Errorf("peer %q: want id=host:port, e.g. --peers hastate-0=hastate-0.hastate:9779,hastate-1=hastate-1.hastate:9779", part)
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return nil, fmt.Errorf("peer %q: address %q: want host:port", part, addr)
		}
		if seen[id] {
			return nil, fmt.Errorf("peer id %q listed twice in --peers", id)
		}
		seen[id] = true
		out = append(out, Peer{ID: id, Address: addr})
	}
	return out, nil
}
