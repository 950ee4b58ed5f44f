package api

import (
	"fmt"
	"strings"
	"time"
)

// MirrorReason is why a replica can or cannot mirror Consul into raft: the
// typed answer to "may this replica lead the mirror?". Every part that
// knows a reason sets it (the probe: Consul unreachable, not Consul, the
// token; the recorded source: another cluster, another prefix); the leader
// hands leadership to a follower whose reason is MirrorOK, and readiness,
// /v1/cluster, the status page, the hastate_mirror_verdict metric and the
// logs name it.
type MirrorReason string

// The reasons. Their strings are the metric's reason label and the JSON
// of /v1/cluster; keep them stable.
const (
	// MirrorOK: this replica reads the recorded Consul cluster and prefix
	// (or none is recorded yet) and its last check of them succeeded.
	MirrorOK MirrorReason = "ok"
	// MirrorConsulUnreachable: the last check of Consul failed (no
	// connection, an error status, no Consul leader).
	MirrorConsulUnreachable MirrorReason = "consul_unreachable"
	// MirrorNotConsul: what answers at the Consul address is not Consul's
	// KV endpoint (an answer without Consul's index and leader headers:
	// a proxy, a load balancer with no route, another service).
	MirrorNotConsul MirrorReason = "not_consul"
	// MirrorOtherCluster: this replica's Consul is another cluster than
	// the one recorded in raft (a wiped or rebuilt Consul, a DR cluster
	// before its restore, another cluster's agent, another namespace or
	// partition). Adopting it takes the operator's hastate adopt-consul.
	MirrorOtherCluster MirrorReason = "other_cluster"
	// MirrorOtherPrefix: this replica runs with another --kv-prefix than
	// the one recorded in raft.
	MirrorOtherPrefix MirrorReason = "other_prefix"
	// MirrorTokenCannotRead: the Consul token may not read the prefix (a
	// direct read answers 403, or Consul filtered the listing).
	MirrorTokenCannotRead MirrorReason = "token_cannot_read"
)

// MirrorReasons lists every reason, for metrics that show each one.
func MirrorReasons() []MirrorReason {
	return []MirrorReason{MirrorOK, MirrorConsulUnreachable, MirrorNotConsul, MirrorOtherCluster, MirrorOtherPrefix, MirrorTokenCannotRead}
}

// MirrorVerdict is a replica's answer to "can it mirror?": the reason, what
// it found (Detail, for operators: what differs, what to do), and since
// when the reason holds (zero when unknown).
type MirrorVerdict struct {
	Reason MirrorReason `json:"reason"`
	Detail string       `json:"detail,omitempty"`
	Since  time.Time    `json:"since,omitzero"`
}

// CanMirror reports whether the verdict lets the replica lead the mirror.
func (v MirrorVerdict) CanMirror() bool { return v.Reason == MirrorOK }

// Identity reports whether the reason concerns which Consul or prefix the
// replica reads (another cluster, another prefix): no wait makes it right,
// so a leader hands over at once rather than after --kv-failover-after.
func (v MirrorVerdict) Identity() bool {
	return v.Reason == MirrorOtherCluster || v.Reason == MirrorOtherPrefix
}

func (v MirrorVerdict) String() string {
	if v.Detail == "" {
		return string(v.Reason)
	}
	return string(v.Reason) + ": " + v.Detail
}

// Verdict is the member's mirror verdict; a release before 0.15.0 sends
// only ConsulReachable, read as MirrorOK or MirrorConsulUnreachable.
func (s PeerStatus) Verdict() MirrorVerdict {
	switch {
	case s.Mirror != nil:
		return *s.Mirror
	case s.ConsulReachable:
		return MirrorVerdict{Reason: MirrorOK, Detail: "reported by a release that only says whether it reaches Consul"}
	default:
		return MirrorVerdict{Reason: MirrorConsulUnreachable}
	}
}

// MirrorSource is the Consul cluster and prefix a mirror is tied to: what
// the raft leader records with the mirrored state, and what each replica's
// Consul is compared with before it may apply a read.
type MirrorSource struct {
	// ClusterID is the Consul cluster's own ID (from its Connect CA
	// trust domain, the same on every agent of a cluster and kept across
	// a snapshot restore); empty when Consul does not say (Connect off).
	ClusterID string `json:"cluster_id,omitempty"`
	// Datacenter is the agent's datacenter (empty when unknown).
	Datacenter string `json:"datacenter,omitempty"`
	// Servers are the Consul servers' raft addresses, sorted and
	// comma-separated: what tells two clusters apart when neither says
	// its ClusterID.
	Servers string `json:"servers,omitempty"`
	// Namespace and Partition are the Consul Enterprise namespace and
	// admin partition the replica reads (empty: the default ones).
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
	if s.ClusterID == "" && s.Servers != "" {
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

// Differs says how s, a replica's Consul, differs from rec, the recorded
// one: MirrorOK when it is the same cluster and prefix, else
// MirrorOtherPrefix or MirrorOtherCluster with what differs. The cluster
// is the same when both ClusterIDs are known and equal, or, when either
// is unknown, when they share a Consul server (two clusters never do; a
// server being replaced can make the lists differ for a moment); the
// datacenter, namespace and partition must match where both know them.
func (s MirrorSource) Differs(rec MirrorSource) (MirrorReason, string) {
	if s.Prefix != rec.Prefix {
		return MirrorOtherPrefix, fmt.Sprintf("this replica reads prefix %q, the mirror in raft is of %q", s.Prefix, rec.Prefix)
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
		return MirrorOK, ""
	}
	return MirrorOtherCluster, "this replica's Consul is another cluster than the one recorded in raft: " + strings.Join(diff, "; ")
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

// MirrorError is an error that carries a mirror verdict: the cluster's
// refusal to apply a read from another cluster or prefix, so that the
// watch that got it reports the reason, not only its text.
type MirrorError struct{ Verdict MirrorVerdict }

func (e *MirrorError) Error() string { return "cannot mirror: " + e.Verdict.String() }
