package confirm

// This file holds what Reads tells about itself: the readiness details of
// the withhold reasons in force, the confirmation's trouble, /v1/cluster's
// confirm, and its metrics.

import (
	"strings"
	"time"

	"github.com/hastate/hastate/api"
	"github.com/prometheus/client_golang/prometheus"
)

// WithheldDetails is the readiness detail of each reason in force, with
// how long it has been (and the confirmation's trouble, if any).
func (rs *Reads) WithheldDetails(now time.Time) string {
	var parts []string
	for _, r := range withholdReasons() {
		if rs.withheld.has(r) {
			_, d := r.info()
			since := time.Unix(0, rs.withheldSince[bitIndex(r)].Load())
			parts = append(parts, d+" (for "+roundFor(now.Sub(since))+")")
		}
	}
	if c := rs.ConfirmTrouble(now); c != "" && !rs.withheld.has(withholdLeaderless) {
		parts = append(parts, c)
	}
	return strings.Join(parts, "; ")
}

// ConfirmTrouble says for how long confirmation rounds have failed, and
// why ("" while the last one succeeded).
func (rs *Reads) ConfirmTrouble(now time.Time) string {
	f := rs.conf.failingFor(now)
	if f == 0 {
		return ""
	}
	s := "cannot confirm with the leader for " + roundFor(f)
	if err := rs.conf.lastError(); err != nil {
		s += " (" + err.Error() + ")"
	}
	return s
}

// roundFor rounds a duration for people: 1.2s, 350ms.
func roundFor(d time.Duration) string {
	if d >= time.Second {
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Millisecond).String()
}

// Info is /v1/cluster's confirm.
func (rs *Reads) Info(now time.Time) api.ConfirmInfo {
	idx, at := rs.conf.lastConfirmed()
	ci := api.ConfirmInfo{
		LastConfirmedSeconds: max(now.Sub(at), 0).Seconds(), ConfirmedIndex: idx,
		FailingSeconds: rs.conf.failingFor(now).Seconds(), TimeoutSeconds: rs.o.Timeout.Seconds(),
	}
	if err := rs.conf.lastError(); err != nil {
		ci.Error = err.Error()
	}
	switch {
	case rs.withheld.any():
		ci.NotAnswering = rs.WithheldDetails(now)
	case ci.FailingSeconds > 0:
		ci.NotAnswering = rs.ConfirmTrouble(now)
	default:
		ci.Answering = true
	}
	return ci
}

// Collector is Reads' metrics, registered with the node's.
func (rs *Reads) Collector() prometheus.Collector { return rs.m }

// metrics are the counters Reads updates and the gauges it computes when
// scraped.
type metrics struct {
	rs                *Reads
	withholds         *prometheus.CounterVec
	confirmRounds     *prometheus.CounterVec
	confirmRound      prometheus.Histogram
	confirmAcks       *prometheus.CounterVec
	unconfirmedChecks prometheus.Counter
	// The children of confirmRounds and confirmAcks, built once: a round
	// counts without hashing its labels.
	roundsConfirmed, roundsFailed      prometheus.Counter
	acksAcked, acksFailed, acksNotSent prometheus.Counter

	// withheldChecks counts the checks Confirmed answered nothing, by
	// why: one counter per withhold reason (by bit), then withheldTimeout
	// and withheldNoState; built once, so that counting allocates nothing.
	withheldChecks [maxWithholdReasons + 2]prometheus.Counter
	withheldVec    *prometheus.CounterVec

	withheld, contactAge, confirmAge, confirmFailing, grace *prometheus.Desc
}

// The withheldChecks slots after the withhold reasons'.
const (
	withheldTimeout = maxWithholdReasons
	withheldNoState = maxWithholdReasons + 1
)

// withheldCheck counts a check withheld while the reasons bits are in
// force, under the first of them.
func (m *metrics) withheldCheck(bits uint32) {
	m.withheldChecks[bitIndex(withholdReason(bits&-bits))].Inc()
}

func newMetrics() *metrics {
	m := &metrics{
		withholds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hastate_withhold_starts_total", Help: "Per replica: times this replica began to withhold every agent answer (and fail readiness) for a reason: leaderless (no contact with a raft leader for longer than --leaderless-grace), catching_up (behind a leader after start or a cut-off; counted from a cut-off, not at start), not_understood (applied a raft entry of a newer release), unconfirmed (no confirmation with the leader for longer than --leaderless-grace)."}, []string{"reason"}),
		confirmRounds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hastate_confirm_rounds_total", Help: "Per replica: confirmation rounds (read index: the leader's commit index, learned after the checks of the batch arrived and verified by a quorum, then applied here) by result: confirmed, failed (no leader, the leader unreachable or not verified, not applied within --confirm-timeout). One round serves every check that arrived while the one before was in flight."}, []string{"result"}),
		confirmRound: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "hastate_confirm_round_seconds", Help: "Per replica: duration of each confirmation round (what a check waits at most for it, besides the round in flight when it arrived).",
			Buckets: prometheus.ExponentialBuckets(0.00005, 2, 16)}),
		confirmAcks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hastate_confirm_acks_total", Help: "Per replica, as leader: acknowledgement requests of its confirmation rounds to its voters, by result: acked (the voter is in the leader's term), failed (unreachable, another term, an older release, or not answered by the deadline), not_sent (the round was over before the request was sent). A round asks what a quorum needs (one voter of three) at once and the others only after 2ms or on a failure, so requests per confirmed round (hastate_confirm_rounds_total) near 1 in a cluster of three is the healthy figure; near 2, every round waits for its first voter for 2ms."}, []string{"result"}),
		withheldVec: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hastate_withheld_checks_total", Help: "Per replica: agent checks this replica answered nothing because it could not vouch for its state, by why: a withhold reason in force (leaderless, catching_up, not_understood, unconfirmed: see hastate_withheld), confirm_timeout (no confirmation round succeeded within --confirm-timeout after the check arrived: an election, the leader slow or cut off), no_state (it holds no state yet). An invalid key is not counted here (hastate_agent_withheld_total{reason=\"invalid_key\"})."}, []string{"reason"}),
		unconfirmedChecks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hastate_agent_unconfirmed_total", Help: "Per replica: agent checks answered nothing because no confirmation round succeeded within --confirm-timeout after they arrived (HAProxy keeps the server's state)."}),
		confirmAge: prometheus.NewDesc("hastate_confirm_age_seconds",
			"Per replica: seconds since this replica last confirmed with the raft leader that it serves every committed change (a confirmation round; an idle replica runs one every 250ms). Every check waits for such a round; above --leaderless-grace the replica has answered nothing for that long (alert HastateReplicaUnconfirmed) and fails readiness (hastate_withheld reason unconfirmed or leaderless).", nil, nil),
		confirmFailing: prometheus.NewDesc("hastate_confirm_failing_seconds",
			"Per replica: seconds for which every confirmation round has failed (0 after a success): for so long this replica has answered no agent check.", nil, nil),
		grace: prometheus.NewDesc("hastate_leaderless_grace_seconds",
			"Per replica: its --leaderless-grace, the age of the last leader contact (or of failing confirmations) past which it withholds and fails readiness. Alerts compare hastate_confirm_age_seconds with it.", nil, nil),
		withheld: prometheus.NewDesc("hastate_withheld",
			"Per replica: 1 for each reason this replica is withholding every agent answer and failing readiness (leaderless: no contact with a raft leader for longer than --leaderless-grace; catching_up: behind a leader since start or a cut-off; not_understood: applied a raft entry of a newer release, until upgraded; unconfirmed: no confirmation with the leader for longer than --leaderless-grace), 0 otherwise. HAProxy keeps each server's last state for checks it sends here.", []string{"reason"}, nil),
		contactAge: prometheus.NewDesc("hastate_raft_leader_contact_age_seconds",
			"Per replica: seconds since this replica's last contact with a raft leader (a heartbeat or entry; about 0 on the leader). Past --leaderless-grace it withholds answers.", nil, nil),
	}
	for _, r := range withholdReasons() {
		label, _ := r.info()
		m.withholds.WithLabelValues(label) // every reason's series exists from the start, at 0
		m.withheldChecks[bitIndex(r)] = m.withheldVec.WithLabelValues(label)
	}
	m.withheldChecks[withheldTimeout] = m.withheldVec.WithLabelValues("confirm_timeout")
	m.withheldChecks[withheldNoState] = m.withheldVec.WithLabelValues("no_state")
	m.roundsConfirmed = m.confirmRounds.WithLabelValues("confirmed")
	m.roundsFailed = m.confirmRounds.WithLabelValues("failed")
	m.acksAcked = m.confirmAcks.WithLabelValues("acked")
	m.acksFailed = m.confirmAcks.WithLabelValues("failed")
	m.acksNotSent = m.confirmAcks.WithLabelValues("not_sent")
	return m
}

func (m *metrics) counters() []prometheus.Collector {
	return []prometheus.Collector{m.withholds, m.confirmRounds, m.confirmRound, m.confirmAcks, m.unconfirmedChecks, m.withheldVec}
}

func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.counters() {
		c.Describe(ch)
	}
	for _, d := range []*prometheus.Desc{m.withheld, m.contactAge, m.confirmAge, m.confirmFailing, m.grace} {
		ch <- d
	}
}

func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.counters() {
		c.Collect(ch)
	}
	rs := m.rs
	ch <- prometheus.MustNewConstMetric(m.contactAge, prometheus.GaugeValue, rs.leaderContactAge().Seconds())
	_, at := rs.conf.lastConfirmed()
	now := time.Now()
	ch <- prometheus.MustNewConstMetric(m.confirmAge, prometheus.GaugeValue, max(now.Sub(at), 0).Seconds())
	ch <- prometheus.MustNewConstMetric(m.confirmFailing, prometheus.GaugeValue, rs.conf.failingFor(now).Seconds())
	ch <- prometheus.MustNewConstMetric(m.grace, prometheus.GaugeValue, rs.o.Grace.Seconds())
	for _, r := range withholdReasons() {
		label, _ := r.info()
		v := 0.0
		if rs.withheld.has(r) {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(m.withheld, prometheus.GaugeValue, v, label)
	}
}
