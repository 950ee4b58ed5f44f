package server

import (
	"time"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/state"
	"github.com/prometheus/client_golang/prometheus"
)

// DesiredCollector exports the answer of every server this replica knows
// so that PromQL can join it with HAProxy's own exporter
// (haproxy_server_status, haproxy_server_weight): its labels are
// HAProxy's, proxy for the backend and server for the server. One series
// of each family per server, whatever the number of HAProxy nodes that
// poll it. The drift alerts of deploy/prometheus/alerts.yaml read them.
//
// A replica knows a server that has a key of its own, or that an HAProxy
// asked about (more than once: a manual probe asks once) within
// PollerWindow. The answer comes from raft, the same on every replica in
// sync; which servers were polled is each replica's own (the agent load
// balancer spreads an HAProxy's checks over the replicas), so the union
// over the replicas (max by proxy, server) is what the cluster knows.
type DesiredCollector struct {
	o DesiredOptions

	answer, changed *prometheus.Desc
}

// DesiredOptions configure NewDesiredCollector.
type DesiredOptions struct {
	// Snapshot returns the replica's serving snapshot without waiting for
	// a confirmation (nil: nothing is exported; the replica holds no state
	// it can vouch for).
	Snapshot func() *state.Snapshot
	// Pollers is the replica's poller table (nil: only servers with a
	// key of their own are exported).
	Pollers *Pollers
	// Now is the clock (nil: time.Now).
	Now func() time.Time
}

// DesiredChangedWindow is how long after a server's answer changed its
// hastate_desired_changed_timestamp_seconds is exported: the drift alerts
// need it for the seconds HAProxy takes to poll, and a fleet at rest then
// costs one series per server, not two.
const DesiredChangedWindow = 10 * time.Minute

const (
	desiredAnswerHelp = "Per server (labels as HAProxy's exporter names them: proxy is the backend), one series: state is the kind of answer hastate gives for it " +
		"(ready, weight: an explicit N%, ramping: an undrain ramp's step, drain, maint, withheld: no answer, HAProxy keeps its state), " +
		"the value the weight in percent the answer tells HAProxy (0 for drain, maint and withheld). " +
		"Every server this replica knows: a key of its own, or asked about by an HAProxy within 10 minutes (this replica's poller table); " +
		"the answer is from raft, the same on every replica in sync: use max by (proxy, server, state) over replicas. A replica that is not ready exports none. " +
		"Off with --desired-metrics=false."
	desiredChangedHelp = "Unix time at which the answer of a server of hastate_desired_answer last changed, on the raft leader's clock " +
		"(a write's, an expiry's until, a ramp's start: its steps change only the weight); the same on every replica in sync. " +
		"Only for 10 minutes after the change (so that a fleet at rest costs one series per server), and only when known (not the default ready 100% after a key was deleted). " +
		"The drift alerts compare only HAProxy's samples taken at least a few agent-inters after it."
)

// NewDesiredCollector returns the collector; register it with the
// replica's registry.
func NewDesiredCollector(o DesiredOptions) *DesiredCollector {
	if o.Now == nil {
		o.Now = time.Now
	}
	return &DesiredCollector{o: o,
		answer:  prometheus.NewDesc("hastate_desired_answer", desiredAnswerHelp, []string{"proxy", "server", "state"}, nil),
		changed: prometheus.NewDesc("hastate_desired_changed_timestamp_seconds", desiredChangedHelp, []string{"proxy", "server"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *DesiredCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.answer
	ch <- c.changed
}

// Collect implements prometheus.Collector.
func (c *DesiredCollector) Collect(ch chan<- prometheus.Metric) {
	snap := c.o.Snapshot()
	if snap == nil {
		return
	}
	now := c.o.Now()
	for _, t := range c.servers(snap) {
		r := snap.Resolve(t.Backend, t.Server)
		kind := r.Kind()
		w := 0.0
		switch kind {
		case state.KindReady, state.KindWeight, state.KindRamping:
			w = float64(r.Answer.Weight)
		}
		ch <- prometheus.MustNewConstMetric(c.answer, prometheus.GaugeValue, w, t.Backend, t.Server, string(kind))
		if at := r.Changed(); !at.IsZero() && now.Sub(at) < DesiredChangedWindow {
			ch <- prometheus.MustNewConstMetric(c.changed, prometheus.GaugeValue, float64(at.UnixNano())/1e9, t.Backend, t.Server)
		}
	}
}

// servers are the servers this replica knows: those with a key of their
// own (a backend-wide key's servers are known once polled) and those an
// HAProxy asked about within PollerWindow.
func (c *DesiredCollector) servers(snap *state.Snapshot) []state.Target {
	var out []state.Target
	seen := map[state.Target]bool{}
	for _, t := range snap.Targets() {
		if t.Server != state.Wildcard && t.Backend != "" {
			seen[t] = true
			out = append(out, t)
		}
	}
	c.o.Pollers.eachPolled(c.o.Now().Add(-PollerWindow), func(backend, server string) {
		if t := (state.Target{Backend: backend, Server: server}); !seen[t] {
			seen[t] = true
			out = append(out, t)
		}
	})
	return out
}

// eachPolled calls fn for every server that a source asked about more
// than once since since (an HAProxy asks every agent-inter; a manual
// probe once). It walks the table one server's lock at a time.
func (p *Pollers) eachPolled(since time.Time, fn func(backend, server string)) {
	if p == nil {
		return
	}
	at := since.UnixNano()
	p.walk(api.Filter{}, "", func(sp *serverPolls, b, s string) bool {
		sp.mu.Lock()
		polled := false
		if sp.last >= at {
			for _, e := range sp.polls {
				if e.last >= at && e.count > 1 {
					polled = true
					break
				}
			}
		}
		sp.mu.Unlock()
		if polled {
			fn(b, s)
		}
		return true
	})
}
