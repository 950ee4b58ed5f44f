package write

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl"
	"github.com/hastate/hastate/state"
)

// Each guard of a write has its own override (DESIGN.md, Operator
// commands); --force lifts the three, and every lifted guard is named in
// the output, with what it would have said, and in the meta key. The
// partial-backend refusal is no guard: it needs a choice, --override or
// --keep-own, and --force does not make it.

// Guard is one check a write makes before it writes.
type Guard string

const (
	// GuardUnknown: a server no HAProxy polls, a backend the cluster
	// does not know (a typo). --allow-unknown lifts it.
	GuardUnknown Guard = "unknown server"
	// GuardMinReady: taking single servers out would leave a backend
	// below --min-ready. --allow-below-min-ready lifts it.
	GuardMinReady Guard = "capacity"
	// GuardNoReplica: no replica could be asked, the replicas that
	// answered cannot vouch for every HAProxy (one that polled recently
	// is seen by none of them: fleet.Replica.Live), or the replica did not
	// catch up with Consul within --timeout: what only they know (who
	// polls, capacity, that they read this prefix) cannot be checked.
	// --allow-no-replica lifts it.
	GuardNoReplica Guard = "no replica to ask"
)

// Flag is the flag that lifts the guard.
func (g Guard) Flag() string {
	switch g {
	case GuardUnknown:
		return "--allow-unknown"
	case GuardMinReady:
		return "--allow-below-min-ready"
	}
	return "--allow-no-replica"
}

// advice says how to lift the guard, for a refusal.
func (g Guard) advice(Allow) string {
	return fmt.Sprintf("add %s to write anyway (or --force, which lifts every guard but the partial-backend one)", g.Flag())
}

// Allow says which guards a write lifts.
type Allow struct {
	Unknown       bool // --allow-unknown
	BelowMinReady bool // --allow-below-min-ready
	NoReplica     bool // --allow-no-replica
	// Force: the three were lifted by --force (messages name it).
	Force bool
}

// AllowForce is what --force lifts.
func AllowForce() Allow {
	return Allow{Unknown: true, BelowMinReady: true, NoReplica: true, Force: true}
}

func (a Allow) by(g Guard) string {
	if a.Force {
		return "--force"
	}
	return g.Flag()
}

// Lifted is a guard a write lifted, with what it would have said.
type Lifted struct {
	Guard Guard
	By    string // the flag that lifted it
	Said  string // what the guard would have said ("" when it could not tell)
}

func (l Lifted) String() string {
	if l.Said == "" {
		return fmt.Sprintf("%s (%s)", l.Guard, l.By)
	}
	return fmt.Sprintf("%s (%s); it would have said: %s", l.Guard, l.By, l.Said)
}

// lift records a lifted guard once per guard and message.
func (pl *planner) lift(g Guard, said string) {
	pl.p.lift(g, pl.o.Allow.by(g), said)
}

func (p *Plan) lift(g Guard, by, said string) {
	said = strings.TrimPrefix(strings.TrimPrefix(said, ctl.ErrNoMatch.Error()+": "), "refused, nothing was written: ")
	for _, l := range p.Lifted {
		if l.Guard == g && l.Said == said {
			return
		}
	}
	p.Lifted = append(p.Lifted, Lifted{Guard: g, By: by, Said: said})
}

// liftedNames are the lifted guards as the meta key records them.
func (p Plan) liftedNames() []string {
	var out []string
	for _, l := range p.Lifted {
		out = append(out, l.String())
	}
	return out
}

// fleetIndex answers PlanWrite's questions about the fleet without a scan
// per matched server (a glob can match 50,000): each backend's servers,
// the known backends.
type fleetIndex struct {
	byBackend map[string][]api.ServerState // backend -> its servers (not "*")
	backends  []string                     // sorted
}

func indexFleet(rows []api.ServerState) *fleetIndex {
	ix := &fleetIndex{byBackend: map[string][]api.ServerState{}}
	for _, r := range rows {
		if _, ok := ix.byBackend[r.Backend]; !ok {
			ix.byBackend[r.Backend] = nil
			ix.backends = append(ix.backends, r.Backend)
		}
		if r.Server != state.Wildcard {
			ix.byBackend[r.Backend] = append(ix.byBackend[r.Backend], r)
		}
	}
	slices.Sort(ix.backends)
	return ix
}

// known reports whether the cluster knows backend.
func (ix *fleetIndex) known(backend string) bool {
	_, ok := ix.byBackend[backend]
	return ok
}

// polled is the typo guard: it refuses a write for a server no HAProxy
// has polled within api.PollerTTL (a typo, or a server not in
// haproxy.cfg), naming the servers the cluster knows in that backend; a
// server the cluster does not know at all matched nothing (ctl.ErrNoMatch,
// and an unknown backend names the known backends). Allow.Unknown lifts
// it, and the plan names what it would have said.
//
// While a migration is marked, a server with a key in Consul passes too:
// before any HAProxy node is moved, none polls hastate, and the keys are
// what the per-node agents serve.
func (pl *planner) polled(sel ctl.Selector) error {
	if pl.view == nil || pl.in.clear {
		return nil
	}
	if pl.o.Migration {
		if k, ok := pl.read(sel.Backend, sel.Server); !ok || k.Present {
			return nil // not read yet (planned again once it is), or in Consul
		}
	}
	err := pl.unpolled(sel)
	switch {
	case err == nil:
		return nil
	case pl.o.Allow.Unknown:
		pl.lift(GuardUnknown, err.Error())
		return nil
	}
	return fmt.Errorf("%w; %s", err, GuardUnknown.advice(pl.o.Allow))
}

func (pl *planner) unpolled(sel ctl.Selector) error {
	ix, rows := pl.ix, pl.rows
	if !ix.known(sel.Backend) {
		return ctl.NoMatch(sel, rows)
	}
	for _, r := range ix.byBackend[sel.Backend] {
		if r.Server == sel.Server {
			if r.Polled > 0 {
				return nil
			}
			return fmt.Errorf("refused, nothing was written: no HAProxy has polled %s in the last %s (a typo?)%s; known servers of %s: %s",
				sel, api.PollerTTL, suggestPolled(sel, rows), sel.Backend, ctl.KnownServers(rows, sel.Backend))
		}
	}
	if pl.o.Migration {
		return fmt.Errorf("%w: no server matches '%s': no HAProxy that asks hastate has polled %s in the last %s and it has no key in Consul (a typo? HAProxy nodes still on the per-node agent are not seen)%s; known servers of %s: %s",
			ctl.ErrNoMatch, sel, sel, api.PollerTTL, ctl.Suggest(sel, rows), sel.Backend, ctl.KnownServers(rows, sel.Backend))
	}
	return fmt.Errorf("%w: no server matches '%s': no HAProxy has polled %s in the last %s and it has no key (a typo?)%s; known servers of %s: %s",
		ctl.ErrNoMatch, sel, sel, api.PollerTTL, ctl.Suggest(sel, rows), sel.Backend, ctl.KnownServers(rows, sel.Backend))
}

// suggestPolled is the did-you-mean of a server no HAProxy polls: the
// servers of its backend that one does poll, near its name.
func suggestPolled(sel ctl.Selector, rows []api.ServerState) string {
	var polled []api.ServerState
	for _, r := range rows {
		if r.Backend == sel.Backend && r.Polled > 0 {
			polled = append(polled, r)
		}
	}
	return ctl.Suggest(sel, polled)
}

// minReady refuses to take individual servers out when that leaves a
// backend with fewer than --min-ready ready servers among those HAProxy
// polls. A server counts as ready only if the cluster shows it in rotation
// and Consul agrees: its own key, or else its backend-wide key, absent or a
// ready weight above 0% (a server at 0% is not ready: HAProxy shows it as
// DRAIN). With guard (the capacity guard applies and every key of the
// backends was read), the transaction depends on the own key of every
// server counted ready afterwards and on the backend-wide key: a
// concurrent write that takes one of them out (or drains the backend)
// makes this one read and plan again, and then refuse. When those checks
// would not fit in one transaction, it depends on the first --min-ready of
// them, which is enough: they stay ready, so the backend keeps that many.
func (pl *planner) minReady(out []ctl.Selector, guard bool) error {
	want := pl.o.MinReady
	type count struct {
		before int
		after  []KVKey // the own keys of the servers ready afterwards
	}
	counts := map[string]*count{}
	affected := map[string]bool{}
	outSet := map[ctl.Selector]bool{}
	for _, s := range out {
		affected[s.Backend] = true
		outSet[s] = true
	}
	for _, r := range pl.rows {
		if !affected[r.Backend] || r.Server == state.Wildcard || r.Polled == 0 || !r.InRotation() {
			continue
		}
		own, okOwn := pl.kv.key(r.Backend, r.Server)
		wild, okWild := pl.kv.key(r.Backend, state.Wildcard)
		if guard && (!okOwn || !okWild || !consulReady(ServerKeys{Own: own, Backend: wild})) {
			continue // Consul says it is out (or it was not read): not ready
		}
		c := counts[r.Backend]
		if c == nil {
			c = &count{}
			counts[r.Backend] = c
		}
		c.before++
		if !outSet[ctl.Selector{Backend: r.Backend, Server: r.Server}] {
			c.after = append(c.after, own)
		}
	}
	var bad []string
	for _, b := range slices.Sorted(maps.Keys(affected)) {
		c := counts[b]
		if c == nil {
			c = &count{}
		}
		if len(c.after) < want && len(c.after) < c.before {
			bad = append(bad, fmt.Sprintf("%s would have %d ready of the servers HAProxy polls (now %d)", b, len(c.after), c.before))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("refused, nothing was written: %s, fewer than --min-ready %d (a server at 0%% is not ready: HAProxy shows it as DRAIN); "+
			"drain the whole backend with <backend>/* if you mean to",
			strings.Join(bad, "; "), want)
	}
	if !guard {
		return nil
	}
	after := func(b string) []KVKey {
		if c := counts[b]; c != nil {
			return c.after
		}
		return nil
	}
	var deps []KVKey
	for _, b := range slices.Sorted(maps.Keys(affected)) {
		wild, _ := pl.kv.key(b, state.Wildcard)
		deps = append(append(deps, wild), after(b)...)
	}
	room := MaxTxnKeys - txnLen(pl.p.Ops) - len(pl.deps) - 1
	if len(deps) > room {
		deps = deps[:0]
		for _, b := range slices.Sorted(maps.Keys(affected)) {
			wild, _ := pl.kv.key(b, state.Wildcard)
			a := after(b)
			deps = append(append(deps, wild), a[:min(len(a), want)]...)
		}
		pl.note("--min-ready: the transaction checks the keys of %d servers that stay ready (at least --min-ready %d per backend) and the backend-wide keys, not of every ready server: they do not all fit in one transaction",
			len(deps)-len(affected), pl.o.MinReady)
	}
	for _, k := range deps {
		pl.dep(k)
	}
	return nil
}

// consulReady reports whether Consul's keys leave a server in rotation:
// its own key, or else its backend-wide key, absent or a ready weight
// above 0%. An invalid value does not count as ready.
func consulReady(k ServerKeys) bool {
	key := k.Own
	if !key.Present {
		key = k.Backend
	}
	if !key.Present {
		return true
	}
	v, ok := key.parsed()
	return ok && v.Admin == state.Ready && !(v.WeightSet && v.Weight == 0)
}
