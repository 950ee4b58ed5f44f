package state

// This file holds the source of the mirror: the Consul cluster and the KV
// prefix it is tied to. The raft leader records it with the mirrored
// state (a level-3 entry, see LevelRecorded) and applies a read only from
// that same cluster and prefix.

import (
	"fmt"
	"strings"
)

// MirrorSource names a Consul cluster and a KV prefix.
type MirrorSource struct {
	// ClusterID is the Consul cluster's own ID (its Connect CA trust
	// domain's UUID: the same on every agent of a cluster, kept across a
	// snapshot restore); empty when Consul does not say (Connect off).
	ClusterID string `json:"cluster_id,omitempty"`
	// Datacenter is the agent's datacenter (empty when unknown).
	Datacenter string `json:"datacenter,omitempty"`
	// Servers are the Consul servers' raft addresses, sorted and
	// comma-separated: what tells two clusters apart when either does
	// not say its ClusterID.
	Servers string `json:"servers,omitempty"`
	// Namespace and Partition are the Consul Enterprise namespace and
	// admin partition read (empty: the default ones).
	Namespace string `json:"namespace,omitempty"`
	Partition string `json:"partition,omitempty"`
	// Prefix is the KV prefix (--kv-prefix).
	Prefix string `json:"prefix"`
}

func (s MirrorSource) String() string {
	var parts []string
	if s.ClusterID != "" {
		parts = append(parts, "cluster "+s.ClusterID)
	}
	if s.Datacenter != "" {
		parts = append(parts, "datacenter "+s.Datacenter)
	}
	if s.Servers != "" {
		parts = append(parts, "servers "+s.Servers)
	}
	if s.Namespace != "" {
		parts = append(parts, "namespace "+s.Namespace)
	}
	if s.Partition != "" {
		parts = append(parts, "partition "+s.Partition)
	}
	parts = append(parts, fmt.Sprintf("prefix %q", s.Prefix))
	return strings.Join(parts, ", ")
}

// SourceDiff is how a source differs from the recorded one.
type SourceDiff int

// The ways a source can differ.
const (
	SameSource SourceDiff = iota
	OtherPrefix
	OtherCluster
)

// Compare says how s, a replica's Consul and prefix, differs from rec, the
// recorded one, and what differs. The cluster is the same when both
// ClusterIDs are known and equal or, when either is unknown, when they
// share a Consul server (two clusters never do; a server being replaced
// can make the lists differ for a moment). The datacenter must match
// where both know it, the namespace and partition always.
func (s MirrorSource) Compare(rec MirrorSource) (SourceDiff, string) {
	if s.Prefix != rec.Prefix {
		return OtherPrefix, fmt.Sprintf("this replica reads prefix %q, the mirror in raft is of %q", s.Prefix, rec.Prefix)
	}
	var diff []string
	switch {
	case s.ClusterID != "" && rec.ClusterID != "":
		if s.ClusterID != rec.ClusterID {
			diff = append(diff, fmt.Sprintf("cluster ID %s, recorded %s", s.ClusterID, rec.ClusterID))
		}
	case !shareServer(s.Servers, rec.Servers):
		diff = append(diff, fmt.Sprintf("servers %s, recorded %s", orNone(s.Servers), orNone(rec.Servers)))
	}
	if s.Datacenter != "" && rec.Datacenter != "" && s.Datacenter != rec.Datacenter {
		diff = append(diff, fmt.Sprintf("datacenter %s, recorded %s", s.Datacenter, rec.Datacenter))
	}
	if s.Namespace != rec.Namespace {
		diff = append(diff, fmt.Sprintf("namespace %q, recorded %q", s.Namespace, rec.Namespace))
	}
	if s.Partition != rec.Partition {
		diff = append(diff, fmt.Sprintf("partition %q, recorded %q", s.Partition, rec.Partition))
	}
	if len(diff) == 0 {
		return SameSource, ""
	}
	return OtherCluster, "this replica's Consul is another cluster than the one recorded in raft: " + strings.Join(diff, "; ")
}

func shareServer(a, b string) bool {
	theirs := strings.Split(b, ",")
	for _, s := range strings.Split(a, ",") {
		for _, t := range theirs {
			if s != "" && s == t {
				return true
			}
		}
	}
	return false
}

func orNone(s string) string {
	if s == "" {
		return "(none known)"
	}
	return s
}
