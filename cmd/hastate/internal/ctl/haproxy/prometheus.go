package haproxy

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/hastate/hastate/cmd/hastate/internal/ctl"
	promapi "github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
)

// The Prometheus client: its options, their checks, and one query.

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
	// The one check of --max-sample-age: 0 is the default, negative is
	// refused.
	if o.MaxSampleAge < 0 {
		return nil, fmt.Errorf("%w: --max-sample-age %s: want a positive duration, a few scrape intervals (e.g. 30s), or 0 for %s", ctl.ErrUsage, o.MaxSampleAge, DefaultMaxSampleAge)
	}
	o.MaxSampleAge = cmp.Or(o.MaxSampleAge, DefaultMaxSampleAge)
	if o.LookupHost == nil {
		o.LookupHost = net.DefaultResolver.LookupHost
	}
	addr := strings.TrimSuffix(strings.TrimSpace(o.URL), "/")
	if addr == "" {
		return nil, fmt.Errorf("%w: no Prometheus address: set --prometheus or HASTATE_PROMETHEUS_URL (e.g. http://prometheus:9090), the Prometheus that scrapes HAProxy's exporter", ctl.ErrUsage)
	}
	if !strings.Contains(addr, "://") {
		addr = "http://" + addr
	}
	if u, err := url.Parse(addr); err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, fmt.Errorf("%w: --prometheus %q: want http://host:port or host:port", ctl.ErrUsage, o.URL)
	}
	names := map[string]string{"--proxy-label": o.ProxyLabel, "--server-label": o.ServerLabel, "--instance-label": o.InstanceLabel}
	seen := map[string]string{}
	for _, flag := range []string{"--proxy-label", "--server-label", "--instance-label"} {
		n := names[flag]
		if !labelName.MatchString(n) || n == stateLabel || n == model.MetricNameLabel {
			return nil, fmt.Errorf("%w: %s %q: want a Prometheus label name other than %s and %s, e.g. %s", ctl.ErrUsage, flag, n, stateLabel, model.MetricNameLabel,
				map[string]string{"--proxy-label": DefaultProxyLabel, "--server-label": DefaultServerLabel, "--instance-label": DefaultInstanceLabel}[flag])
		}
		if other, dup := seen[n]; dup {
			return nil, fmt.Errorf("%w: %s and %s both name label %q: each names a different label", ctl.ErrUsage, other, flag, n)
		}
		seen[n] = flag
	}
	c, err := promapi.NewClient(promapi.Config{Address: addr, RoundTripper: o.RoundTripper})
	if err != nil {
		return nil, fmt.Errorf("%w: --prometheus %q: %v", ctl.ErrUsage, o.URL, err)
	}
	return &Prometheus{api: promv1.NewAPI(c), addr: addr, o: o}, nil
}

// Addr is Prometheus' base URL.
func (p *Prometheus) Addr() string { return p.addr }

func (p *Prometheus) query(ctx context.Context, q string, at time.Time) (model.Value, error) {
	v, _, _, err := p.api.Query(ctx, q, at)
	if err == nil {
		return v, nil
	}
	var perr *promv1.Error
	if errors.As(err, &perr) && perr.Type != promv1.ErrClient {
		return nil, fmt.Errorf("%w: Prometheus at %s refused %s: %s: %s", ctl.ErrCannotConfirm, p.addr, q, perr.Msg, promAdvice)
	}
	return nil, fmt.Errorf("%w: %w", ctl.ErrCannotConfirm, ctl.CallError(ctx, "Prometheus", p.addr, err, promAdvice))
}
