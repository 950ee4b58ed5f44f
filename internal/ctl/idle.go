package ctl

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/state"
)

// IdleOptions configure WaitIdle.
type IdleOptions struct {
	Prometheus *Prometheus
	Replica    *Replica // the servers the selectors match, and who polls them
	Selectors  []Selector
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
	return fmt.Sprintf("%d %s on %d HAProxy %s; newest sample %s old; %d samples in %d reads",
		r.Servers, plural(r.Servers, "server"), r.Instances, plural(r.Instances, "instance"), roundAge(r.Newest), r.Samples, r.Reads)
}

// WaitIdle waits until every HAProxy instance reports no current session
// on each selected server, in a sample taken after WaitIdle started: run
// it once every HAProxy was told the drain (Wait), and a zero then is
// proof that the server is idle and stays so (a drained server gets no new
// session). While it waits it names the servers and instances that still
// hold sessions, and how many.
//
// It cannot confirm, and fails with ErrCannotConfirm, when Prometheus does
// not answer, when an instance's newest sample is older than the
// Prometheus' MaxSampleAge, when a selected server has no series, or when
// an HAProxy that polls a selected server is not among the instances
// Prometheus scrapes. When ctx ends first it fails with ErrNotDone, naming
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
				return res, fmt.Errorf("%w: still waiting for:\n  %s", ErrNotDone, strings.Join(last, "\n  "))
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
			fmt.Fprintf(o.Out, "waiting for sessions to end (newest sample %s old):\n  %s\n", roundAge(res.Newest), strings.Join(busy, "\n  "))
		}
		last = busy
		select {
		case <-ctx.Done():
			return res, fmt.Errorf("%w: still waiting for:\n  %s", ErrNotDone, strings.Join(busy, "\n  "))
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
		age := roundAge(rd.At.Sub(r.Sample))
		switch {
		case r.Sessions > 0:
			lag = append(lag, fmt.Sprintf("%s on HAProxy %s: %d %s (sample %s old)", r.Name(), r.Instance, r.Sessions, plural(r.Sessions, "session"), age))
		case r.Sessions < 0 || !r.Sample.After(since):
			lag = append(lag, fmt.Sprintf("%s on HAProxy %s: no sample since the wait began yet (newest %s old)", r.Name(), r.Instance, age))
		}
	}
	return lag, len(instances)
}

// covers fails with ErrCannotConfirm unless the reading can speak for
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
			"and are the label names right (--proxy-label, --server-label, --instance-label)?", ErrCannotConfirm, p.addr, metricSessions,
			strings.Join(missing, ", "), p.o.MaxSampleAge, p.o.ProxyLabel, p.o.ServerLabel, p.o.InstanceLabel)
	}
	if stale := reporting.Stale(p.o.MaxSampleAge); len(stale) > 0 {
		return fmt.Errorf("%w: stale samples from HAProxy %s: older than --max-sample-age %s, so they prove nothing; "+
			"is Prometheus scraping them (its targets page, the up series)?", ErrCannotConfirm, strings.Join(stale, ", "), p.o.MaxSampleAge)
	}
	if unseen := p.unscraped(ctx, slices.Collect(maps.Keys(reporting.Instances)), pollers); len(unseen) > 0 {
		return fmt.Errorf("%w: %s; Prometheus scrapes %s: scrape every HAProxy's exporter, with an instance label whose host is the address its agent checks come from (docs/deploy.md)",
			ErrCannotConfirm, strings.Join(unseen, "; "), orNone(slices.Sorted(maps.Keys(reporting.Instances))))
	}
	return nil
}

// selectedPolled expands the selectors to the servers the cluster knows
// (not backend-wide keys), and lists by address the HAProxy nodes that
// polled each within api.PollerTTL.
func selectedPolled(ctx context.Context, r *Replica, sels []Selector) (map[string]bool, map[string][]string, error) {
	fleet, err := r.Fleet(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrCannotConfirm, err)
	}
	if err := Missing(fleet.Replicas); err != nil {
		return nil, nil, err
	}
	rows, err := selectedServers(fleet, sels)
	if err != nil {
		return nil, nil, err
	}
	servers := map[string]bool{}
	for k := range rows {
		servers[k] = true
	}
	if len(servers) == 0 {
		return nil, nil, fmt.Errorf("%w: %s select only backend-wide keys, no server an HAProxy polls: nothing to ask HAProxy about", ErrCannotConfirm, selList(sels))
	}
	pv, err := r.Pollers(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrCannotConfirm, err)
	}
	if err := Missing(pv.Replicas); err != nil {
		return nil, nil, err
	}
	pollers := map[string][]string{}
	for _, p := range latestPolls(pv, servers) {
		pollers[p.HAProxy] = append(pollers[p.HAProxy], p.Backend+"/"+p.Server)
	}
	for ip := range pollers {
		sort.Strings(pollers[ip])
	}
	return servers, pollers, nil
}

// selectedServers maps backend/server to the row of each server the
// selectors match (backend-wide keys are not servers); a selector that
// matches nothing is ErrNoMatch.
func selectedServers(fleet api.StateView, sels []Selector) (map[string]api.ServerState, error) {
	out := map[string]api.ServerState{}
	for _, sel := range sels {
		rows := Select(fleet.Servers, sel)
		if len(rows) == 0 {
			return nil, noMatch(sel, fleet.Servers)
		}
		for _, r := range rows {
			if r.Server != state.Wildcard {
				out[r.Backend+"/"+r.Server] = r
			}
		}
	}
	return out, nil
}

// latestPolls is, per (server, HAProxy), the latest poll on any replica
// of an HAProxy that polls one of servers (by backend/server) now: a
// manual probe is none.
func latestPolls[V any](pv api.PollersView, servers map[string]V) map[[2]string]api.Poll {
	latest := map[[2]string]api.Poll{}
	now := time.Now()
	for _, p := range api.MergePolls(pv.Pollers) {
		k := [2]string{p.Backend + "/" + p.Server, p.HAProxy}
		if _, sel := servers[k[0]]; sel && p.Polling(now) {
			latest[k] = p
		}
	}
	return latest
}

func selList(sels []Selector) string {
	var s []string
	for _, x := range sels {
		s = append(s, x.String())
	}
	return strings.Join(s, " ")
}

func plural(n int, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}
