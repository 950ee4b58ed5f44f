package cluster

import (
	"strings"
	"time"
	"unicode/utf8"

	"github.com/hashicorp/raft"
	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/cluster/raftport"
	"github.com/hastate/hastate/state"
	"github.com/prometheus/client_golang/prometheus"
)

// metrics is a collector that reads raft at scrape time, plus the few
// counters and histograms the node updates itself. It is the one metric
// of the repository not built with promauto.With(reg): its series are
// computed from raft and the snapshot when scraped, so it is a Collector,
// registered (and unregistered at Shutdown) as one.
type metrics struct {
	n                 *Node
	leaderChanges     prometheus.Counter
	rampSteps         prometheus.Counter
	entryLag          prometheus.Histogram
	rampPolicyInvalid *prometheus.Desc // computed from raft at scrape
	applyErrors       prometheus.Counter
	port              *raftport.Metrics // the raft port's connections and TLS

	rampsActive, serverWeight, serverState, serverSince, rampStepDue, rampInterval *prometheus.Desc

	state, applied, commit, lastContact, term, keys, holds *prometheus.Desc

	kvSyncAge, kvReachable, leaderless *prometheus.Desc

	level, levelWaiting, notUnderstood *prometheus.Desc

	mirrorVerdict     *prometheus.Desc
	haproxiesRecorded *prometheus.Desc

	bootstrapWaiting *prometheus.Desc
}

func newMetrics(n *Node) *metrics {
	return &metrics{
		n:    n,
		port: raftport.NewMetrics(),
		leaderChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hastate_raft_leader_changes_total", Help: "Per replica: changes of the raft leader this replica observed, losing the leader included (an election usually counts 2: the loss and the new leader). More than a few elections an hour is flapping."}),
		entryLag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "hastate_raft_entry_lag_seconds", Help: "Per replica: time from the leader writing an entry to this replica applying it: commit plus replication latency (across hosts it includes their clock offset).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}),
		rampSteps: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hastate_ramp_steps_total", Help: "Per replica: ramp steps (weight changes and ends) applied to this replica's state; every replica in sync counts the same."}),
		rampPolicyInvalid: prometheus.NewDesc("hastate_ramp_policy_invalid",
			"1 when <prefix>config/ramp is invalid and ignored (the --ramp-* flags apply), 0 when it is absent or valid. From raft: the same on every replica in sync. hastate status and the status page show the key and why.", nil, nil),
		applyErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hastate_fsm_apply_errors_total", Help: "Per replica: committed raft entries this replica could not apply as written (undecodable, unknown type, invalid ramp policy, a panic while applying): each is logged and skipped, or applied without ramps, identically on every replica. Any increase is a bug to report."}),
		haproxiesRecorded: prometheus.NewDesc("hastate_haproxies_recorded",
			"HAProxy nodes (source addresses) the cluster records as having polled within 10 minutes (from raft: the same on every replica in sync; 0 until every replica runs 0.15.0 or later). Operator commands read it to tell an HAProxy only a lost replica saw.", nil, nil),
		rampsActive: prometheus.NewDesc("hastate_ramps_active", "Undrain ramps in progress (from raft: the same on every replica in sync).", nil, nil),
		serverState: prometheus.NewDesc("hastate_server_state",
			"Always 1: the effective state of each server (or backend wildcard, server \"*\") with a non-default state: drain, maint, weight (an explicit N%), ramping (an undrain ramp sets its weight) or withheld (invalid key without a last valid value: no answer). Servers answered ready 100% have no series. by is the writer named in the key's JSON value (cut to 64 bytes). From raft: the same on every replica in sync.",
			[]string{"backend", "server", "state", "by"}, nil),
		serverSince: prometheus.NewDesc("hastate_server_state_since_timestamp_seconds",
			"Unix time at which each non-default server state (see hastate_server_state) took effect, on the raft leader's clock when it wrote the change (a ramp: its start); the same on every replica in sync. time() minus it is how long a server has been drained. Absent when not known (a key last changed before hastate recorded it).",
			[]string{"backend", "server", "state"}, nil),
		serverWeight: prometheus.NewDesc("hastate_server_weight_percent",
			"Weight in percent each server with a non-default state is told in its 'ready <w>%' answer: an explicit N% or a ramp's current step. Servers told drain, maint or nothing have no series (see hastate_server_state). From raft: the same on every replica in sync.",
			[]string{"backend", "server"}, nil),
		rampStepDue: prometheus.NewDesc("hastate_ramp_step_due_timestamp_seconds",
			"Unix time by which the raft leader owes each ramp its next weight step (or its end), from the ramp's recorded start and schedule; the same on every replica in sync. A value several ramp intervals in the past means ramps are stuck.",
			[]string{"backend", "server"}, nil),
		rampInterval: prometheus.NewDesc("hastate_ramp_interval_seconds",
			"Step interval of each ramp in progress (its policy's --ramp-interval or <prefix>config/ramp interval). From raft: the same on every replica in sync.",
			[]string{"backend", "server"}, nil),
		state:       prometheus.NewDesc("hastate_raft_state", "Per replica: 1 for the raft state this replica is in (leader, follower, candidate, shutdown), 0 for the others. sum(hastate_raft_state{state=\"leader\"}) is 1 in a healthy cluster.", []string{"state"}, nil),
		applied:     prometheus.NewDesc("hastate_raft_applied_index", "Per replica: last raft index handed to the state machine; replicas in sync show the same.", nil, nil),
		commit:      prometheus.NewDesc("hastate_raft_commit_index", "Per replica: last raft index this replica knows committed.", nil, nil),
		lastContact: prometheus.NewDesc("hastate_raft_last_contact_seconds", "Per replica: seconds since this follower last heard from the leader (0 on the leader and before any contact).", nil, nil),
		term:        prometheus.NewDesc("hastate_raft_term", "Per replica: current raft term (it rises with every election).", nil, nil),
		keys:        prometheus.NewDesc("hastate_state_keys", "State keys (<prefix>state/...) in the mirror by validity (valid, invalid: a typo, 300%, bad JSON; it keeps its last valid value). From raft: the same on every replica in sync.", []string{"validity"}, nil),
		holds:       prometheus.NewDesc("hastate_state_held", "Per replica: 1 when the replica holds state (a KV sync or a restored snapshot) and answers probes; 0: every answer is withheld.", nil, nil),
		kvSyncAge: prometheus.NewDesc("hastate_kv_sync_age_seconds",
			"Cluster-wide, the same on every replica: seconds since the raft leader last knew its mirror held Consul's KV content (the leader's report, aged since; before any sync, seconds since this replica started). A few seconds when healthy.", nil, nil),
		kvReachable: prometheus.NewDesc("hastate_kv_reachable",
			"Cluster-wide, the same on every replica: 1 when the raft leader reads Consul and its watch is delivering, as the leader reported within the last 5s; 0 otherwise (Consul down, no leader).", nil, nil),
		level: prometheus.NewDesc("hastate_cluster_level",
			"Per replica: the feature level in force (applied from raft: the same on every replica in sync) and the highest this build understands (build). applied below build on every replica: a rolling upgrade has not finished, and the features of the levels above wait.",
			[]string{"kind"}, nil),
		levelWaiting: prometheus.NewDesc("hastate_cluster_level_waiting",
			"Leader only: 1 while a feature level waits because a replica does not advertise it (a rolling upgrade in progress), or while a replica runs a release below the level in force; 0 otherwise. /v1/cluster level.waiting says which.", nil, nil),
		notUnderstood: prometheus.NewDesc("hastate_fsm_entry_not_understood",
			"Per replica: 1 once this replica met a raft entry it does not understand (written by a newer release): it withholds every answer and fails readiness until it is upgraded.", nil, nil),
		mirrorVerdict: prometheus.NewDesc("hastate_mirror_verdict",
			"Per replica: 1 for the reason this replica can (ok) or cannot mirror Consul into raft if it leads, 0 for the others: consul_unreachable (its Consul check fails), not_consul (what answers is not Consul's KV endpoint: a proxy, another service), other_cluster (its Consul is not the cluster recorded in raft: see hastate adopt-consul), other_prefix (its --kv-prefix is not the recorded one), token_cannot_read (its Consul token may not read the prefix). A leader that cannot mirror applies nothing and hands leadership to a follower that can. /v1/cluster mirror says why.",
			[]string{"reason"}, nil),
		bootstrapWaiting: prometheus.NewDesc("hastate_raft_bootstrap_waiting",
			"Per replica: 1 for each peer of --peers that a replica with no raft state waits for before it bootstraps (the peer does not answer, or not in time); no series while it does not wait. /-/readiness says why.", []string{"peer"}, nil),
		leaderless: prometheus.NewDesc("hastate_raft_leaderless_seconds",
			"Per replica: seconds this replica has been without a known raft leader (0 with one). Past --leaderless-grace since its last contact with a leader it withholds answers (see hastate_withheld).", nil, nil),
	}
}

// owned are the collectors the node updates itself.
func (m *metrics) owned() []prometheus.Collector {
	cs := append([]prometheus.Collector{m.leaderChanges, m.rampSteps, m.entryLag, m.applyErrors, m.n.reads.Collector()},
		m.port.Collectors()...)
	cs = append(cs, m.n.duties.Collectors()...)
	if f := m.n.opts.TLSFiles; f != nil {
		cs = append(cs, f.Collectors()...)
	}
	return cs
}

func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.owned() {
		c.Describe(ch)
	}
	for _, d := range []*prometheus.Desc{m.rampPolicyInvalid, m.rampsActive, m.serverWeight, m.serverState, m.serverSince, m.rampStepDue, m.rampInterval} {
		ch <- d
	}
	for _, d := range []*prometheus.Desc{m.state, m.applied, m.commit, m.lastContact, m.term, m.keys, m.holds, m.kvSyncAge, m.kvReachable, m.leaderless, m.level, m.levelWaiting, m.notUnderstood, m.mirrorVerdict, m.bootstrapWaiting, m.haproxiesRecorded} {
		ch <- d
	}
}

func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.owned() {
		c.Collect(ch)
	}
	r := m.n.raft
	cur := r.State()
	for _, s := range []raft.RaftState{raft.Leader, raft.Follower, raft.Candidate, raft.Shutdown} {
		v := 0.0
		if s == cur {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(m.state, prometheus.GaugeValue, v, stateName(s))
	}
	ch <- prometheus.MustNewConstMetric(m.applied, prometheus.GaugeValue, float64(r.AppliedIndex()))
	ch <- prometheus.MustNewConstMetric(m.commit, prometheus.GaugeValue, float64(r.CommitIndex()))
	ch <- prometheus.MustNewConstMetric(m.term, prometheus.GaugeValue, float64(r.CurrentTerm()))
	lc := 0.0
	if cur != raft.Leader {
		if t := r.LastContact(); !t.IsZero() {
			lc = time.Since(t).Seconds()
		}
	}
	ch <- prometheus.MustNewConstMetric(m.lastContact, prometheus.GaugeValue, lc)
	policyInvalid := 0.0
	if _, err := m.n.RampPolicyProblem(); err != nil {
		policyInvalid = 1
	}
	ch <- prometheus.MustNewConstMetric(m.rampPolicyInvalid, prometheus.GaugeValue, policyInvalid)
	snap := m.n.Snapshot()
	inv := snap.Invalid()
	ch <- prometheus.MustNewConstMetric(m.keys, prometheus.GaugeValue, float64(snap.Len()-inv), "valid")
	ch <- prometheus.MustNewConstMetric(m.keys, prometheus.GaugeValue, float64(inv), "invalid")
	ch <- prometheus.MustNewConstMetric(m.rampsActive, prometheus.GaugeValue, float64(len(snap.Ramps())))
	m.collectServers(ch, snap)
	held := 0.0
	if snap != nil {
		held = 1
	}
	ch <- prometheus.MustNewConstMetric(m.holds, prometheus.GaugeValue, held)
	kv := m.n.KVView()
	ch <- prometheus.MustNewConstMetric(m.kvSyncAge, prometheus.GaugeValue, kv.SyncAgeSeconds)
	ch <- prometheus.MustNewConstMetric(m.kvReachable, prometheus.GaugeValue, boolGauge(kv.Reachable))
	ch <- prometheus.MustNewConstMetric(m.leaderless, prometheus.GaugeValue, m.n.leaderless().Seconds())
	ch <- prometheus.MustNewConstMetric(m.level, prometheus.GaugeValue, float64(m.n.fsm.Level()), "applied")
	ch <- prometheus.MustNewConstMetric(m.level, prometheus.GaugeValue, float64(m.n.fsm.MaxLevel()), "build")
	ch <- prometheus.MustNewConstMetric(m.haproxiesRecorded, prometheus.GaugeValue, float64(m.n.fsm.HAProxiesLen()))
	ch <- prometheus.MustNewConstMetric(m.levelWaiting, prometheus.GaugeValue, boolGauge(m.n.duties.Waiting()))
	ch <- prometheus.MustNewConstMetric(m.notUnderstood, prometheus.GaugeValue, boolGauge(m.n.fsm.NotUnderstood() != nil))
	verdict := m.n.MirrorVerdict()
	for _, r := range api.MirrorReasons() {
		ch <- prometheus.MustNewConstMetric(m.mirrorVerdict, prometheus.GaugeValue, boolGauge(verdict.Reason == r), string(r))
	}
	_, waiting := m.n.bootstrapWaiting()
	for _, p := range waiting {
		ch <- prometheus.MustNewConstMetric(m.bootstrapWaiting, prometheus.GaugeValue, 1, p)
	}
}

// collectServers exports the servers with a non-default state and the
// ramps: one series each per key or ramp, so cardinality is bounded by the
// KV content, not by the fleet.
func (m *metrics) collectServers(ch chan<- prometheus.Metric, snap *state.Snapshot) {
	for _, t := range snap.Targets() {
		r := snap.Resolve(t.Backend, t.Server)
		kind := r.Kind()
		if kind == state.KindReady {
			continue
		}
		by := ""
		if r.Entry != nil && r.Entry.HasLast && r.Ramp == nil {
			by = cutLabel(r.Entry.Last().By, 64)
		}
		ch <- prometheus.MustNewConstMetric(m.serverState, prometheus.GaugeValue, 1, t.Backend, t.Server, string(kind), by)
		if since := r.Since(); !since.IsZero() {
			ch <- prometheus.MustNewConstMetric(m.serverSince, prometheus.GaugeValue, unixSeconds(since), t.Backend, t.Server, string(kind))
		}
		if kind == state.KindWeight || kind == state.KindRamping {
			ch <- prometheus.MustNewConstMetric(m.serverWeight, prometheus.GaugeValue, float64(r.Answer.Weight), t.Backend, t.Server)
		}
	}
	for _, rp := range snap.Ramps() {
		b, srv, _ := strings.Cut(rp.Target, "/")
		ch <- prometheus.MustNewConstMetric(m.rampStepDue, prometheus.GaugeValue, unixSeconds(rp.StepDue()), b, srv)
		ch <- prometheus.MustNewConstMetric(m.rampInterval, prometheus.GaugeValue, rp.Policy.Interval.Seconds(), b, srv)
	}
}

func unixSeconds(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

// cutLabel shortens a free-text label value to at most n bytes, on a rune
// boundary.
func cutLabel(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
