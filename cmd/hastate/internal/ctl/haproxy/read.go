package haproxy

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/hastate/hastate/cmd/hastate/internal/ctl"
	"github.com/prometheus/common/model"
)

// HAProxy's own view of its servers, read from Prometheus, which scrapes
// HAProxy's built-in exporter (`http-request use-service
// prometheus-exporter`). hastate only knows what it told each HAProxy;
// what HAProxy applied, and how many sessions it still holds, is HAProxy's
// word, and Prometheus is where the fleet already publishes it.

// Reported is what one HAProxy instance reports for one of its servers.
type Reported struct {
	Instance string `json:"instance"`
	Backend  string `json:"backend"`
	Server   string `json:"server"`
	// State is the exporter's state: UP, DOWN, DRAIN, MAINT or NOLB; ""
	// when no status series was found.
	State string `json:"state,omitempty"`
	// Sessions and Weight are the newest samples; -1 when none is in the
	// last MaxSampleAge.
	Sessions int `json:"sessions"`
	Weight   int `json:"weight"`
	// Sample is the time (Prometheus' clock) of the newest sample of
	// Sessions or Weight; zero when neither has one in the last
	// MaxSampleAge.
	Sample time.Time `json:"sample"`
}

// Name is backend/server.
func (r Reported) Name() string { return r.Backend + "/" + r.Server }

// Reading is one read of HAProxy's series for some servers.
type Reading struct {
	// At is Prometheus' clock at the read: ages are At minus a sample's
	// time, with no skew between this machine and Prometheus.
	At time.Time
	// Servers has one row per (instance, backend, server), sorted by
	// server then instance.
	Servers []Reported
	// Instances maps every HAProxy instance seen within seenWindow to the
	// time of its newest sample (of any selected server).
	Instances map[string]time.Time
	// Samples counts the samples the read returned.
	Samples int
}

// Age is how old the newest sample of instance is at the read.
func (rd Reading) Age(instance string) time.Duration { return rd.At.Sub(rd.Instances[instance]) }

// Newest is the age of the newest sample of all, or -1 when there is none.
func (rd Reading) Newest() time.Duration {
	var newest time.Time
	for _, t := range rd.Instances {
		if t.After(newest) {
			newest = t
		}
	}
	if newest.IsZero() {
		return -1
	}
	return rd.At.Sub(newest)
}

// Stale lists the instances whose newest sample is older than maxAge, as
// "instance (newest sample 42s old)", sorted.
func (rd Reading) Stale(maxAge time.Duration) []string {
	var out []string
	for in := range rd.Instances {
		if age := rd.Age(in); age > maxAge {
			out = append(out, fmt.Sprintf("%s (newest sample %s old)", in, ctl.RoundAge(age)))
		}
	}
	sort.Strings(out)
	return out
}

// Read reads, for the servers the selectors match, each HAProxy
// instance's current sessions, weight and state, with the time of the
// newest sample, all evaluated at one instant of Prometheus' clock.
func (p *Prometheus) Read(ctx context.Context, sels []ctl.Selector) (Reading, error) {
	rd := Reading{Instances: map[string]time.Time{}}
	v, err := p.query(ctx, "time()", time.Time{})
	if err != nil {
		return rd, err
	}
	now, ok := v.(*model.Scalar)
	if !ok {
		return rd, fmt.Errorf("%w: Prometheus at %s answered time() with a %s, not a scalar: is it Prometheus?", ctl.ErrCannotConfirm, p.addr, v.Type())
	}
	rd.At = now.Timestamp.Time()
	match := p.matchers(sels)
	inst, px, sv := model.LabelName(p.o.InstanceLabel), model.LabelName(p.o.ProxyLabel), model.LabelName(p.o.ServerLabel)
	rows := map[[3]string]*Reported{}
	row := func(m model.Metric) *Reported {
		k := [3]string{string(m[inst]), string(m[px]), string(m[sv])}
		if k[0] == "" || k[1] == "" || k[2] == "" {
			return nil
		}
		r := rows[k]
		if r == nil {
			r = &Reported{Instance: k[0], Backend: k[1], Server: k[2], Sessions: -1, Weight: -1}
			rows[k] = r
		}
		return r
	}

	// The raw samples of the last MaxSampleAge: the newest one of each
	// series and its own time (an instant query would stamp every value
	// with the evaluation time, hiding a stale scrape).
	q := p.samplesQuery(match)
	v, err = p.query(ctx, q, rd.At)
	if err != nil {
		return rd, err
	}
	mat, ok := v.(model.Matrix)
	if !ok {
		return rd, fmt.Errorf("%w: Prometheus at %s answered %s with a %s, not a matrix", ctl.ErrCannotConfirm, p.addr, q, v.Type())
	}
	for _, ss := range mat {
		rd.Samples += len(ss.Values)
		r := row(ss.Metric)
		if r == nil || len(ss.Values) == 0 {
			continue
		}
		last := ss.Values[len(ss.Values)-1]
		n := int(last.Value)
		switch ss.Metric[model.MetricNameLabel] {
		case metricSessions:
			r.Sessions = n
		case metricWeight:
			r.Weight = n
		}
		if t := last.Timestamp.Time(); t.After(r.Sample) {
			r.Sample = t
		}
	}

	// The state: the exporter sets the series of the current state to 1.
	q = statusQuery(match)
	if v, err = p.query(ctx, q, rd.At); err != nil {
		return rd, err
	}
	vec, ok := v.(model.Vector)
	if !ok {
		return rd, fmt.Errorf("%w: Prometheus at %s answered %s with a %s, not a vector", ctl.ErrCannotConfirm, p.addr, q, v.Type())
	}
	rd.Samples += len(vec)
	for _, s := range vec {
		if r := row(s.Metric); r != nil {
			r.State = string(s.Metric[stateLabel])
		}
	}

	// Instances whose scrapes stopped have no sample in the window above:
	// find their series over seenWindow (at seenStep's resolution), and
	// then the exact time of each such instance's newest sample.
	q = p.seenQuery(match)
	if v, err = p.query(ctx, q, rd.At); err != nil {
		return rd, err
	}
	if vec, ok = v.(model.Vector); !ok {
		return rd, fmt.Errorf("%w: Prometheus at %s answered %s with a %s, not a vector", ctl.ErrCannotConfirm, p.addr, q, v.Type())
	}
	rd.Samples += len(vec)
	for _, r := range rows {
		if r.Sample.After(rd.Instances[r.Instance]) {
			rd.Instances[r.Instance] = r.Sample
		}
	}
	stale := map[string]model.Metric{} // instance -> one of its series
	for _, s := range vec {
		r := row(s.Metric)
		if r == nil || !r.Sample.IsZero() {
			continue
		}
		if _, fresh := rd.Instances[r.Instance]; !fresh {
			stale[r.Instance] = s.Metric
		}
	}
	for in, m := range stale {
		// The raw samples of one of its series back to just before the
		// subquery's step that saw it.
		seen := time.UnixMilli(int64(float64(vecValue(vec, m)) * 1000))
		q := p.seriesSince(in, m, rd.At.Sub(seen)+2*seenStep)
		if v, err = p.query(ctx, q, rd.At); err != nil {
			return rd, err
		}
		newest := seen
		if mat, ok := v.(model.Matrix); ok {
			for _, ss := range mat {
				rd.Samples += len(ss.Values)
				if n := len(ss.Values); n > 0 && ss.Values[n-1].Timestamp.Time().After(newest) {
					newest = ss.Values[n-1].Timestamp.Time()
				}
			}
		}
		rd.Instances[in] = newest
	}
	for _, r := range rows {
		if r.Sample.IsZero() {
			r.Sample = rd.Instances[r.Instance] // a stale instance's: its series are scraped together
		}
		rd.Servers = append(rd.Servers, *r)
	}
	sort.Slice(rd.Servers, func(i, j int) bool {
		a, b := rd.Servers[i], rd.Servers[j]
		return a.Backend+"/"+a.Server+"\x00"+a.Instance < b.Backend+"/"+b.Server+"\x00"+b.Instance
	})
	return rd, nil
}
