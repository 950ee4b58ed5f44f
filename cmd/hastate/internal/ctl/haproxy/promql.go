package haproxy

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/hastate/hastate/cmd/hastate/internal/ctl"
	"github.com/prometheus/common/model"
)

// PromQL: the exporter's series and the queries Read sends.

// The exporter's series this package reads, and its state label.
const (
	metricSessions = "haproxy_server_current_sessions"
	metricWeight   = "haproxy_server_weight"
	metricStatus   = "haproxy_server_status"
	stateLabel     = "state"
)

// seenWindow is how far back a read looks for HAProxy instances whose
// scrapes stopped: an instance seen within it but with no sample within
// MaxSampleAge is reported stale instead of silently missing.
const seenWindow = 10 * time.Minute

// seenStep is the resolution of the subquery over seenWindow.
const seenStep = 15 * time.Second

// matchers are the label matchers of the servers the selectors match
// (each selector's globs as anchored regular expressions). They may
// select more than the selectors do (backend of one, server of another);
// callers keep only the servers they asked about.
func (p *Prometheus) matchers(sels []ctl.Selector) string {
	var bs, ss []string
	for _, s := range sels {
		bs = append(bs, globRegexp(s.Backend))
		ss = append(ss, globRegexp(s.Server))
	}
	return fmt.Sprintf(`%s=~%s,%s=~%s`, p.o.ProxyLabel, strconv.Quote(strings.Join(bs, "|")), p.o.ServerLabel, strconv.Quote(strings.Join(ss, "|")))
}

// globRegexp turns a path.Match pattern into a regular expression that
// matches at least what it matches: * and ? as in path.Match, a character
// class as any one character but '/'.
func globRegexp(glob string) string {
	var b strings.Builder
	for i := 0; i < len(glob); i++ {
		switch c := glob[i]; c {
		case '*':
			b.WriteString(`[^/]*`)
		case '?':
			b.WriteString(`[^/]`)
		case '[': // valid (ctl.ParseSelector checked it): skip to its ']'
			j := i + 1
			for j < len(glob) && glob[j] != ']' {
				if glob[j] == '\\' {
					j++
				}
				j++
			}
			b.WriteString(`[^/]`)
			i = j
		case '\\':
			if i+1 < len(glob) {
				i++
				b.WriteString(regexp.QuoteMeta(glob[i : i+1]))
			}
		default:
			b.WriteString(regexp.QuoteMeta(string(c)))
		}
	}
	return b.String()
}

// vecValue is the value of the sample of vec with metric m.
func vecValue(vec model.Vector, m model.Metric) model.SampleValue {
	for _, s := range vec {
		if s.Metric.Equal(m) {
			return s.Value
		}
	}
	return 0
}

// samplesQuery selects the raw samples of the last MaxSampleAge of the
// sessions and weight series that match: the newest one of each series
// with its own time (an instant query would stamp every value with the
// evaluation time, hiding a stale scrape).
func (p *Prometheus) samplesQuery(match string) string {
	return fmt.Sprintf(`{__name__=~"%s|%s",%s}[%s]`, metricSessions, metricWeight, match, model.Duration(p.o.MaxSampleAge))
}

// statusQuery selects the state series that are set: the exporter sets
// the series of a server's current state to 1.
func statusQuery(match string) string { return fmt.Sprintf(`%s{%s} == 1`, metricStatus, match) }

// seenQuery finds, per instance and server, the newest sample time over
// seenWindow (at seenStep's resolution): instances whose scrapes stopped.
func (p *Prometheus) seenQuery(match string) string {
	return fmt.Sprintf(`max by (%s, %s, %s) (max_over_time(timestamp(%s{%s})[%s:%s]))`, p.o.InstanceLabel, p.o.ProxyLabel, p.o.ServerLabel,
		metricSessions, match, model.Duration(seenWindow), model.Duration(seenStep))
}

// seriesSince selects the raw samples over window of the sessions series
// of instance in with m's backend and server.
func (p *Prometheus) seriesSince(in string, m model.Metric, window time.Duration) string {
	px, sv := model.LabelName(p.o.ProxyLabel), model.LabelName(p.o.ServerLabel)
	return fmt.Sprintf(`%s{%s=%s,%s=%s,%s=%s}[%s]`, metricSessions, p.o.InstanceLabel, strconv.Quote(in), px, strconv.Quote(string(m[px])),
		sv, strconv.Quote(string(m[sv])), model.Duration(window).String())
}
