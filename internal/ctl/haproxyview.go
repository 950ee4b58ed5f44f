package ctl

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	promapi "github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
)

// HAProxy's own view of its servers, read from Prometheus, which scrapes
// HAProxy's built-in exporter (`http-request use-service
// prometheus-exporter`). hastate only knows what it told each HAProxy;
// what HAProxy applied, and how many sessions it still holds, is HAProxy's
// word, and Prometheus is where the fleet already publishes it.

// The exporter's series this package reads, and its state label.
const (
	metricSessions = "haproxy_server_current_sessions"
	metricWeight   = "haproxy_server_weight"
	metricStatus   = "haproxy_server_status"
	stateLabel     = "state"
)

// Defaults of PrometheusOptions.
const (
	DefaultProxyLabel    = "proxy"
	DefaultServerLabel   = "server"
	DefaultInstanceLabel = "instance"
	// DefaultMaxSampleAge is how old the newest sample of an HAProxy
	// instance may be before it proves nothing: three scrapes at the
	// scrape interval the docs assume (10s), so one failed scrape is not
	// yet an outage.
	DefaultMaxSampleAge = 30 * time.Second
)

// seenWindow is how far back a read looks for HAProxy instances whose
// scrapes stopped: an instance seen within it but with no sample within
// MaxSampleAge is reported stale instead of silently missing.
const seenWindow = 10 * time.Minute

// seenStep is the resolution of the subquery over seenWindow.
const seenStep = 15 * time.Second

const promAdvice = "check --prometheus / HASTATE_PROMETHEUS_URL (Prometheus' HTTP address, e.g. http://prometheus:9090)"

// PrometheusOptions configure NewPrometheus.
type PrometheusOptions struct {
	// URL is Prometheus' HTTP address (--prometheus,
	// HASTATE_PROMETHEUS_URL); a bare host:port gets http://.
	URL string
	// ProxyLabel, ServerLabel and InstanceLabel name the labels that carry
	// the backend, the server and the HAProxy instance; "" means the
	// exporter's proxy and server and Prometheus' instance. Relabelling
	// often renames them.
	ProxyLabel, ServerLabel, InstanceLabel string
	// MaxSampleAge: an HAProxy instance whose newest sample is older than
	// this cannot confirm anything (0: DefaultMaxSampleAge).
	MaxSampleAge time.Duration
	// RoundTripper carries the requests (nil: the client's default).
	RoundTripper http.RoundTripper
	// LookupHost resolves the host of an instance label to addresses, to
	// match it with the HAProxy nodes that poll hastate (nil:
	// net.DefaultResolver). An instance that is an IP address is not
	// resolved.
	LookupHost func(ctx context.Context, host string) ([]string, error)
}

// Prometheus reads HAProxy's exporter series from a Prometheus server.
type Prometheus struct {
	api  promv1.API
	addr string
	o    PrometheusOptions
}

var labelName = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)

// NewPrometheus checks the options and returns a reader; it does not
// connect.
func NewPrometheus(o PrometheusOptions) (*Prometheus, error) {
	o.ProxyLabel = cmp.Or(o.ProxyLabel, DefaultProxyLabel)
	o.ServerLabel = cmp.Or(o.ServerLabel, DefaultServerLabel)
	o.InstanceLabel = cmp.Or(o.InstanceLabel, DefaultInstanceLabel)
	o.MaxSampleAge = cmp.Or(o.MaxSampleAge, DefaultMaxSampleAge)
	if o.LookupHost == nil {
		o.LookupHost = net.DefaultResolver.LookupHost
	}
	addr := strings.TrimSuffix(strings.TrimSpace(o.URL), "/")
	if addr == "" {
		return nil, fmt.Errorf("%w: no Prometheus address: set --prometheus or HASTATE_PROMETHEUS_URL (e.g. http://prometheus:9090), the Prometheus that scrapes HAProxy's exporter", ErrUsage)
	}
	if !strings.Contains(addr, "://") {
		addr = "http://" + addr
	}
	if u, err := url.Parse(addr); err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, fmt.Errorf("%w: --prometheus %q: want http://host:port or host:port", ErrUsage, o.URL)
	}
	names := map[string]string{"--proxy-label": o.ProxyLabel, "--server-label": o.ServerLabel, "--instance-label": o.InstanceLabel}
	seen := map[string]string{}
	for _, flag := range []string{"--proxy-label", "--server-label", "--instance-label"} {
		n := names[flag]
		if !labelName.MatchString(n) || n == stateLabel || n == model.MetricNameLabel {
			return nil, fmt.Errorf("%w: %s %q: want a Prometheus label name other than %s and %s, e.g. %s", ErrUsage, flag, n, stateLabel, model.MetricNameLabel,
				map[string]string{"--proxy-label": DefaultProxyLabel, "--server-label": DefaultServerLabel, "--instance-label": DefaultInstanceLabel}[flag])
		}
		if other, dup := seen[n]; dup {
			return nil, fmt.Errorf("%w: %s and %s both name label %q: each names a different label", ErrUsage, other, flag, n)
		}
		seen[n] = flag
	}
	if o.MaxSampleAge < 0 {
		return nil, fmt.Errorf("%w: --max-sample-age %s: want a positive duration, a few scrape intervals (e.g. 30s)", ErrUsage, o.MaxSampleAge)
	}
	c, err := promapi.NewClient(promapi.Config{Address: addr, RoundTripper: o.RoundTripper})
	if err != nil {
		return nil, fmt.Errorf("%w: --prometheus %q: %v", ErrUsage, o.URL, err)
	}
	return &Prometheus{api: promv1.NewAPI(c), addr: addr, o: o}, nil
}

// Addr is Prometheus' base URL.
func (p *Prometheus) Addr() string { return p.addr }

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
			out = append(out, fmt.Sprintf("%s (newest sample %s old)", in, roundAge(age)))
		}
	}
	sort.Strings(out)
	return out
}

// Read reads, for the servers the selectors match, each HAProxy
// instance's current sessions, weight and state, with the time of the
// newest sample, all evaluated at one instant of Prometheus' clock.
func (p *Prometheus) Read(ctx context.Context, sels []Selector) (Reading, error) {
	rd := Reading{Instances: map[string]time.Time{}}
	v, err := p.query(ctx, "time()", time.Time{})
	if err != nil {
		return rd, err
	}
	now, ok := v.(*model.Scalar)
	if !ok {
		return rd, fmt.Errorf("%w: Prometheus at %s answered time() with a %s, not a scalar: is it Prometheus?", ErrCannotConfirm, p.addr, v.Type())
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
	q := fmt.Sprintf(`{__name__=~"%s|%s",%s}[%s]`, metricSessions, metricWeight, match, model.Duration(p.o.MaxSampleAge))
	v, err = p.query(ctx, q, rd.At)
	if err != nil {
		return rd, err
	}
	mat, ok := v.(model.Matrix)
	if !ok {
		return rd, fmt.Errorf("%w: Prometheus at %s answered %s with a %s, not a matrix", ErrCannotConfirm, p.addr, q, v.Type())
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
	q = fmt.Sprintf(`%s{%s} == 1`, metricStatus, match)
	if v, err = p.query(ctx, q, rd.At); err != nil {
		return rd, err
	}
	vec, ok := v.(model.Vector)
	if !ok {
		return rd, fmt.Errorf("%w: Prometheus at %s answered %s with a %s, not a vector", ErrCannotConfirm, p.addr, q, v.Type())
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
	q = fmt.Sprintf(`max by (%s, %s, %s) (max_over_time(timestamp(%s{%s})[%s:%s]))`, inst, px, sv, metricSessions, match,
		model.Duration(seenWindow), model.Duration(seenStep))
	if v, err = p.query(ctx, q, rd.At); err != nil {
		return rd, err
	}
	if vec, ok = v.(model.Vector); !ok {
		return rd, fmt.Errorf("%w: Prometheus at %s answered %s with a %s, not a vector", ErrCannotConfirm, p.addr, q, v.Type())
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
		q := fmt.Sprintf(`%s{%s=%s,%s=%s,%s=%s}[%s]`, metricSessions, inst, strconv.Quote(in), px, strconv.Quote(string(m[px])),
			sv, strconv.Quote(string(m[sv])), model.Duration(rd.At.Sub(seen)+2*seenStep).String())
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

// vecValue is the value of the sample of vec with metric m.
func vecValue(vec model.Vector, m model.Metric) model.SampleValue {
	for _, s := range vec {
		if s.Metric.Equal(m) {
			return s.Value
		}
	}
	return 0
}

func (p *Prometheus) query(ctx context.Context, q string, at time.Time) (model.Value, error) {
	v, _, _, err := p.api.Query(ctx, q, at)
	if err == nil {
		return v, nil
	}
	var perr *promv1.Error
	if errors.As(err, &perr) && perr.Type != promv1.ErrClient {
		return nil, fmt.Errorf("%w: Prometheus at %s refused %s: %s: %s", ErrCannotConfirm, p.addr, q, perr.Msg, promAdvice)
	}
	return nil, fmt.Errorf("%w: %w", ErrCannotConfirm, callError(ctx, "Prometheus", p.addr, err, promAdvice))
}

// matchers are the label matchers of the servers the selectors match
// (each selector's globs as anchored regular expressions). They may
// select more than the selectors do (backend of one, server of another);
// callers keep only the servers they asked about.
func (p *Prometheus) matchers(sels []Selector) string {
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
		case '[': // valid (ParseSelector checked it): skip to its ']'
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

// hosts resolves each instance to the addresses of its host (the part
// before the port), to match instances with the HAProxy nodes that poll
// hastate (which know them by address).
func (p *Prometheus) hosts(ctx context.Context, instances []string) map[string][]string {
	out := map[string][]string{}
	for _, in := range instances {
		host := in
		if h, _, err := net.SplitHostPort(in); err == nil {
			host = h
		}
		if ip := net.ParseIP(host); ip != nil {
			out[in] = []string{ip.String()}
			continue
		}
		if addrs, err := p.o.LookupHost(ctx, host); err == nil {
			for _, a := range addrs {
				if ip := net.ParseIP(a); ip != nil {
					out[in] = append(out[in], ip.String())
				}
			}
		}
	}
	return out
}

// roundAge renders an age for a message: 0.4s, 12s, 3m10s.
func roundAge(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < 10*time.Second:
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}
