package ctl

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/state"
)

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
			return NoMatch(sel, rows)
		}
	}
	return nil
}

// NoMatch is the exit-3 error for a selector that matched nothing, with
// the backends the cluster knows.
func NoMatch(sel Selector, rows []api.ServerState) error {
	return fmt.Errorf("%w: no server matches '%s'%s; known backends: %s", ErrNoMatch, sel, Suggest(sel, rows), KnownBackends(rows))
}

// Suggest is the did-you-mean of a selector that matched nothing: the
// known backends near its backend, else the servers of its backend near
// its server (issue 27.10).
func Suggest(sel Selector, rows []api.ServerState) string {
	backends, servers := map[string]bool{}, map[string]bool{}
	for _, r := range rows {
		backends[r.Backend] = true
		if r.Backend == sel.Backend && r.Server != state.Wildcard {
			servers[r.Server] = true
		}
	}
	if !backends[sel.Backend] {
		if s := didYouMean(sel.Backend, slices.Sorted(maps.Keys(backends))); s != "" && sel.Server == state.Wildcard {
			return s
		} else if s != "" {
			return strings.Replace(s, "?", "/"+sel.Server+"?", 1)
		}
		return ""
	}
	if sel.Server == state.Wildcard {
		return ""
	}
	known := slices.Sorted(maps.Keys(servers))
	s := didYouMean(sel.Server, known)
	if s == "" {
		return ""
	}
	// Name them backend/server, as the operator types them.
	for _, k := range known {
		s = strings.ReplaceAll(s, " "+k+"?", " "+sel.Backend+"/"+k+"?")
		s = strings.ReplaceAll(s, " "+k+" or", " "+sel.Backend+"/"+k+" or")
	}
	return s
}

func KnownBackends(rows []api.ServerState) string {
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

// KnownServers lists the servers of backend the cluster knows.
func KnownServers(rows []api.ServerState, backend string) string {
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
