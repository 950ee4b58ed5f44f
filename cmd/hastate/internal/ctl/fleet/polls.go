package fleet

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
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

// UnseenPairs names, while some replica did not answer pv (a cluster-wide
// read of the polls of every server of the selected servers' backends),
// each (server, HAProxy) pair of a selected server that no replica that
// answered saw within api.SeenWithin, although the HAProxy polls it: only
// the replica that did not answer may know what it was told. Replica.Live
// judges per HAProxy (one seen by a live replica for any server passes);
// this judges per pair, since a load balancer spreads an HAProxy's checks
// (one connection each) over the replicas, and one server's may all have
// gone to the replica that is down. An HAProxy polls a server when a live
// replica saw it poll that server within api.PollerTTL, or when it polls
// another server of the same backend and some HAProxy polls this one (an
// HAProxy checks every agent-checked server of a backend it has). With
// every replica answering it is empty. servers are the selected servers
// by backend/server.
func UnseenPairs[V any](pv api.PollersView, servers map[string]V, now time.Time) []string {
	var down []string
	for _, a := range pv.Replicas {
		if !a.Answered {
			down = append(down, a.ID)
		}
	}
	if len(down) == 0 {
		return nil
	}
	type pair struct{ server, haproxy string }
	latest := map[pair]time.Time{}            // the latest live poll of each pair
	byBackend := map[string]map[string]bool{} // backend -> HAProxies that poll one of its servers
	polled := map[string]bool{}               // servers some HAProxy polls
	alive := map[string]bool{}                // HAProxies a live replica saw within SeenWithin
	for _, p := range api.MergePolls(pv.Pollers) {
		if !p.Polling(now) {
			continue
		}
		s := p.Backend + "/" + p.Server
		latest[pair{s, p.HAProxy}] = p.LastAsked
		polled[s] = true
		alive[p.HAProxy] = alive[p.HAProxy] || now.Sub(p.LastAsked) <= api.SeenWithin
		if byBackend[p.Backend] == nil {
			byBackend[p.Backend] = map[string]bool{}
		}
		byBackend[p.Backend][p.HAProxy] = true
	}
	var out []string
	for s := range servers {
		if !polled[s] {
			continue // no HAProxy polls it (no agent check): nothing to be told
		}
		backend, _, _ := strings.Cut(s, "/")
		for h := range byBackend[backend] {
			at, ok := latest[pair{s, h}]
			switch {
			case !alive[h]:
				continue // stopped polling, or seen by no live replica at all: Replica.Live's
			case ok && now.Sub(at) <= api.SeenWithin:
				continue
			case ok:
				out = append(out, fmt.Sprintf("HAProxy %s for %s: last seen by a live replica %s, so what it was told since only replica %s (did not answer) may know",
					h, s, ctl.Ago(now.Sub(at)), strings.Join(down, ", ")))
			default:
				out = append(out, fmt.Sprintf("HAProxy %s for %s: it polls other servers of %s but was never seen polling this one by a live replica, so what it was told only replica %s (did not answer) may know",
					h, s, backend, strings.Join(down, ", ")))
			}
		}
	}
	slices.Sort(out)
	return out
}
