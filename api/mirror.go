package api

import (
	"time"

	"github.com/hastate/hastate/state"
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

// MirrorSource is the Consul cluster and prefix a mirror is tied to (see
// state.MirrorSource): what the raft leader records with the mirrored state.
type MirrorSource = state.MirrorSource

// SourceVerdict is the verdict of a replica that reads s when rec is
// recorded in raft: MirrorOK, MirrorOtherPrefix or MirrorOtherCluster with
// what differs and what to do.
func SourceVerdict(s, rec MirrorSource) MirrorVerdict {
	switch d, detail := s.Compare(rec); d {
	case state.OtherPrefix:
		return MirrorVerdict{Reason: MirrorOtherPrefix, Detail: detail + ": start this replica with --kv-prefix " + rec.Prefix}
	case state.OtherCluster:
		return MirrorVerdict{Reason: MirrorOtherCluster, Detail: detail +
			": point this replica at the recorded Consul cluster, or, if this Consul is the one to mirror from now on (restored or rebuilt), adopt it with hastate adopt-consul (docs/runbook.md)"}
	}
	return MirrorVerdict{Reason: MirrorOK}
}

// MirrorError is an error that carries a mirror verdict: the cluster's
// refusal to apply a read from another cluster or prefix, so that the
// watch that got it reports the reason, not only its text.
type MirrorError struct{ Verdict MirrorVerdict }

func (e *MirrorError) Error() string { return "cannot mirror: " + e.Verdict.String() }

// AdoptError is the answer of POST /v1/consul/adopt, which adopts
// nothing: Code is the HTTP status (410), Message says what to do instead
// (the adoption marker, hastate adopt-consul). Before issue 43 the
// endpoint adopted, unauthenticated, and answered with it when it refused.
type AdoptError struct {
	Code     int    `json:"code"`
	Message  string `json:"error"`
	LeaderID string `json:"leader_id,omitempty"`
}

func (e *AdoptError) Error() string { return e.Message }
