package kvsync

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
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
// leaves them unregistered. Registering twice with the same registry reuses
// the collectors already there instead of panicking.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "hastate_kv_last_success_timestamp_seconds",
			Help: "Leader only (on followers: the last time this replica led): Unix time of the last Consul KV read that the raft mirror is in sync with. For alerts use the cluster-wide hastate_kv_sync_age_seconds.",
		}),
		index: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "hastate_kv_index",
			Help: "Leader only (on followers: the last time this replica led): Consul index (X-Consul-Index) of the last KV read of the prefix.",
		}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hastate_kv_sync_errors_total",
			Help: "Per replica, counted while it led (sum over replicas for the cluster): failed KV syncs: Consul reads that failed and raft applies of a read that failed.",
		}),
		reachable: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "hastate_kv_watch_reachable",
			Help: "Leader only (on followers: the last time this replica led): 1 if the watch's last Consul KV read succeeded, else 0. It changes only when a blocking query returns (up to a minute); for alerts use the cluster-wide hastate_kv_reachable.",
		}),
		keys: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "hastate_kv_keys",
			Help: "Leader only (on followers: the last time this replica led): number of keys under the prefix in the last KV read.",
		}),
		updates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hastate_kv_updates_total",
			Help: "Per replica, counted while it led (sum over replicas for the cluster): changed KV reads applied to raft.",
		}),
	}
	if reg != nil {
		m.lastSuccess = register(reg, m.lastSuccess)
		m.index = register(reg, m.index)
		m.errors = register(reg, m.errors)
		m.reachable = register(reg, m.reachable)
		m.keys = register(reg, m.keys)
		m.updates = register(reg, m.updates)
	}
	return m
}

func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing
			}
		}
		panic(err) // a programming error, like MustRegister
	}
	return c
}
