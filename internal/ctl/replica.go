package ctl

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/state"
)

// Replica reads what the cluster knows from one hastate replica.
type Replica struct {
	c *api.Client
}

const replicaAdvice = "check HASTATE_ADDR / --addr (a replica's HTTP address, port 9778) or ask another replica"

// NewReplica returns a reader for the replica at addr (a URL, or a bare
// host:port).
func NewReplica(addr string) (*Replica, error) {
	c, err := api.NewClient(addr, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: HASTATE_ADDR / --addr: %v", ErrUsage, err)
	}
	return &Replica{c: c}, nil
}

// Addr is the replica's base URL.
func (r *Replica) Addr() string { return r.c.Addr() }

// explain says why a call to the replica failed; it is ErrCannotConfirm.
func (r *Replica) explain(ctx context.Context, err error) error {
	var se *api.StatusError
	switch {
	case err == nil:
		return nil
	case errors.Is(err, api.ErrTruncated):
		return cannotConfirm{fmt.Errorf("hastate replica at %s: %w; refusing to act on a partial list (it could hide a drained server or a lagging HAProxy)", r.Addr(), err)}
	case errors.As(err, &se):
		return cannotConfirm{fmt.Errorf("hastate replica at %s: %w: %s", r.Addr(), err, replicaAdvice)}
	}
	return cannotConfirm{callError(ctx, "hastate replica", r.Addr(), err, replicaAdvice)}
}

// Fleet reads every server the cluster knows: KV keys, wildcard followers
// and what HAProxy polled on any replica. Which replicas answered is in
// Replicas; Missing says who did not.
func (r *Replica) Fleet(ctx context.Context) (api.StateView, error) {
	v, err := r.c.State(ctx, true)
	return v, r.explain(ctx, err)
}

// Cluster reads the replica's view of the raft cluster.
func (r *Replica) Cluster(ctx context.Context) (api.ClusterInfo, error) {
	v, err := r.c.Cluster(ctx)
	return v, r.explain(ctx, err)
}

// Pollers reads which HAProxy asked which replica for which server.
func (r *Replica) Pollers(ctx context.Context) (api.PollersView, error) {
	v, err := r.c.Pollers(ctx, true)
	return v, r.explain(ctx, err)
}

// Missing names the replicas that did not answer a cluster-wide read, as
// an ErrCannotConfirm error; nil when all answered.
func Missing(answers []api.ReplicaAnswer) error {
	var miss []string
	for _, a := range answers {
		if !a.Answered {
			miss = append(miss, fmt.Sprintf("replica %s unreachable (%s)", a.ID, a.Error))
		}
	}
	if len(miss) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s: what only it saw is missing; retry, or check that replica with "+
		"hastate status --addr <its HTTP address> (port 9778 by default; an address in the error above is its raft port, which the replicas ask each other on)",
		ErrCannotConfirm, strings.Join(miss, "; "))
}

// Select returns the rows that match any of the selectors.
func Select(rows []api.ServerState, sels ...Selector) []api.ServerState {
	var out []api.ServerState
	for _, r := range rows {
		for _, s := range sels {
			if s.Match(r.Backend, r.Server) {
				out = append(out, r)
				break
			}
		}
	}
	return out
}

// Matched fails with ErrNoMatch, naming the known backends, for the first
// selector that matches none of rows.
func Matched(rows []api.ServerState, sels []Selector) error {
	for _, sel := range sels {
		if len(Select(rows, sel)) == 0 {
			return noMatch(sel, rows)
		}
	}
	return nil
}

// noMatch is the exit-3 error for a selector that matched nothing, with
// the backends the cluster knows.
func noMatch(sel Selector, rows []api.ServerState) error {
	return fmt.Errorf("%w: no server matches '%s'; known backends: %s", ErrNoMatch, sel, knownBackends(rows))
}

func knownBackends(rows []api.ServerState) string {
	set := map[string]bool{}
	for _, r := range rows {
		set[r.Backend] = true
	}
	if len(set) == 0 {
		return "none (no key in KV and no HAProxy has polled yet)"
	}
	bs := slices.Sorted(maps.Keys(set))
	if len(bs) > 20 {
		return strings.Join(bs[:20], ", ") + fmt.Sprintf(" and %d more", len(bs)-20)
	}
	return strings.Join(bs, ", ")
}

// knownServers lists the servers of backend the cluster knows.
func knownServers(rows []api.ServerState, backend string) string {
	var ss []string
	for _, r := range rows {
		if r.Backend == backend && r.Server != state.Wildcard {
			ss = append(ss, r.Server)
		}
	}
	if len(ss) == 0 {
		return "none"
	}
	return strings.Join(ss, ", ")
}
