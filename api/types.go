// Package api holds the JSON types of hastate's HTTP API (/v1/...,
// /-/readiness) and a small client for it, as consul/api is for Consul. The
// server encodes these types, the operator commands and the tests decode
// them: one definition, no copies. It imports only the standard library.
package api

import (
	"fmt"
	"time"
)

// The lists (/v1/state, /v1/pollers, the status page) answer at most
// ?limit= rows, so that one request cannot make a replica build an answer
// of unbounded size.
const (
	// DefaultLimit is the number of rows answered without ?limit.
	DefaultLimit = 1000
	// MaxLimit is the largest ?limit accepted: about 30 MB of JSON.
	MaxLimit = 100_000
)

// PollerTTL is how recently an HAProxy must have asked for a server to
// count as polling it: ServerState.Polled and Told, `hastate wait`, and the
// write commands' "no HAProxy polls this server" check. HAProxy asks every
// agent-inter (2 s), so a minute is 30 missed checks.
const PollerTTL = time.Minute

// ServerState is one row of /v1/state: a server (or a backend wildcard,
// Server "*"), what it is told and why.
type ServerState struct {
	Backend string `json:"backend"`
	Server  string `json:"server"`
	Key     string `json:"key,omitempty"`     // the KV key the answer comes from
	Source  string `json:"source"`            // the key, "absent" or "no-state"
	Value   string `json:"value,omitempty"`   // the raw KV value
	Desired string `json:"desired,omitempty"` // the last valid value in short form
	Valid   bool   `json:"valid"`
	Error   string `json:"error,omitempty"`
	// Note is what status should say about the key and its meta key:
	// "set outside hastate", "JSON in a state key: ...", an ignored meta
	// key, additions that wait for a rolling upgrade.
	Note     string `json:"note,omitempty"`
	Reason   string `json:"reason,omitempty"`
	By       string `json:"by,omitempty"`
	Ramp     string `json:"ramp,omitempty"`
	Answer   string `json:"answer"`
	Withheld bool   `json:"withheld"`
	// Kind is the effective state the answer comes from, and Weight the
	// weight in percent it tells HAProxy (kinds ready, weight and
	// ramping; withheld: the weight HAProxy keeps, see Keeps; 0 for the
	// others). Decide on these, not on Answer's text.
	Kind   Kind `json:"kind"`
	Weight int  `json:"weight"`
	// Ramping is the undrain ramp setting this server's weight, if any.
	Ramping *RampProgress `json:"ramping,omitempty"`
	// Since is when the answer's state took effect, on the raft leader's
	// clock (a ramp: its start); absent for the default ready 100% and
	// when not known.
	Since *time.Time `json:"since,omitempty"`
	// Until is when the state expires (hastate drain --for); Expired
	// names a key whose until has passed: hastate treats it as absent
	// (the answer comes from the next key, or is ready) until it changes.
	Until   *time.Time `json:"until,omitempty"`
	Expired string     `json:"expired,omitempty"`
	// ExpiredAt is when the Expired key's state expired (its until).
	ExpiredAt *time.Time `json:"expired_at,omitempty"`
	// Polled counts the HAProxy nodes that asked for this server within
	// the poller window, and Told those of them last told Answer (over
	// the replicas the view covers: see StateView.Scope).
	Polled int `json:"polled"`
	Told   int `json:"told"`
	// Keeps is, for a withheld server (no answer), what HAProxy keeps:
	// the last answer a replica told the HAProxy nodes polling it (the
	// most common one when they differ). Empty when none of them was ever
	// told anything: each keeps its own state. Weight is then Keeps'
	// weight, and InRotation counts the server by it.
	Keeps string `json:"keeps,omitempty"`
}

// RampProgress is one ramp as shown to operators.
type RampProgress struct {
	Target        string    `json:"target"` // backend/server or backend/*
	WeightPercent int       `json:"weight_percent"`
	Started       time.Time `json:"started"`
	ETA           time.Time `json:"eta"`
	Duration      string    `json:"duration"`
	Interval      string    `json:"interval"`
}

// String renders the ramp for a status table.
func (r *RampProgress) String() string {
	if r == nil {
		return ""
	}
	return fmt.Sprintf("%d%% (eta %s)", r.WeightPercent, r.ETA.Local().Format("15:04:05 MST"))
}

// StateView is the /v1/state body.
type StateView struct {
	// Scope is "replica" (the servers this replica knows) or "cluster"
	// (?scope=cluster: also the servers HAProxy polled on the others).
	Scope       string        `json:"scope"`
	HoldsState  bool          `json:"holds_state"`
	Servers     []ServerState `json:"servers"`
	InvalidKeys []ServerState `json:"invalid_keys"`
	KV          KVStatus      `json:"kv"`
	// Migration is set while a migration from the runbook's per-node
	// agent is marked (<prefix>config/migration): every CLI write keeps
	// to what the per-node agent serves the same way.
	Migration *Migration `json:"migration,omitempty"`
	// Replicas says, for a cluster view, which replicas answered; a
	// missing one means the view may lack what only it saw.
	Replicas []ReplicaAnswer `json:"replicas,omitempty"`
	// Total and InvalidTotal count every server and invalid key; Servers
	// and InvalidKeys hold at most the request's limit of each, the first
	// in order, and Truncated says that either was cut.
	Total        int  `json:"total"`
	InvalidTotal int  `json:"invalid_total"`
	Truncated    bool `json:"truncated"`
	// Selectors echoes the ?selector= the replica filtered by (releases
	// before 0.15.0 ignore the parameter and send none); Total then
	// counts the servers they match. Next, when not empty, is the
	// ?after= that reads the next page (Truncated is then true).
	Selectors []string `json:"selectors,omitempty"`
	Next      string   `json:"next,omitempty"`
	// Backends lists, for a filtered view, every backend the cluster
	// knows (for the "matches nothing" error and its did-you-mean).
	Backends []string `json:"backends,omitempty"`
}

// Migration is the migration marker as a replica mirrors it. Error says
// why its value could not be read (it still marks a migration).
type Migration struct {
	Started *time.Time `json:"started,omitempty"`
	By      string     `json:"by,omitempty"`
	Reason  string     `json:"reason,omitempty"`
	Error   string     `json:"error,omitempty"`
}

// String says what the marker means, in one line for status and the page.
func (m *Migration) String() string {
	l := "migration from the per-node agent marked"
	if m.Started != nil {
		l += " since " + m.Started.UTC().Format("2006-01-02 15:04:05 UTC")
	}
	if m.By != "" {
		l += " by " + m.By
	}
	if m.Reason != "" {
		l += ": " + m.Reason
	}
	if m.Error != "" {
		l += " (" + m.Error + ")"
	}
	return l + "; writes keep to what the per-node agent serves: per-server keys, no --for, no --ramp, no undrain ramp"
}

// ReplicaAnswer is whether one replica answered a cluster-wide query.
type ReplicaAnswer struct {
	ID       string `json:"id"`
	Answered bool   `json:"answered"`
	Error    string `json:"error,omitempty"`
}

// Poll is one HAProxy's last probe for one server.
type Poll struct {
	HAProxy   string    `json:"haproxy"` // the prober's IP address
	Backend   string    `json:"backend"`
	Server    string    `json:"server"`
	LastAsked time.Time `json:"last_asked"`
	Answer    string    `json:"answer"` // without LF; "" when withheld
	Withheld  bool      `json:"withheld"`
	// Kept is, when Withheld, the last answer this HAProxy was told
	// before, which it keeps ("" when it was never told one).
	Kept    string `json:"kept,omitempty"`
	Count   uint64 `json:"count"`
	Replica string `json:"replica,omitempty"` // the replica that answered
}

// PollersView is the /v1/pollers body.
type PollersView struct {
	Scope   string `json:"scope"` // "replica" or "cluster"
	Pollers []Poll `json:"pollers"`
	// Replicas says, for scope=cluster, which replicas answered.
	Replicas []ReplicaAnswer `json:"replicas,omitempty"`
	// Total counts every poll; Pollers holds at most the request's limit
	// of them, the first by server, HAProxy and replica, and Truncated says
	// they were cut.
	Total     int  `json:"total"`
	Truncated bool `json:"truncated"`
	// Selectors and Next: as in StateView (the order is server, HAProxy,
	// replica; see PollCursor).
	Selectors []string `json:"selectors,omitempty"`
	Next      string   `json:"next,omitempty"`
}

// Readiness is the /-/readiness body.
type Readiness struct {
	Ready  bool     `json:"ready"`
	Detail string   `json:"detail"`
	KV     KVStatus `json:"kv"`
}

// KVView is the cluster's view of its Consul sync: what the raft leader
// reported, aged by the time since. Every replica computes the same.
type KVView struct {
	// LeaderID is the leader whose report this is ("" when none is known).
	LeaderID string `json:"leader_id"`
	// Known: this replica leads, or its leader answered recently. Without
	// a fresh report, Reachable is false.
	Known bool `json:"known"`
	// Reachable: the leader reads Consul and its watch is delivering.
	Reachable bool `json:"reachable"`
	// Synced: a leader has synced KV since this replica started (or in
	// the report it holds); SyncAge is then the time since it last was
	// in sync, else the time since this replica started.
	Synced         bool          `json:"synced"`
	SyncAge        time.Duration `json:"-"`
	SyncAgeSeconds float64       `json:"sync_age_seconds"`
	// SyncedIndex is the highest Consul index this replica's state is
	// known to hold (the leader's watch index once this replica has
	// applied the leader's state at that time; 0: unknown).
	SyncedIndex uint64 `json:"synced_index"`
	// Warning says what is wrong, e.g. "Consul not synced for 42s"; empty
	// when the sync is current.
	Warning string `json:"warning,omitempty"`
	// TokenProblem is set while the leader's Consul token may not read
	// the prefix: the leader applies nothing (it holds the last state).
	TokenProblem *TokenProblem `json:"token_problem,omitempty"`
}

// TokenProblem is a Consul token that may not read what the mirror needs:
// Consul refused it (403) a direct read under the prefix or the listing.
// Consul hides what a token may not read (for the anonymous token it lists
// the prefix as empty and does not say so), so until the token is proven
// able to read, an empty or shrunken listing is not applied.
type TokenProblem struct {
	Prefix string `json:"prefix"`
	// AccessorID names the token (never its secret); Consul's anonymous
	// token, used when none is set, is 00000000-0000-0000-0000-000000000002.
	// "" when Consul has not named it (a deleted token).
	AccessorID string `json:"accessor_id"`
	// Refused is what Consul refused: "read hastate/meta/", "list hastate/".
	Refused string `json:"refused"`
	// Error is Consul's answer.
	Error string    `json:"error"`
	Since time.Time `json:"since"`
}

func (p *TokenProblem) String() string {
	acc := p.AccessorID
	switch acc {
	case "":
		acc = "accessor unknown: Consul does not know the token (deleted?)"
	case "00000000-0000-0000-0000-000000000002":
		acc = "anonymous: no token set"
	default:
		acc = "accessor " + acc
	}
	return fmt.Sprintf("the Consul token cannot read %s (%s): Consul refused to %s (%s); "+
		"give it key_prefix %q { policy = \"list\" } or fix --consul-token-file / CONSUL_HTTP_TOKEN(_FILE) (docs/runbook.md, Consul token)",
		p.Prefix, acc, p.Refused, p.Error, p.Prefix)
}

// KVStatus is the "kv" object of /-/readiness and /v1/state: the cluster's
// view of the Consul sync and, on the leader, its watch.
type KVStatus struct {
	KVView
	Watching bool         `json:"watching"`
	Watch    *WatchStatus `json:"watch,omitempty"`
	Note     string       `json:"note,omitempty"`
	// RampPolicy, when not nil, is <prefix>config/ramp as this replica
	// holds it (from raft: the same on every replica in sync), invalid
	// and ignored: the --ramp-* flags apply. Key is relative to the
	// prefix.
	RampPolicy *InvalidConfig `json:"ramp_policy_invalid,omitempty"`
}

// InvalidConfig is a configuration key hastate ignores, and why.
type InvalidConfig struct {
	Key    string `json:"key"`
	Value  string `json:"value"`
	Error  string `json:"error"`
	Effect string `json:"effect"`
}

// WatchStatus is the leader's Consul watch, for readiness details and the
// status page.
type WatchStatus struct {
	// LastSuccess is when a Consul read last succeeded with the mirror in
	// sync with it (zero: never, in this process).
	LastSuccess time.Time `json:"last_success"`
	// LastError and LastErrorTime describe the last failure, Consul or
	// apply; they are kept after a recovery.
	LastError     string    `json:"last_error,omitempty"`
	LastErrorTime time.Time `json:"last_error_time"`
	// LastErrorReason types LastError for the mirror verdict (see
	// MirrorReason): not_consul, token_cannot_read, other_cluster, ...
	LastErrorReason MirrorReason `json:"last_error_reason,omitempty"`
	// Index is the Consul index of the last successful read, and
	// SyncedIndex the one the mirror is known to hold.
	Index       uint64 `json:"index"`
	SyncedIndex uint64 `json:"synced_index"`
	// ConsecutiveErrors counts failures since the last success, and
	// FailingSince is when the first of them happened (zero with none).
	ConsecutiveErrors int       `json:"consecutive_errors"`
	FailingSince      time.Time `json:"failing_since,omitzero"`
	// Reachable is true when the last Consul read succeeded.
	Reachable bool `json:"reachable"`
	// TokenProblem is set while the watch's token may not read the prefix.
	TokenProblem *TokenProblem `json:"token_problem,omitempty"`
}

// ClusterInfo is the /v1/cluster body: a replica's view of the cluster.
type ClusterInfo struct {
	NodeID       string       `json:"node_id"`
	State        string       `json:"state"` // leader, follower, candidate or shutdown
	LeaderID     string       `json:"leader_id"`
	LeaderAddr   string       `json:"leader_address"`
	Members      []MemberInfo `json:"members"`
	AppliedIndex uint64       `json:"applied_index"`
	StateIndex   uint64       `json:"state_index"` // the last entry served; see PeerStatus
	CommitIndex  uint64       `json:"commit_index"`
	Term         uint64       `json:"term"`
	LastContact  string       `json:"last_contact,omitempty"`
	KVIndex      uint64       `json:"kv_index"`
	KVKeys       int          `json:"kv_keys"`
	KVDigest     string       `json:"kv_digest"` // equal on replicas that hold the same KV content
	HoldsState   bool         `json:"holds_state"`
	CaughtUp     bool         `json:"caught_up"`
	// Withholding lists why this replica answers no agent check and fails
	// readiness ("catching_up", "leaderless", ...); empty while it answers.
	Withholding []string `json:"withholding,omitempty"`
	// KV is the cluster's view of the Consul sync (the leader's report).
	KV KVView `json:"kv"`
	// Confirm is how this replica confirms its answers with the leader
	// (a read index per batch of checks) and why it answers nothing.
	Confirm ConfirmInfo `json:"confirm"`
	// LeaderlessSeconds is how long this replica has been without a known
	// leader (0 with one); it keeps serving its last state meanwhile.
	LeaderlessSeconds float64 `json:"leaderless_seconds"`
	// Level is the cluster's feature level: what is in force, what this
	// build understands, and what waits for which replicas.
	Level LevelInfo `json:"level"`
	// Version is this replica's release (see hastate version).
	Version string `json:"version,omitempty"`
	// KVPrefix is the Consul KV prefix this replica reads (--kv-prefix),
	// and Consul the Consul cluster it reads: a write command checks both
	// before anything else and refuses to write where no replica reads.
	KVPrefix string          `json:"kv_prefix,omitempty"`
	Consul   *ConsulIdentity `json:"consul,omitempty"`
	// ConsulToken is the Consul token this replica sends (never its
	// secret) and whether Consul refuses it.
	ConsulToken *ConsulToken `json:"consul_token,omitempty"`
	// Mirror is whether this replica can mirror Consul into raft (its
	// Consul answers, is the cluster and prefix recorded in raft, and its
	// token may read the prefix), and why not.
	Mirror *MirrorVerdict `json:"mirror,omitempty"`
	// Source is the Consul cluster and prefix recorded in raft with the
	// mirrored state (nil: none recorded yet, e.g. while a rolling
	// upgrade from 0.14.0 waits for level 3).
	Source *MirrorSource `json:"source,omitempty"`
}

// ConsulToken describes the Consul token a replica sends: where it comes
// from, its accessor ID, since when it is in use, and Problem while Consul
// refuses it what the mirror needs.
type ConsulToken struct {
	// Source is "file" (--consul-token-file, CONSUL_HTTP_TOKEN_FILE: read
	// again when it changes), "env" (CONSUL_HTTP_TOKEN) or "none" (Consul's
	// anonymous token).
	Source string `json:"source"`
	File   string `json:"file,omitempty"`
	// AccessorID names the token; "" while Consul has not named it.
	AccessorID string    `json:"accessor_id"`
	Since      time.Time `json:"since"`
	// FileError is the last problem reading the file (the last token read
	// stays in use).
	FileError string        `json:"file_error,omitempty"`
	Problem   *TokenProblem `json:"problem,omitempty"`
}

// ConsulIdentity names the Consul cluster a replica reads: its datacenter
// (empty when the token may not read /v1/agent/self) and its servers'
// raft addresses, sorted and comma-separated (/v1/status/peers). Error
// says why the last read failed; the last identity read is kept.
type ConsulIdentity struct {
	Datacenter string `json:"datacenter,omitempty"`
	Cluster    string `json:"cluster,omitempty"`
	// ClusterID is the cluster's own ID (its Connect CA trust domain;
	// empty with Connect off), and Namespace and Partition what the
	// replica reads (Consul Enterprise; empty: the defaults).
	ClusterID string `json:"cluster_id,omitempty"`
	Namespace string `json:"namespace,omitempty"`
	Partition string `json:"partition,omitempty"`
	// Error is the last read's failure (the rest is the last identity
	// read), and FailingSince when the reads began to fail.
	Error        string    `json:"error,omitempty"`
	FailingSince time.Time `json:"failing_since,omitzero"`
}

// ConfirmInfo is /v1/cluster's confirm: an agent check is answered only
// once a confirmation round that began after it arrived succeeded (the
// leader's commit index, verified by a quorum, applied here).
type ConfirmInfo struct {
	// Answering is true while checks are answered: no withhold reason and
	// the last round confirmed.
	Answering bool `json:"answering"`
	// NotAnswering says why this replica answers nothing, and for how
	// long ("cannot confirm with the leader for 1.2s: ..."); empty while
	// it answers.
	NotAnswering string `json:"not_answering,omitempty"`
	// LastConfirmedSeconds is how long ago the last round succeeded, and
	// ConfirmedIndex the state index it confirmed.
	LastConfirmedSeconds float64 `json:"last_confirmed_seconds"`
	ConfirmedIndex       uint64  `json:"confirmed_index"`
	// FailingSeconds is how long every round has failed (0: the last
	// one succeeded); Error is the last failure.
	FailingSeconds float64 `json:"failing_seconds,omitempty"`
	Error          string  `json:"error,omitempty"`
	// TimeoutSeconds is --confirm-timeout.
	TimeoutSeconds float64 `json:"timeout_seconds"`
}

// LevelInfo says which features of the replicated state are in force. A
// feature of a level above Applied waits until every voter advertises it
// (a rolling upgrade in progress); Waiting then says what waits and for
// whom.
type LevelInfo struct {
	Applied int `json:"applied"` // in force on this replica
	Build   int `json:"build"`   // the highest this build understands
	// Waiting names the features that wait and the members that do not
	// advertise them yet; empty when nothing waits.
	Waiting string `json:"waiting,omitempty"`
	// NotUnderstood is set when this replica met a raft entry it cannot
	// understand (written by a newer release): it withholds every answer
	// and fails readiness until it is upgraded.
	NotUnderstood string `json:"not_understood,omitempty"`
}

// MemberInfo is one member of the raft configuration.
type MemberInfo struct {
	ID       string `json:"id"`
	Address  string `json:"address"`
	Suffrage string `json:"suffrage"`
	Leader   bool   `json:"leader"`
	// Status is what the member reported over the raft port; nil when it
	// did not answer within a second.
	Status *PeerStatus `json:"status"`
}

// PeerStatus is what a replica reports about itself over the raft port.
type PeerStatus struct {
	ID              string    `json:"id"`
	ConsulReachable bool      `json:"consul_reachable"`
	ConsulChecked   time.Time `json:"consul_checked"`
	// Mirror is whether this replica could mirror Consul into raft if it
	// led, and why not; releases before 0.15.0 do not send it (nil: read
	// ConsulReachable, see PeerStatus.Verdict).
	Mirror *MirrorVerdict `json:"mirror,omitempty"`
	State  string         `json:"state"`
	// LastContact is how long ago this replica last heard from the leader
	// (empty on the leader itself).
	LastContact  string `json:"last_contact,omitempty"`
	AppliedIndex uint64 `json:"applied_index"`
	// StateIndex is the raft index of the last entry this replica serves
	// (raft's applied index may run ahead while entries wait in the FSM's
	// queue).
	StateIndex uint64 `json:"state_index"`
	// KVSynced, KVSyncAgeSeconds and KVSyncedIndex are the leader's KV
	// sync report (see KVView); a leader's ConsulReachable includes its
	// watch.
	KVSynced         bool    `json:"kv_synced,omitempty"`
	KVSyncAgeSeconds float64 `json:"kv_sync_age_seconds,omitempty"`
	KVSyncedIndex    uint64  `json:"kv_synced_index,omitempty"`
	// KVTokenProblem is set while Consul refuses the leader's token.
	KVTokenProblem *TokenProblem `json:"kv_token_problem,omitempty"`
	// Level is the highest feature level this replica understands and
	// Version its release; release 0.13.0 sends neither (level 0 is read
	// as state.LevelBase).
	Level   int    `json:"level,omitempty"`
	Version string `json:"version,omitempty"`
	// HoldsRaftState says whether the replica holds raft state (a log, a
	// snapshot or a term); a replica without any bootstraps only once every
	// peer says false. Releases before 0.14.0 do not send it (nil).
	HoldsRaftState *bool `json:"holds_raft_state,omitempty"`
	// RaftLastIndex is the index of the last entry of its raft log (or
	// snapshot); 1 while it holds only the bootstrap configuration.
	RaftLastIndex uint64 `json:"raft_last_index,omitempty"`
}
