package api

import (
	"fmt"
	"net/url"
	"path"
	"slices"
	"strings"
	"time"
)

// Filter selects servers by selector (backend/server, each part a glob as
// path.Match reads it; "backend" alone is backend/*), as the operator
// commands read them. The zero Filter selects everything. /v1/state and
// /v1/pollers take it as repeated ?selector= parameters and answer only
// the servers (and polls of servers) it matches, so that a command about
// 10 servers never reads the fleet's table.
type Filter struct {
	sels []selector
}

type selector struct{ backend, server string }

// ParseFilter reads selectors; an empty list selects everything.
func ParseFilter(sels []string) (Filter, error) {
	var f Filter
	for _, s := range sels {
		b, srv, ok := strings.Cut(s, "/")
		if !ok {
			srv = "*"
		}
		if b == "" || srv == "" || strings.Contains(srv, "/") {
			return Filter{}, fmt.Errorf("selector %q: want backend/server (globs allowed), or backend alone", s)
		}
		for _, p := range []string{b, srv} {
			if _, err := path.Match(p, ""); err != nil {
				return Filter{}, fmt.Errorf("selector %q: bad glob %q: %v", s, p, err)
			}
		}
		f.sels = append(f.sels, selector{b, srv})
	}
	return f, nil
}

// All reports whether f selects everything.
func (f Filter) All() bool { return len(f.sels) == 0 }

// Match reports whether f selects backend/server (server may be "*", a
// backend-wide key's row: it is matched as a name like any other).
func (f Filter) Match(backend, server string) bool {
	if len(f.sels) == 0 {
		return true
	}
	for _, s := range f.sels {
		if globMatch(s.backend, backend) && globMatch(s.server, server) {
			return true
		}
	}
	return false
}

// globMatch is path.Match, without its cost for a literal pattern.
func globMatch(pattern, name string) bool {
	if !strings.ContainsAny(pattern, `*?[\`) {
		return pattern == name
	}
	ok, _ := path.Match(pattern, name)
	return ok
}

// Prefixes returns the literal beginnings of "backend/server" (a
// ServerCursor) that every name f selects starts with: one per selector
// up to its first glob character, sorted, none the beginning of another.
// An index sorted by ServerCursor finds what f selects in these ranges
// alone. For a filter that selects everything, and for a selector that
// starts with a glob, it is [""] (the whole index).
func (f Filter) Prefixes() []string {
	var out []string
	for _, s := range f.sels {
		p := literalPrefix(s.backend)
		if p == s.backend {
			p += "/" + literalPrefix(s.server)
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		return []string{""}
	}
	slices.Sort(out)
	kept := out[:1]
	for _, p := range out[1:] {
		if !strings.HasPrefix(p, kept[len(kept)-1]) {
			kept = append(kept, p)
		}
	}
	return kept
}

// literalPrefix is pattern up to its first glob character.
func literalPrefix(pattern string) string {
	if i := strings.IndexAny(pattern, `*?[\`); i >= 0 {
		return pattern[:i]
	}
	return pattern
}

// Strings returns the selectors as given to ParseFilter, normalized
// (backend alone is backend/*).
func (f Filter) Strings() []string {
	out := make([]string, len(f.sels))
	for i, s := range f.sels {
		out[i] = s.backend + "/" + s.server
	}
	return out
}

// Query is what a caller asks a list for: the servers Filter selects,
// the rows after the cursor After (a previous answer's Next), at most
// Limit rows (0: DefaultLimit).
type Query struct {
	Filter Filter
	After  string
	Limit  int
}

// values renders q as URL parameters.
func (q Query) values() url.Values {
	v := url.Values{}
	for _, s := range q.Filter.Strings() {
		v.Add("selector", s)
	}
	if q.After != "" {
		v.Set("after", q.After)
	}
	if q.Limit > 0 {
		v.Set("limit", fmt.Sprint(q.Limit))
	}
	return v
}

// PollCursor is the position of a poll in /v1/pollers' order (server,
// HAProxy, replica): the Next of a page that ends with it.
func PollCursor(p Poll) string {
	return p.Backend + "/" + p.Server + cursorSep + p.HAProxy + cursorSep + p.Replica
}

// ServerCursor is the position of a server in /v1/state's order.
func ServerCursor(backend, server string) string { return backend + "/" + server }

// cursorSep separates a cursor's parts; no name can hold it (a control
// character).
const cursorSep = "\x1f"

// HAProxyNode is one HAProxy node the cluster records (the record of
// which HAProxy nodes exist, from feature level 3 on): its source address,
// when it was first recorded and when it last polled any replica (to
// within HAProxyCoarse), and when each replica that answered last saw it
// (missing: that replica's table does not hold it).
type HAProxyNode struct {
	HAProxy   string               `json:"haproxy"`
	FirstSeen time.Time            `json:"first_seen"`
	LastSeen  time.Time            `json:"last_seen"`
	SeenBy    map[string]time.Time `json:"seen_by,omitempty"`
}

// The record's resolution and the live-replica rule's windows.
const (
	// HAProxyCoarse is the resolution of HAProxyNode.LastSeen (the
	// leader moves it only once it is this much behind; see
	// state.HAProxyCoarse).
	HAProxyCoarse = 30 * time.Second
	// HAProxyRecent is how recently an HAProxy must have polled, by the
	// record, for a command to need a live replica that saw it: the
	// record's resolution plus two gatherings of the leader (5 s each)
	// and a margin. An HAProxy that stopped polling for good stops
	// counting after it.
	HAProxyRecent = HAProxyCoarse + 30*time.Second
	// SeenWithin is how recently a live replica must have seen such an
	// HAProxy: a few agent intervals (2 s by default). A dead replica's
	// HAProxy nodes move to the live replicas once the load balancer
	// drops it, and are seen there within one agent interval.
	SeenWithin = 3 * ProbeGrace
)

// HAProxiesView is the /v1/haproxies body: the cluster's record of which
// HAProxy nodes exist, with what each replica that answered saw.
type HAProxiesView struct {
	// Recorded is true once the cluster keeps the record (every replica
	// runs 0.15.0 or later: feature level 3); before that HAProxies
	// lists only what the replicas that answered saw.
	Recorded  bool            `json:"recorded"`
	HAProxies []HAProxyNode   `json:"haproxies"`
	Replicas  []ReplicaAnswer `json:"replicas"`
}

// Unseen returns the HAProxy nodes a decision cannot do without, at now:
// while some replica did not answer the read the decision rests on
// (answers; nil: this view's Replicas), those the record says polled
// within HAProxyRecent and that no replica that did answer it saw within
// SeenWithin. Only a replica that did not answer may hold what they were
// told. With every replica answering it is empty: every HAProxy that polls
// is seen by one of them.
func (v HAProxiesView) Unseen(now time.Time, answers []ReplicaAnswer) []HAProxyNode {
	if answers == nil {
		answers = v.Replicas
	}
	live := map[string]bool{}
	all := true
	for _, a := range answers {
		live[a.ID] = a.Answered
		all = all && a.Answered
	}
	if all {
		return nil
	}
	var out []HAProxyNode
	for _, h := range v.HAProxies {
		if now.Sub(h.LastSeen) > HAProxyRecent {
			continue
		}
		seen := false
		for id, at := range h.SeenBy {
			seen = seen || (live[id] && now.Sub(at) <= SeenWithin)
		}
		if !seen {
			out = append(out, h)
		}
	}
	return out
}
