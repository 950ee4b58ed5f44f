package cluster

import (
	"time"

	"github.com/hashicorp/raft"
	"github.com/hastate/hastate/state"
	"github.com/prometheus/client_golang/prometheus"
)

// metrics is a collector that reads raft at scrape time, plus the few
// counters and histograms the node updates itself.
type metrics struct {
	n                 *Node
	leaderChanges     prometheus.Counter
	applyDuration     prometheus.Histogram
	kvFailovers       prometheus.Counter
	rampSteps         prometheus.Counter
	entryLag          prometheus.Histogram
	rampPolicyInvalid prometheus.Gauge
	applyErrors       prometheus.Counter
	dutyFailures      prometheus.Counter
	port              *portMetrics // the raft port's connections and TLS

	rampsActive, serverWeight *prometheus.Desc

	state, applied, commit, lastContact, term, keys, holds *prometheus.Desc

	kvSyncAge, kvReachable, leaderless *prometheus.Desc
}

func newMetrics(n *Node) *metrics {
	return &metrics{
		n:    n,
		port: newPortMetrics(),
		leaderChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hastate_raft_leader_changes_total", Help: "Leader changes this node observed."}),
		kvFailovers: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hastate_raft_kv_failovers_total", Help: "Leadership handed to a follower because this leader could not reach Consul."}),
		entryLag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "hastate_raft_entry_lag_seconds", Help: "Time from the leader writing an entry to this replica applying it: commit plus replication latency (across hosts it includes their clock offset).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}),
		rampSteps: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hastate_ramp_steps_total", Help: "Ramp steps (weight changes and ends) applied to this replica's state."}),
		rampPolicyInvalid: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "hastate_ramp_policy_invalid", Help: "1 when <prefix>config/ramp is invalid and ignored (set on the leader)."}),
		applyErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hastate_fsm_apply_errors_total", Help: "Committed raft entries this replica could not apply as written (undecodable, unknown type, invalid ramp policy, a panic while applying): each is logged and skipped, or applied without ramps, identically on every replica. Any increase is a bug to report."}),
		dutyFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hastate_leader_duty_failures_total", Help: "Times this replica, as leader, could not run its duty (building the Consul watch) and handed leadership over or retried."}),
		rampsActive:  prometheus.NewDesc("hastate_ramps_active", "Undrain ramps in progress.", nil, nil),
		serverWeight: prometheus.NewDesc("hastate_server_weight_percent", "Weight in percent each known server is told (0 for drain and maint); server \"*\" is a backend wildcard.", []string{"backend", "server"}, nil),
		applyDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "hastate_raft_apply_duration_seconds", Help: "Time from raft Apply to the entry being committed and applied on the leader.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}),
		state:       prometheus.NewDesc("hastate_raft_state", "1 for the raft state this node is in.", []string{"state"}, nil),
		applied:     prometheus.NewDesc("hastate_raft_applied_index", "Last raft index applied to the FSM.", nil, nil),
		commit:      prometheus.NewDesc("hastate_raft_commit_index", "Last raft index known committed.", nil, nil),
		lastContact: prometheus.NewDesc("hastate_raft_last_contact_seconds", "Seconds since this follower last heard from the leader (0 on the leader).", nil, nil),
		term:        prometheus.NewDesc("hastate_raft_term", "Current raft term.", nil, nil),
		keys:        prometheus.NewDesc("hastate_state_keys", "State keys in the mirror by validity.", []string{"validity"}, nil),
		holds:       prometheus.NewDesc("hastate_state_held", "1 when the replica holds state (a KV sync or a restored snapshot).", nil, nil),
		kvSyncAge: prometheus.NewDesc("hastate_kv_sync_age_seconds",
			"Cluster-wide, the same on every replica: seconds since the raft leader last knew its mirror held Consul's KV content (the leader's report, aged since; before any sync, seconds since this replica started). A few seconds when healthy.", nil, nil),
		kvReachable: prometheus.NewDesc("hastate_kv_reachable",
			"Cluster-wide, the same on every replica: 1 when the raft leader reads Consul and its watch is delivering, as the leader reported within the last 5s; 0 otherwise (Consul down, no leader).", nil, nil),
		leaderless: prometheus.NewDesc("hastate_raft_leaderless_seconds",
			"Seconds this replica has been without a known raft leader (0 with one); it keeps serving its last state meanwhile.", nil, nil),
	}
}

// owned are the collectors the node updates itself.
func (m *metrics) owned() []prometheus.Collector {
	return append([]prometheus.Collector{m.leaderChanges, m.applyDuration, m.kvFailovers, m.rampSteps, m.entryLag, m.rampPolicyInvalid, m.applyErrors, m.dutyFailures},
		m.port.collectors()...)
}

func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.owned() {
		c.Describe(ch)
	}
	ch <- m.rampsActive
	ch <- m.serverWeight
	for _, d := range []*prometheus.Desc{m.state, m.applied, m.commit, m.lastContact, m.term, m.keys, m.holds, m.kvSyncAge, m.kvReachable, m.leaderless} {
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
	snap := m.n.Snapshot()
	inv := snap.Invalid()
	ch <- prometheus.MustNewConstMetric(m.keys, prometheus.GaugeValue, float64(len(snap.Entries())-inv), "valid")
	ch <- prometheus.MustNewConstMetric(m.keys, prometheus.GaugeValue, float64(inv), "invalid")
	ch <- prometheus.MustNewConstMetric(m.rampsActive, prometheus.GaugeValue, float64(len(snap.Ramps())))
	for _, t := range snap.Targets() {
		if r := snap.Resolve(t.Backend, t.Server); !r.Answer.Withheld {
			w := 0.0
			if r.Answer.Admin == state.Ready {
				w = float64(r.Answer.Weight)
			}
			ch <- prometheus.MustNewConstMetric(m.serverWeight, prometheus.GaugeValue, w, t.Backend, t.Server)
		}
	}
	held := 0.0
	if snap != nil {
		held = 1
	}
	ch <- prometheus.MustNewConstMetric(m.holds, prometheus.GaugeValue, held)
	kv := m.n.KVView()
	ch <- prometheus.MustNewConstMetric(m.kvSyncAge, prometheus.GaugeValue, kv.SyncAgeSeconds)
	ch <- prometheus.MustNewConstMetric(m.kvReachable, prometheus.GaugeValue, boolGauge(kv.Reachable))
	ch <- prometheus.MustNewConstMetric(m.leaderless, prometheus.GaugeValue, m.n.leaderless().Seconds())
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
