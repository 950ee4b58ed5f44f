package kvsync

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"
	hapi "github.com/hastate/hastate/api"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"go.uber.org/zap"
)

// Probe checks, on every replica, whether this replica can read the KV
// prefix. Only the leader watches Consul; the probe is how a follower knows
// it could take over the watch, and how a leader knows it has lost Consul.
type Probe struct {
	o         ProbeOptions
	reachable prometheus.Gauge
	denied    prometheus.Gauge

	mu sync.Mutex
	h  ProbeHealth
}

// ProbeHealth is the result of a Probe's checks.
type ProbeHealth struct {
	// Reachable: the last check succeeded.
	Reachable bool
	// FailingSince is when checks began to fail (zero when reachable).
	FailingSince time.Time
	// Checked is when the last check ended, LastOK when the last
	// successful one did.
	Checked, LastOK time.Time
	// TokenProblem is set while Consul refuses this replica's token
	// what the mirror needs (CheckRead); a Consul that cannot be asked
	// leaves it as it was.
	TokenProblem *hapi.TokenProblem
	// Verdict is the mirror verdict of the last check: api.MirrorOK when
	// it succeeded, else why this replica could not mirror (Consul
	// unreachable, not Consul, the token), with the error as its detail.
	Verdict hapi.MirrorVerdict
}

// ProbeOptions configure a Probe. Client and Prefix are required.
type ProbeOptions struct {
	Client     *api.Client
	Prefix     string
	Interval   time.Duration         // 0: 2s between checks
	Timeout    time.Duration         // 0: 2s per check
	Logger     *zap.Logger           // nil: no logs
	Registerer prometheus.Registerer // nil: metric not registered
	Token      *Token                // the token Client sends, for its accessor ID; nil: none named
}

// NewProbe validates the options.
func NewProbe(o ProbeOptions) (*Probe, error) {
	if o.Client == nil || o.Prefix == "" {
		return nil, fmt.Errorf("%w: probe needs a Consul client and a prefix", ErrInvalidOptions)
	}
	if o.Interval <= 0 {
		o.Interval = 2 * time.Second
	}
	if o.Timeout <= 0 {
		o.Timeout = 2 * time.Second
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	f := promauto.With(o.Registerer)
	return &Probe{o: o, reachable: f.NewGauge(prometheus.GaugeOpts{
		Name: "hastate_kv_probe_reachable",
		Help: "Per replica: 1 if this replica's last check of Consul KV (every replica checks, leader or not) succeeded.",
	}), denied: f.NewGauge(prometheus.GaugeOpts{
		Name: "hastate_consul_token_denied",
		Help: "Per replica: 1 while Consul refuses this replica's token (403) a read or listing under the prefix: a leader with it applies nothing and holds the last state; see /v1/cluster consul_token for the accessor ID.",
	})}, nil
}

// Run checks Consul every Interval until ctx is done.
func (p *Probe) Run(ctx context.Context) error {
	t := time.NewTicker(p.o.Interval)
	defer t.Stop()
	for {
		p.check(ctx)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

func (p *Probe) check(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, p.o.Timeout)
	defer cancel()
	// The probe asks what the watch asks, so that it fails where the
	// watch would, and what the watch asks before it applies a listing
	// that could hide keys (CheckRead): a consistent listing of the
	// prefix (the list policy, every key under it: a token that cannot
	// read some is refused as filtered), only Consul's own answer counts
	// (checkConsulAnswer), and direct reads under the prefix that answer
	// 403 where the token may not read (the anonymous token lists the
	// prefix as empty). Keys to the first "/" keep it small.
	accessor := ""
	if p.o.Token != nil {
		accessor = p.o.Token.AccessorID()
	}
	err := CheckRead(ctx, p.o.Client, p.o.Prefix, accessor)
	if errors.Is(ctx.Err(), context.Canceled) {
		return
	}
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	h := &p.h
	h.Checked = now
	var te *TokenError
	switch {
	case errors.As(err, &te):
		since := now
		if h.TokenProblem != nil {
			since = h.TokenProblem.Since
		} else {
			p.o.Logger.Error("Consul refuses this replica's token: as leader it would hold the last state and apply nothing",
				zap.Error(err), zap.String("accessor_id", te.AccessorID))
		}
		h.TokenProblem = te.Problem(since)
		p.denied.Set(1)
	case err == nil:
		if h.TokenProblem != nil {
			p.o.Logger.Info("Consul accepts this replica's token again: it may read the prefix",
				zap.String("accessor_id", accessor), zap.Duration("was_refused_for", now.Sub(h.TokenProblem.Since).Round(time.Millisecond)))
		}
		h.TokenProblem = nil
		p.denied.Set(0)
	}
	switch {
	case err == nil:
		if !h.Reachable && !h.FailingSince.IsZero() {
			p.o.Logger.Info("Consul reachable again from this replica", zap.Duration("was_down_for", now.Sub(h.FailingSince).Round(time.Millisecond)))
		}
		h.Reachable, h.FailingSince, h.LastOK = true, time.Time{}, now
		h.Verdict = hapi.MirrorVerdict{Reason: hapi.MirrorOK}
		p.reachable.Set(1)
		return
	case h.Reachable || h.FailingSince.IsZero():
		if te == nil {
			p.o.Logger.Warn("Consul not reachable from this replica (check CONSUL_HTTP_ADDR / --consul-addr, TLS and token)", zap.Error(err))
		}
		h.Reachable, h.FailingSince = false, now
		p.reachable.Set(0)
	}
	h.Verdict = hapi.MirrorVerdict{Reason: MirrorReasonOf(err), Detail: err.Error() + "; " + consulHint(err), Since: h.FailingSince}
}

// Health reports the checks so far.
func (p *Probe) Health() ProbeHealth {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.h
}
