package haproxy

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/hastate/hastate/cmd/hastate/internal/ctl"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/fleet"
)

// IdleOptions configure WaitIdle.
type IdleOptions struct {
	Prometheus *Prometheus
	Replica    *fleet.Replica // the servers the selectors match, and who polls them
	Selectors  []ctl.Selector
	Interval   time.Duration // between reads; 0: 1s
	Out        io.Writer     // progress lines; nil: none
}

// IdleResult says what WaitIdle saw.
type IdleResult struct {
	Servers   int           // selected servers
	Instances int           // HAProxy instances reporting them
	Reads     int           // reads of Prometheus
	Samples   int           // samples those reads returned
	Newest    time.Duration // age of the newest sample at the last read
}

func (r IdleResult) String() string {
	return fmt.Sprintf("%d %s on %d HAProxy %s; newest sample %s old; %s in %s",
		r.Servers, ctl.Plural(r.Servers, "server"), r.Instances, ctl.Plural(r.Instances, "instance"), ctl.RoundAge(r.Newest),
		ctl.PluralN(r.Samples, "sample", "samples"), ctl.PluralN(r.Reads, "read", "reads"))
}

// WaitIdle waits until every HAProxy instance reports no current session
// on each selected server, in a sample taken after WaitIdle started: run
// it once every HAProxy was told the drain (fleet.Wait), and a zero then is
// proof that the server is idle and stays so (a drained server gets no new
// session). While it waits it names the servers and instances that still
// hold sessions, and how many.
//
// It cannot confirm, and fails with ctl.ErrCannotConfirm, when Prometheus does
// not answer, when an instance's newest sample is older than the
// Prometheus' MaxSampleAge, when a selected server has no series, or when
// an HAProxy that polls a selected server is not among the instances
// Prometheus scrapes. When ctx ends first it fails with ctl.ErrNotDone, naming
// what still holds sessions.
func WaitIdle(ctx context.Context, o IdleOptions) (IdleResult, error) {
	var res IdleResult
	if o.Interval == 0 {
		o.Interval = time.Second
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
	servers, pollers, err := selectedPolled(ctx, o.Replica, o.Selectors)
	if err != nil {
		return res, err
	}
	res.Servers = len(servers)
	var since time.Time
	var last []string
	for {
		rd, err := o.Prometheus.Read(ctx, o.Selectors)
		if err != nil {
			if ctx.Err() != nil && len(last) > 0 {
				return res, fmt.Errorf("%w: still waiting for:\n  %s", ctl.ErrNotDone, strings.Join(last, "\n  "))
			}
			return res, err
		}
		res.Reads++
		res.Samples += rd.Samples
		res.Newest = rd.Newest()
		if since.IsZero() {
			// Only a sample scraped after this moment proves anything:
			// every HAProxy had been told by then.
			since = rd.At
		}
		if err := o.Prometheus.covers(ctx, rd, servers, pollers); err != nil {
			return res, err
		}
		busy, instances := idleLag(rd, servers, since)
		res.Instances = instances
		if len(busy) == 0 {
			return res, nil
		}
		if strings.Join(busy, "") != strings.Join(last, "") {
			fmt.Fprintf(o.Out, "waiting for sessions to end (newest sample %s old):\n  %s\n", ctl.RoundAge(res.Newest), strings.Join(busy, "\n  "))
		}
		last = busy
		select {
		case <-ctx.Done():
			return res, fmt.Errorf("%w: still waiting for:\n  %s", ctl.ErrNotDone, strings.Join(busy, "\n  "))
		case <-time.After(o.Interval):
		}
	}
}

// idleLag lists, for the selected servers, the (server, instance) pairs
// that hold sessions or have no sample newer than since; empty means idle.
// It also returns how many instances report the servers.
func idleLag(rd Reading, servers map[string]bool, since time.Time) ([]string, int) {
	var lag []string
	instances := map[string]bool{}
	for _, r := range rd.Servers {
		if !servers[r.Name()] {
			continue
		}
		instances[r.Instance] = true
		age := ctl.RoundAge(rd.At.Sub(r.Sample))
		switch {
		case r.Sessions > 0:
			lag = append(lag, fmt.Sprintf("%s on HAProxy %s: %d %s (sample %s old)", r.Name(), r.Instance, r.Sessions, ctl.Plural(r.Sessions, "session"), age))
		case r.Sessions < 0 || !r.Sample.After(since):
			lag = append(lag, fmt.Sprintf("%s on HAProxy %s: no sample since the wait began yet (newest %s old)", r.Name(), r.Instance, age))
		}
	}
	return lag, len(instances)
}

// covers fails with ctl.ErrCannotConfirm unless the reading can speak for
// every selected server: each has series, no instance reporting them is
// stale, and every HAProxy that polls one of them (an address) is an
// instance Prometheus scrapes.
func (p *Prometheus) covers(ctx context.Context, rd Reading, servers map[string]bool, pollers map[string][]string) error {
	have := map[string]bool{}
	reporting := Reading{At: rd.At, Instances: map[string]time.Time{}} // the instances of selected servers
	for _, r := range rd.Servers {
		if servers[r.Name()] {
			have[r.Name()] = true
			reporting.Instances[r.Instance] = rd.Instances[r.Instance]
		}
	}
	var missing []string
	for s := range servers {
		if !have[s] {
			missing = append(missing, s)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		return fmt.Errorf("%w: Prometheus at %s has no %s series for %s within the last %s (labels %s, %s, %s): is every HAProxy's exporter scraped, "+
			"and are the label names right (--proxy-label, --server-label, --instance-label)?", ctl.ErrCannotConfirm, p.addr, metricSessions,
			strings.Join(missing, ", "), p.o.MaxSampleAge, p.o.ProxyLabel, p.o.ServerLabel, p.o.InstanceLabel)
	}
	if stale := reporting.Stale(p.o.MaxSampleAge); len(stale) > 0 {
		return fmt.Errorf("%w: stale samples from HAProxy %s: older than --max-sample-age %s, so they prove nothing; "+
			"is Prometheus scraping them (its targets page, the up series)?", ctl.ErrCannotConfirm, strings.Join(stale, ", "), p.o.MaxSampleAge)
	}
	if unseen := p.unscraped(ctx, slices.Collect(maps.Keys(reporting.Instances)), pollers); len(unseen) > 0 {
		return fmt.Errorf("%w: %s; Prometheus scrapes %s: scrape every HAProxy's exporter, with an instance label whose host is the address its agent checks come from (docs/deploy.md)",
			ctl.ErrCannotConfirm, strings.Join(unseen, "; "), ctl.OrNone(slices.Sorted(maps.Keys(reporting.Instances))))
	}
	return nil
}

// selectedPolled expands the selectors to the servers the cluster knows
// (not backend-wide keys), and lists by address the HAProxy nodes that
// polled each within api.PollerTTL.
func selectedPolled(ctx context.Context, r *fleet.Replica, sels []ctl.Selector) (map[string]bool, map[string][]string, error) {
	view, err := r.Fleet(ctx, sels...)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ctl.ErrCannotConfirm, err)
	}
	if _, err := r.Live(ctx, view.Replicas); err != nil {
		return nil, nil, err
	}
	rows, err := fleet.SelectedServers(view, sels)
	if err != nil {
		return nil, nil, err
	}
	servers := map[string]bool{}
	for k := range rows {
		servers[k] = true
	}
	if len(servers) == 0 {
		return nil, nil, fmt.Errorf("%w: %s select only backend-wide keys, no server an HAProxy polls: nothing to ask HAProxy about", ctl.ErrCannotConfirm, ctl.SelList(sels))
	}
	pv, err := r.Pollers(ctx, sels...)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ctl.ErrCannotConfirm, err)
	}
	if _, err := r.Live(ctx, pv.Replicas); err != nil {
		return nil, nil, err
	}
	pollers := map[string][]string{}
	for _, p := range fleet.LatestPolls(pv, servers) {
		pollers[p.HAProxy] = append(pollers[p.HAProxy], p.Backend+"/"+p.Server)
	}
	for ip := range pollers {
		sort.Strings(pollers[ip])
	}
	return servers, pollers, nil
}
