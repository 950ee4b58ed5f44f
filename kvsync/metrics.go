package kvsync

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Metrics are the hastate_kv_* series. The wiring creates them once per
// process and hands them to every Watcher it starts (one per leadership
// term), so a new Watcher never registers anything. They keep their last
// values when a Watcher stops: on a follower they describe the last time
// this replica led.
type Metrics struct {
	lastSuccess prometheus.Gauge
	index       prometheus.Gauge
	errors      prometheus.Counter
	reachable   prometheus.Gauge
	keys        prometheus.Gauge
	updates     prometheus.Counter
}

// NewMetrics creates the metrics and registers them with reg; a nil reg
// leaves them unregistered. Call it once per registry: registering twice
// panics, as MustRegister does.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	f := promauto.With(reg)
	return &Metrics{
		lastSuccess: f.NewGauge(prometheus.GaugeOpts{
			Name: "hastate_kv_last_success_timestamp_seconds",
			Help: "Leader only (on followers: the last time this replica led): Unix time of the last Consul KV read that the raft mirror is in sync with. For alerts use the cluster-wide hastate_kv_sync_age_seconds.",
		}),
		index: f.NewGauge(prometheus.GaugeOpts{
			Name: "hastate_kv_index",
			Help: "Leader only (on followers: the last time this replica led): Consul index (X-Consul-Index) of the last KV read of the prefix.",
		}),
		errors: f.NewCounter(prometheus.CounterOpts{
			Name: "hastate_kv_sync_errors_total",
			Help: "Per replica, counted while it led (sum over replicas for the cluster): failed KV syncs: Consul reads that failed and raft applies of a read that failed.",
		}),
		reachable: f.NewGauge(prometheus.GaugeOpts{
			Name: "hastate_kv_watch_reachable",
			Help: "Leader only (on followers: the last time this replica led): 1 if the watch's last Consul KV read succeeded, else 0. It changes only when a blocking query returns (up to a minute); for alerts use the cluster-wide hastate_kv_reachable.",
		}),
		keys: f.NewGauge(prometheus.GaugeOpts{
			Name: "hastate_kv_keys",
			Help: "Leader only (on followers: the last time this replica led): number of keys under the prefix in the last KV read.",
		}),
		updates: f.NewCounter(prometheus.CounterOpts{
			Name: "hastate_kv_updates_total",
			Help: "Per replica, counted while it led (sum over replicas for the cluster): changed KV reads applied to raft.",
		}),
	}
}
