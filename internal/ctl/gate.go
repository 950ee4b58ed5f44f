package ctl

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	consul "github.com/hashicorp/consul/api"
	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/state"
)

// The gates, precheck and wait, fail closed: anything they cannot confirm
// (a replica that does not answer, Consul not in sync, an answer withheld)
// makes them fail and say why.

// Precheck checks the deploy pipeline's contract for the servers the
// selectors match, over the whole cluster, once the replica has applied
// every write made before Precheck started: ready and maint pass; drain, a
// weight of 0% (HAProxy shows it as DRAIN), a ramp in progress and anything
// it cannot confirm block. It counts servers, never backend-wide keys. It
// returns how many servers it checked and what blocks; an error means it
// could not check (ErrNoMatch, ErrCannotConfirm, ...). A replica that has
// just started (no leader report yet, no state yet) is waited for until ctx
// ends, not reported at once.
func Precheck(ctx context.Context, o GateOptions) (checked int, blocking []string, err error) {
	if err := o.WaitSynced(ctx); err != nil {
		return 0, nil, err
	}
	fleet, err := o.confirmedFleet(ctx)
	if err != nil {
		return 0, nil, err
	}
	var servers []api.ServerState
	for _, r := range fleet.Servers {
		if r.Server != state.Wildcard {
			servers = append(servers, r)
		}
	}
	for _, sel := range o.Selectors {
		if len(Select(servers, sel)) == 0 {
			return 0, nil, noMatch(sel, fleet.Servers)
		}
	}
	for _, row := range Select(servers, o.Selectors...) {
		checked++
		name := row.Backend + "/" + row.Server
		switch {
		case row.Kind == api.KindWithheld:
			blocking = append(blocking, fmt.Sprintf("%s: cannot confirm: its key is invalid and has no valid value (%s)", name, row.Error))
		case row.Kind == api.KindDrain:
			blocking = append(blocking, fmt.Sprintf("%s is drained%s", name, why(row)))
		case row.AtZero():
			blocking = append(blocking, fmt.Sprintf("%s is at 0%% (HAProxy shows it as DRAIN)%s", name, why(row)))
		case row.Kind == api.KindRamping:
			blocking = append(blocking, fmt.Sprintf("%s is ramping: %s", name, row.Ramping))
		}
	}
	return checked, blocking, nil
}

// confirmedFleet reads the fleet once the view can be trusted (see
// confirmable). A start-up state (the replica holds no state yet, or has
// had no leader report since it started) is read again until ctx ends;
// anything else fails at once.
func (o GateOptions) confirmedFleet(ctx context.Context) (api.StateView, error) {
	var startUp error // the start-up state read last
	for {
		fleet, err := o.Replica.Fleet(ctx)
		if err != nil {
			if startUp != nil && ctx.Err() != nil {
				// --timeout ran out during a read again: the replica
				// answered, and what it said is the reason.
				return fleet, fmt.Errorf("%w (still so when --timeout ran out)", startUp)
			}
			return fleet, fmt.Errorf("%w: %w", ErrCannotConfirm, err)
		}
		err = confirmable(fleet)
		if err == nil || !startingUp(fleet) {
			return fleet, err
		}
		startUp = err
		select {
		case <-ctx.Done():
			return fleet, fmt.Errorf("%w (still so when --timeout ran out)", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// startingUp reports whether the view is that of a replica that has just
// started: it holds no state yet, or no leader has reported a KV sync to it
// since it started.
func startingUp(v api.StateView) bool { return !v.HoldsState || !v.KV.Synced }

// WaitSynced waits until the replica has applied every write made to
// Consul before it was called (the prefix's current index), or fails with
// ErrCannotConfirm when ctx ends first.
func (o GateOptions) WaitSynced(ctx context.Context) error {
	index, err := o.consulIndex(ctx)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrCannotConfirm, err)
	}
	return o.synced(ctx, index)
}

// consulIndex reads Consul's current index of the prefix: every write made
// before it is at or below it. It lists the prefix's keys one level deep
// (?keys&separator=/: "state/" and the like, a few bytes), not the whole
// prefix (11 MB at 50,000 keys): Consul 1.13 answers such a listing with
// the same X-Consul-Index as a recursive read of the prefix (the highest
// modify index under it, deletes included), which is the index the
// leader's watch reports. A one-key read is no substitute: for an existing
// key Consul returns that key's modify index (too low), for a missing key
// the index of the whole KV store, writes outside the prefix included (too
// high: the replica's watch of the prefix might never reach it).
func (o GateOptions) consulIndex(ctx context.Context) (uint64, error) {
	_, meta, err := o.Consul.KV().Keys(o.Prefix, "/", (&consul.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return 0, consulError(ctx, o.ConsulAddr, err, "")
	}
	return meta.LastIndex, nil
}

// synced waits until the replica has applied Consul index index, or ctx
// ends (then it cannot confirm).
func (o GateOptions) synced(ctx context.Context, index uint64) error {
	var behind error // what the replica said last
	for {
		ci, err := o.Replica.Cluster(ctx)
		switch {
		case err != nil && behind != nil && ctx.Err() != nil:
			return behind // ctx ended during a read again: the replica answered, behind
		case err != nil:
			return fmt.Errorf("%w: %w", ErrCannotConfirm, err)
		case ci.KV.SyncedIndex >= index:
			return nil
		}
		behind = fmt.Errorf("%w: replica %s has applied Consul index %d, not yet %d (the writes made before this command): %s",
			ErrCannotConfirm, ci.NodeID, ci.KV.SyncedIndex, index, cmp.Or(ci.KV.Warning, "is the leader syncing?"))
		select {
		case <-ctx.Done():
			return behind
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func why(r api.ServerState) string {
	var parts []string
	if r.By != "" {
		parts = append(parts, "by "+r.By)
	}
	if r.Reason != "" {
		parts = append(parts, r.Reason)
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, ": ") + ")"
}

// confirmable fails when the view cannot be trusted to be the cluster's
// current one: a replica holds no state or did not answer, or Consul is not
// in sync.
func confirmable(v api.StateView) error {
	switch {
	case !v.HoldsState:
		return fmt.Errorf("%w: the replica holds no state yet; ask another replica (HASTATE_ADDR)", ErrCannotConfirm)
	case v.KV.Warning != "":
		return fmt.Errorf("%w: %s", ErrCannotConfirm, v.KV.Warning)
	}
	return Missing(v.Replicas)
}

// GateOptions configure Wait and Precheck.
type GateOptions struct {
	Consul     *consul.Client // to read the Consul index current at the start
	ConsulAddr string         // for messages
	Prefix     string
	Replica    *Replica
	Selectors  []Selector
	Interval   time.Duration // Wait: 0 is 500ms between looks
	// Settled: Wait also waits until no selected server is ramping or
	// expires before ctx's deadline (wait --settled).
	Settled bool
	Out     io.Writer // Wait's progress lines; nil: none
}

// Wait returns once the replica has applied a Consul index at least the
// one current when Wait started (so every write made before it is in),
// with Settled no selected server is ramping or about to expire (before
// ctx's deadline), and every HAProxy that polled a selected server within
// api.PollerTTL, on any replica, was last told that server's current
// answer (a manual probe is no HAProxy: see api.Poll.FromHAProxy). It gives up with
// ErrNotDone when ctx ends, naming what lags; a replica that does not
// answer lags until it does.
func Wait(ctx context.Context, o GateOptions) error {
	if o.Interval == 0 {
		o.Interval = 500 * time.Millisecond
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
	index, err := o.consulIndex(ctx)
	if err != nil {
		return err
	}
	var lag []string
	for {
		last := lag
		lag, err = waitLag(ctx, o, index)
		switch {
		case err != nil && ctx.Err() != nil && len(last) > 0:
			return fmt.Errorf("%w: still waiting for:\n  %s", ErrNotDone, strings.Join(last, "\n  "))
		case err != nil:
			return err
		case len(lag) == 0:
			return nil
		}
		if strings.Join(lag, "") != strings.Join(last, "") {
			fmt.Fprintf(o.Out, "waiting for:\n  %s\n", strings.Join(lag, "\n  "))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: still waiting for:\n  %s", ErrNotDone, strings.Join(lag, "\n  "))
		case <-time.After(o.Interval):
		}
	}
}

// waitLag lists what is not yet current; empty means done.
func waitLag(ctx context.Context, o GateOptions, index uint64) ([]string, error) {
	ci, err := o.Replica.Cluster(ctx)
	if err != nil {
		return nil, err
	}
	if ci.KV.SyncedIndex < index {
		return []string{fmt.Sprintf("replica %s has applied Consul index %d, waiting for %d (the writes made before wait started)", ci.NodeID, ci.KV.SyncedIndex, index)}, nil
	}
	fleet, err := o.Replica.Fleet(ctx)
	if err != nil {
		return nil, err
	}
	if err := Missing(fleet.Replicas); err != nil {
		return []string{err.Error()}, nil
	}
	selected, err := selectedServers(fleet, o.Selectors)
	if err != nil {
		return nil, err
	}
	current := map[string]string{}
	var unsettled []string
	deadline, hasDeadline := ctx.Deadline()
	for name, r := range selected {
		current[name] = r.Answer
		if !o.Settled {
			continue
		}
		switch {
		case r.Ramping != nil:
			unsettled = append(unsettled, fmt.Sprintf("%s is ramping: %s", name, r.Ramping))
		case r.Until != nil && !r.Until.After(time.Now()):
			unsettled = append(unsettled, fmt.Sprintf("%s expired at %s; the leader has yet to apply it", name, r.Until.UTC().Format(time.RFC3339)))
		case r.Until != nil && hasDeadline && r.Until.Before(deadline):
			unsettled = append(unsettled, fmt.Sprintf("%s expires at %s, before --timeout runs out", name, r.Until.UTC().Format(time.RFC3339)))
		}
	}
	if len(unsettled) > 0 {
		sort.Strings(unsettled)
		return unsettled, nil
	}
	pv, err := o.Replica.Pollers(ctx)
	if err != nil {
		return nil, err
	}
	if err := Missing(pv.Replicas); err != nil {
		return []string{err.Error()}, nil
	}
	// The latest poll of each (server, HAProxy) on any replica; a manual
	// probe (a source that asked once, a while ago) is not waited for.
	latest := latestPolls(pv, current)
	var lag []string
	for k, p := range latest {
		if told := toldAnswer(p); told != current[k[0]] {
			lag = append(lag, fmt.Sprintf("HAProxy %s for %s: last told %q by %s %s ago, current %q",
				k[1], k[0], told, p.Replica, time.Since(p.LastAsked).Round(time.Second), current[k[0]]))
		}
	}
	sort.Strings(lag)
	return lag, nil
}

func toldAnswer(p api.Poll) string {
	if p.Withheld {
		return ""
	}
	return p.Answer
}
