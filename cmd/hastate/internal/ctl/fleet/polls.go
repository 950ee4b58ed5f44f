package fleet

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl"
	"github.com/hastate/hastate/state"
)

// SelectedServers maps backend/server to the row of each server the
// selectors match (backend-wide keys are not servers); a selector that
// matches nothing is ctl.ErrNoMatch.
func SelectedServers(fleet api.StateView, sels []ctl.Selector) (map[string]api.ServerState, error) {
	out := map[string]api.ServerState{}
	for _, sel := range sels {
		rows := ctl.Select(fleet.Servers, sel)
		if len(rows) == 0 {
			return nil, ctl.NoMatch(sel, KnownRows(fleet))
		}
		for _, r := range rows {
			if r.Server != state.Wildcard {
				out[r.Backend+"/"+r.Server] = r
			}
		}
	}
	return out, nil
}

// LatestPolls is, per (server, HAProxy), the latest poll on any replica
// of an HAProxy that polls one of servers (by backend/server) now: a
// manual probe is none.
func LatestPolls[V any](pv api.PollersView, servers map[string]V) map[[2]string]api.Poll {
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

// PollingHAProxies lists the HAProxy nodes (their addresses) that polled
// hastate within api.PollerTTL, on any replica: the nodes already moved.
func PollingHAProxies(ctx context.Context, r *Replica) ([]string, error) {
	pv, err := r.Pollers(ctx)
	if err != nil {
		return nil, err
	}
	if err := Missing(pv.Replicas); err != nil {
		return nil, err
	}
	now := time.Now()
	set := map[string]bool{}
	for _, p := range api.MergePolls(pv.Pollers) {
		if p.FromHAProxy(now) && now.Sub(p.LastAsked) < api.PollerTTL {
			set[p.HAProxy] = true
		}
	}
	return slices.Sorted(maps.Keys(set)), nil
}
