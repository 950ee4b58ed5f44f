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
// ramp in progress and anything it cannot confirm block. It returns how
// many servers it checked and what blocks; an error means it could not
// check (ErrNoMatch, ErrCannotConfirm, ...).
func Precheck(ctx context.Context, o GateOptions) (checked int, blocking []string, err error) {
	if err := o.WaitSynced(ctx); err != nil {
		return 0, nil, err
	}
	fleet, err := o.Replica.Fleet(ctx)
	if err != nil {
		return 0, nil, fmt.Errorf("%w: %w", ErrCannotConfirm, err)
	}
	if err := confirmable(fleet); err != nil {
		return 0, nil, err
	}
	sels := o.Selectors
	for _, sel := range sels {
		if len(Select(fleet.Servers, sel)) == 0 {
			return 0, nil, noMatch(sel, fleet.Servers)
		}
	}
	for _, row := range Select(fleet.Servers, sels...) {
		checked++
		name := row.Backend + "/" + row.Server
		switch {
		case row.Ramping != nil:
			blocking = append(blocking, fmt.Sprintf("%s is ramping: %s", name, row.Ramping))
		case row.Withheld:
			blocking = append(blocking, fmt.Sprintf("%s: cannot confirm: its key is invalid and has no valid value (%s)", name, row.Error))
		case row.Answer == state.Drain.String():
			blocking = append(blocking, fmt.Sprintf("%s is drained%s", name, why(row)))
		}
	}
	return checked, blocking, nil
}

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
// before it is at or below it.
func (o GateOptions) consulIndex(ctx context.Context) (uint64, error) {
	_, meta, err := o.Consul.KV().List(o.Prefix, (&consul.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return 0, consulError(ctx, o.ConsulAddr, err, "")
	}
	return meta.LastIndex, nil
}

// synced waits until the replica has applied Consul index index, or ctx
// ends (then it cannot confirm).
func (o GateOptions) synced(ctx context.Context, index uint64) error {
	for {
		ci, err := o.Replica.Cluster(ctx)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrCannotConfirm, err)
		}
		if ci.KV.SyncedIndex >= index {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: replica %s has applied Consul index %d, not yet %d (the writes made before this command): %s",
				ErrCannotConfirm, ci.NodeID, ci.KV.SyncedIndex, index, cmp.Or(ci.KV.Warning, "is the leader syncing?"))
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
	Out        io.Writer     // Wait's progress lines; nil: none
}

// Wait returns once the replica has applied a Consul index at least the
// one current when Wait started (so every write made before it is in), and
// every HAProxy that polled a selected server within api.PollerTTL, on any
// replica, was last told that server's current answer. It gives up with
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
	for k, r := range selected {
		current[k] = r.Answer
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
