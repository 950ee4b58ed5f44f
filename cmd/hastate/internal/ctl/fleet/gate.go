package fleet

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	consul "github.com/hashicorp/consul/api"
	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl"
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
// could not check (ctl.ErrNoMatch, ctl.ErrCannotConfirm, ...). A replica that has
// just started (no leader report yet, no state yet) is waited for until ctx
// ends, not reported at once.
func Precheck(ctx context.Context, o GateOptions) (checked int, blocking []string, err error) {
	if err := o.WaitSynced(ctx); errors.Is(err, ctl.ErrWrongReplica) {
		// A prefix (or Consul) no replica there reads: precheck cannot
		// say anything about what is served, which is not "blocked".
		return 0, nil, fmt.Errorf("%w: %w", ctl.ErrCannotConfirm, err)
	} else if err != nil {
		return 0, nil, err
	}
	fleet, err := o.ConfirmedFleet(ctx)
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
		if len(ctl.Select(servers, sel)) == 0 {
			return 0, nil, ctl.NoMatch(sel, KnownRows(fleet))
		}
	}
	for _, row := range ctl.Select(servers, o.Selectors...) {
		checked++
		name := row.Backend + "/" + row.Server
		switch {
		case row.Kind == api.KindWithheld:
			blocking = append(blocking, Withheld(o.Prefix, row))
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

// ConfirmedFleet reads the servers o.Selectors match once the view can be
// trusted (see Confirmable and Replica.Live). A start-up state (the replica
// holds no state yet, or has had no leader report since it started) is
// read again until ctx ends; anything else fails at once.
func (o GateOptions) ConfirmedFleet(ctx context.Context) (api.StateView, error) {
	var last error // the start-up state seen last
	for {
		fleet, err := o.Replica.Fleet(ctx, o.Selectors...)
		switch {
		case err != nil && ctx.Err() != nil && last != nil:
			return fleet, fmt.Errorf("%w (still so when --timeout ran out)", last) // the deadline, not the replica
		case err != nil:
			return fleet, fmt.Errorf("%w: %w", ctl.ErrCannotConfirm, err)
		}
		settled, leaderless := o.leaderless(ctx)
		switch {
		case settled:
			return fleet, leaderless
		case leaderless != nil:
			err = leaderless // an election: wait for its end
		default:
			err = Confirmable(fleet)
			if err == nil {
				err = o.live(ctx, fleet.Replicas)
			}
		}
		last = err
		if err == nil || (leaderless == nil && !startingUp(fleet)) {
			return fleet, err
		}
		select {
		case <-ctx.Done():
			return fleet, fmt.Errorf("%w (still so when --timeout ran out)", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// leaderless is NoLeader of the replica's view of the raft cluster; nil
// also when that view cannot be read (the read that follows says why).
func (o GateOptions) leaderless(ctx context.Context) (settled bool, err error) {
	ci, cerr := o.Replica.Cluster(ctx)
	if cerr != nil {
		return false, nil
	}
	return NoLeader(ci)
}

// startingUp reports whether the view is that of a replica that has just
// started: it holds no state yet, or no leader has reported a KV sync to it
// since it started.
func startingUp(v api.StateView) bool { return !v.HoldsState || !v.KV.Synced }

// WaitSynced waits until the replica has applied every write made to
// Consul before it was called (the prefix's current index), or fails with
// ctl.ErrCannotConfirm when ctx ends first.
func (o GateOptions) WaitSynced(ctx context.Context) error {
	if err := CheckReplica(ctx, o.Consul, o.ConsulAddr, o.Prefix, o.Replica); err != nil {
		return err
	}
	index, err := o.ConsulIndex(ctx)
	if err != nil {
		return fmt.Errorf("%w: %w", ctl.ErrCannotConfirm, err)
	}
	return o.Synced(ctx, index)
}

// ConsulIndex reads Consul's current index of the prefix: every write made
// before it is at or below it. It lists the prefix's keys one level deep
// (?keys&separator=/: "state/" and the like, a few bytes), not the whole
// prefix (11 MB at 50,000 keys): Consul 1.13 answers such a listing with
// the same X-Consul-Index as a recursive read of the prefix (the highest
// modify index under it, deletes included), which is the index the
// leader's watch reports. A one-key read is no substitute: for an existing
// key Consul returns that key's modify index (too low), for a missing key
// the index of the whole KV store, writes outside the prefix included (too
// high: the replica's watch of the prefix might never reach it).
func (o GateOptions) ConsulIndex(ctx context.Context) (uint64, error) {
	// Consistent: right after a Consul restart the default mode can
	// answer an older index (even an empty prefix), and a gate would then
	// pass on a replica that lacks the latest writes.
	_, meta, err := o.Consul.KV().Keys(o.Prefix, "/", (&consul.QueryOptions{RequireConsistent: true}).WithContext(ctx))
	if err != nil {
		return 0, ctl.ConsulError(ctx, o.ConsulAddr, err, "")
	}
	return meta.LastIndex, nil
}

// Synced waits until the replica has applied Consul index index, or ctx
// ends (then it cannot confirm).
func (o GateOptions) Synced(ctx context.Context, index uint64) error {
	var last *api.ClusterInfo
	behind := func(ci api.ClusterInfo) error {
		if _, err := NoLeader(ci); err != nil {
			return err // why it is behind: nothing is applied without a leader
		}
		return fmt.Errorf("%w: replica %s has applied Consul index %d of prefix %q, not yet %d (the writes made before this command): %s",
			ctl.ErrCannotConfirm, ci.NodeID, ci.KV.SyncedIndex, o.Prefix, index, cmp.Or(ci.KV.Warning, "is the leader syncing?"))
	}
	for {
		ci, err := o.Replica.Cluster(ctx)
		switch {
		case err != nil && ctx.Err() != nil && last != nil:
			return behind(*last) // the deadline, not the replica
		case err != nil:
			return fmt.Errorf("%w: %w", ctl.ErrCannotConfirm, err)
		case ci.KV.SyncedIndex >= index:
			return nil
		}
		if settled, err := NoLeader(ci); settled {
			return err // no election is under way: waiting changes nothing
		}
		last = &ci
		select {
		case <-ctx.Done():
			return behind(ci)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Withheld says, for a server whose answer every replica withholds (its
// key is invalid and has no last valid value), that it is not told
// anything, which key is at fault and how to fix it. wait and precheck say
// these same words and exit 1 for it: the cluster was read well enough to
// know the answer is withheld (not "cannot confirm", exit 4); what blocks
// is a value in KV that an operator must fix.
func Withheld(prefix string, row api.ServerState) string {
	name := row.Backend + "/" + row.Server
	key, sel := "its key", name
	if row.Key != "" {
		key = fmt.Sprintf("key %s holds %q, which", prefix+row.Key, row.Value)
	}
	if strings.HasSuffix(row.Key, "/"+state.Wildcard) {
		sel = row.Backend + "/" + state.Wildcard // the backend-wide key is at fault
	}
	return fmt.Sprintf("%s: not told: every replica withholds its answer (HAProxy keeps its last state), "+
		"because %s is invalid (%s) and has no last valid value; "+
		"fix the key: hastate ready|drain|maint %s, hastate weight <N>%% %s, or hastate clear %s",
		name, key, cmp.Or(row.Error, "invalid value"), sel, sel, sel)
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

// Confirmable fails when the view cannot be trusted to be the cluster's
// current one: the replica holds no state, or Consul is not in sync.
// Whether the replicas that answered are enough is Replica.Live's.
func Confirmable(v api.StateView) error {
	switch {
	case !v.HoldsState:
		return fmt.Errorf("%w: the replica holds no state yet; ask another replica (HASTATE_ADDR)", ctl.ErrCannotConfirm)
	case v.KV.Warning != "":
		return fmt.Errorf("%w: %s", ctl.ErrCannotConfirm, v.KV.Warning)
	}
	return nil
}

// repeatless writes what it is given unless it is what it wrote last.
type repeatless struct {
	w    io.Writer
	last string
}

func (r *repeatless) Write(p []byte) (int, error) {
	if string(p) == r.last {
		return len(p), nil
	}
	r.last = string(p)
	return r.w.Write(p)
}

// live is Replica.Live, its note said on Notes.
func (o GateOptions) live(ctx context.Context, answers []api.ReplicaAnswer) error {
	note, err := o.Replica.Live(ctx, answers)
	if note != "" && o.Notes != nil {
		fmt.Fprintln(o.Notes, "note:", note)
	}
	return err
}

// GateOptions configure Wait and Precheck.
type GateOptions struct {
	Consul     *consul.Client // to read the Consul index current at the start
	ConsulAddr string         // for messages
	Prefix     string
	Replica    *Replica
	Selectors  []ctl.Selector
	Interval   time.Duration // Wait: 0 is 500ms between looks
	// Settled: Wait also waits until no selected server is ramping or
	// expires before ctx's deadline (wait --settled).
	Settled bool
	Out     io.Writer // Wait's progress lines; nil: none
	// Notes receives what the operator should know but does not stop the
	// command (a replica down that the others make up for); nil: none.
	Notes io.Writer
}

// Wait returns once the replica has applied a Consul index at least the
// one current when Wait started (so every write made before it is in),
// with Settled no selected server is ramping or about to expire (before
// ctx's deadline), and every HAProxy that polled a selected server within
// api.PollerTTL, on any replica, was last told that server's current
// answer (a manual probe is no HAProxy: see api.Poll.FromHAProxy). It gives up with
// ctl.ErrNotDone when ctx ends, naming what lags; a replica that does not
// answer lags until it does.
func Wait(ctx context.Context, o GateOptions) error {
	if o.Interval == 0 {
		o.Interval = 500 * time.Millisecond
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
	if o.Notes != nil {
		o.Notes = &repeatless{w: o.Notes} // Wait looks again and again
	}
	if err := CheckReplica(ctx, o.Consul, o.ConsulAddr, o.Prefix, o.Replica); err != nil {
		return err
	}
	index, err := o.ConsulIndex(ctx)
	if err != nil {
		return err
	}
	var lag []string
	var unconfirmed bool
	timedOut := func(lag []string, unconfirmed bool) error {
		kind := ctl.ErrNotDone
		if unconfirmed {
			// A replica that does not answer, or has not applied the
			// writes: cannot confirm (exit 4), not "not done".
			kind = ctl.ErrCannotConfirm
		}
		return fmt.Errorf("%w: still waiting for:\n  %s", kind, strings.Join(lag, "\n  "))
	}
	for {
		last, lastUnconfirmed := lag, unconfirmed
		lag, unconfirmed, err = waitLag(ctx, o, index)
		switch {
		case (err != nil || len(lag) > 0) && ctx.Err() != nil && len(last) > 0:
			// The deadline cut this look short (a read of it "did not
			// answer in time"): the last whole look says what lags.
			return timedOut(last, lastUnconfirmed)
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
			return timedOut(lag, unconfirmed)
		case <-time.After(o.Interval):
		}
	}
}

// waitLag lists what is not yet current; empty means done. unconfirmed:
// what lags is that the cluster cannot be seen (a replica behind Consul,
// one that does not answer), not an HAProxy or a ramp.
func waitLag(ctx context.Context, o GateOptions, index uint64) (lag []string, unconfirmed bool, err error) {
	ci, err := o.Replica.Cluster(ctx)
	if err != nil {
		return nil, false, err
	}
	if settled, err := NoLeader(ci); settled {
		return nil, false, err
	} else if err != nil {
		return []string{err.Error()}, true, nil // an election: wait for its end
	}
	if ci.KV.SyncedIndex < index {
		return []string{fmt.Sprintf("replica %s has applied Consul index %d of prefix %q, waiting for %d (the writes made before wait started)", ci.NodeID, ci.KV.SyncedIndex, o.Prefix, index)}, true, nil
	}
	fleet, err := o.Replica.Fleet(ctx, o.Selectors...)
	if err != nil {
		return nil, false, err
	}
	if err := o.live(ctx, fleet.Replicas); err != nil {
		return []string{err.Error()}, true, nil
	}
	selected, err := SelectedServers(fleet, o.Selectors)
	if err != nil {
		return nil, false, err
	}
	current := map[string]string{}
	var unsettled, withheld []string
	deadline, hasDeadline := ctx.Deadline()
	for name, r := range selected {
		current[name] = r.Answer
		if r.Kind == api.KindWithheld {
			withheld = append(withheld, Withheld(o.Prefix, r))
		}
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
	if len(withheld) > 0 {
		// No HAProxy can be told an answer no replica gives; it takes a
		// write to KV, not time: fail now, as precheck does (exit 1).
		sort.Strings(withheld)
		return nil, false, ctl.Errorf(ctl.ErrNotDone, "%s", strings.Join(withheld, "\n"))
	}
	if len(unsettled) > 0 {
		sort.Strings(unsettled)
		return unsettled, false, nil
	}
	pv, err := o.Replica.Pollers(ctx, o.Selectors...)
	if err != nil {
		return nil, false, err
	}
	if err := o.live(ctx, pv.Replicas); err != nil {
		return []string{err.Error()}, true, nil
	}
	if Missing(pv.Replicas) != nil {
		// A replica is down: "seen by a live replica" is decided per
		// (server, HAProxy) pair, from the polls of the whole backends.
		if pv, err = o.Replica.Pollers(ctx, BackendsOf(o.Selectors)...); err != nil {
			return nil, false, err
		}
		if err := o.live(ctx, pv.Replicas); err != nil {
			return []string{err.Error()}, true, nil
		}
		if unseen := UnseenPairs(pv, current, time.Now()); len(unseen) > 0 {
			return unseen, true, nil
		}
	}
	// The latest poll of each (server, HAProxy) on any replica; a manual
	// probe (a source that asked once, a while ago) is not waited for.
	latest := LatestPolls(pv, current)
	now := time.Now()
	for k, p := range latest {
		told := ToldAnswer(p)
		if told == current[k[0]] {
			continue
		}
		since := now.Sub(p.LastAsked)
		if since > api.ProbeGrace {
			// An HAProxy polls every agent-inter: one silent this long
			// has stopped (killed, its check disabled). It is waited for
			// (it has not been told) until it is forgotten.
			lag = append(lag, fmt.Sprintf("HAProxy %s for %s: has not polled for %s (last told %q by %s, current %q); it drops out of the wait %s after its last poll, in %s",
				k[1], k[0], since.Round(time.Second), told, p.Replica, current[k[0]], api.PollerTTL, (api.PollerTTL-since).Round(time.Second)))
			continue
		}
		lag = append(lag, fmt.Sprintf("HAProxy %s for %s: last told %q by %s %s ago, current %q",
			k[1], k[0], told, p.Replica, since.Round(time.Second), current[k[0]]))
	}
	sort.Strings(lag)
	return lag, false, nil
}

func ToldAnswer(p api.Poll) string {
	if p.Withheld {
		return ""
	}
	return p.Answer
}
