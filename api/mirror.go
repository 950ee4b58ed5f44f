package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
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

// AdoptRequest is the body of POST /v1/consul/adopt: Cluster is the ID of
// the Consul cluster to adopt (its servers, for a Consul without Connect),
// as the operator saw it in /v1/cluster; the leader refuses if its Consul
// is another.
type AdoptRequest struct {
	Cluster string `json:"cluster"`
}

// AdoptResult is what POST /v1/consul/adopt answers: the source recorded
// now, the one it replaced (nil: none), and the leader that wrote it.
// Unchanged: the leader's Consul already was the recorded one.
type AdoptResult struct {
	Adopted   MirrorSource  `json:"adopted"`
	Was       *MirrorSource `json:"was,omitempty"`
	Leader    string        `json:"leader"`
	Unchanged bool          `json:"unchanged,omitempty"`
}

// AdoptError is a refused adoption: Code is the HTTP status (409: this
// replica is not the leader, LeaderID names it; 422: refused, Message says
// why and what to do).
type AdoptError struct {
	Code     int    `json:"code"`
	Message  string `json:"error"`
	LeaderID string `json:"leader_id,omitempty"`
}

func (e *AdoptError) Error() string { return e.Message }

// AdoptConsul asks the replica, which must be the raft leader, to adopt
// the Consul cluster it reads as the mirror's source (see AdoptRequest).
func (c *Client) AdoptConsul(ctx context.Context, cluster string) (AdoptResult, error) {
	body, _ := json.Marshal(AdoptRequest{Cluster: cluster}) // a struct of strings always encodes
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/v1/consul/adopt", bytes.NewReader(body))
	if err != nil {
		return AdoptResult{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return AdoptResult{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		ae := &AdoptError{}
		if json.Unmarshal(b, ae) != nil || ae.Message == "" {
			return AdoptResult{}, &StatusError{Code: resp.StatusCode, Body: strings.TrimSpace(string(b))}
		}
		ae.Code = resp.StatusCode
		return AdoptResult{}, ae
	}
	var res AdoptResult
	if err := json.NewDecoder(resp.Body).Decode(&res); err != nil {
		return AdoptResult{}, fmt.Errorf("POST /v1/consul/adopt: %w", err)
	}
	return res, nil
}
