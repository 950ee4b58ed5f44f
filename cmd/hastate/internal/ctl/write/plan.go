package write

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/fleet"
	"github.com/hastate/hastate/state"
)

// A write command (drain, maint, ready, weight, clear) is planned here, as
// a pure function of what Consul holds (a KVRead, the one source of which
// keys exist and which backend-wide keys cover a server) and of what the
// replica knows that Consul cannot (which servers HAProxy polls, capacity:
// the fleet). Run (run.go) reads both and applies the plan; the Writer
// (writer.go) turns it into one conditional Consul transaction.

// Op is one operation of a write: set a key to a value, or delete it.
type Op struct {
	Delete bool
	Key    string
	Value  string // for a set
	// Lifted names the guards lifted for this write; they go to the meta
	// key (see TxnOps).
	Lifted []string
	// Effect is what the write leaves that its meta key records, e.g. a
	// backend with no server in rotation ("" for nothing).
	Effect string
	// Replaces is, for showing only, what the key held when the plan was
	// read ("drain until 2026-12-01 15:04:05 UTC by alice: zonal
	// maintenance"; "" when it was absent): the value from Consul, its
	// meta as the replica shows it.
	Replaces string
}

func (o Op) String() string {
	if o.Delete {
		return "delete " + o.Key
	}
	return "set    " + o.Key + " = " + o.Value
}

// replaces says what the state key k held, with its meta as row shows it
// (nil: not known).
func replaces(k KVKey, row *api.ServerState) string {
	if !k.Present {
		return ""
	}
	out := k.short()
	if row == nil {
		return out
	}
	if row.Until != nil {
		out += " until " + row.Until.UTC().Format("2006-01-02 15:04:05 UTC")
	}
	if row.By != "" {
		out += " by " + row.By
	}
	if row.Reason != "" {
		out += ": " + row.Reason
	}
	return out
}

// Plan is what a write command will do.
type Plan struct {
	// Command names the command in messages ("drain", "weight 25%").
	Command string
	Ops     []Op
	// Deps are the state keys the plan depended on, as Consul held them
	// when it was read: the transaction is conditional on each (written
	// or not; see Writer.Apply).
	Deps []KVKey
	// Written: Write applied the operations (false for a dry run).
	Written bool
	// Notes are what the operator should know: servers a backend-wide
	// key does not reach, keys that were already absent.
	Notes []string
	// Lifted are the guards the write lifted, each with what it would
	// have said.
	Lifted []Lifted
	// Retried counts the times a concurrent write changed a key the plan
	// read, so that it was read and planned again.
	Retried int
}

// Print writes the plan, one Consul operation a line (see TxnOps), then
// the lifted guards and the notes.
func (p Plan) Print(w io.Writer) {
	for _, o := range p.Ops {
		for i, t := range TxnOps(o) {
			l := "  " + t.String()
			if i == 0 && o.Replaces != "" {
				l += "   (replaces " + o.Replaces + ")"
			}
			fmt.Fprintln(w, l)
		}
	}
	for _, l := range p.Lifted {
		fmt.Fprintln(w, "guard lifted: "+l.String())
	}
	switch {
	case p.Retried == 1:
		fmt.Fprintln(w, "note: read Consul and planned again once: a concurrent write changed a key this write depended on")
	case p.Retried > 1:
		fmt.Fprintf(w, "note: read Consul and planned again %d times: concurrent writes changed keys this write depended on\n", p.Retried)
	}
	for _, n := range p.Notes {
		fmt.Fprintln(w, "note: "+n)
	}
}

// Options say what a write command writes.
type Options struct {
	// Command is drain, maint, ready, weight or clear (for messages:
	// "weight 25%"); Value is the value set (unused by clear).
	Command, Value string
	Prefix         string
	// Allow lifts guards, each by its own flag (--force: all three).
	Allow Allow
	// Override also deletes the own keys of servers that a backend-wide
	// write would not reach; KeepOwn leaves them (a backend-wide drain,
	// maint or 0% that some servers would escape is refused without one
	// of the two). --force lifts neither: that refusal needs a choice.
	Override, KeepOwn bool
	// MinReady is the fewest ready servers (among those HAProxy polls) a
	// drain, maint or 0% of individual servers may leave in a backend.
	MinReady int
	// Migration: a migration from the per-node agent is marked (read
	// from Consul; MigrationKey names the marker). The write is then one
	// both serve the same way: backend selectors expand to per-server
	// keys, --for and --ramp are refused, and the typo guard also accepts
	// a server that has a key in Consul (see perServer).
	Migration    bool
	MigrationKey string
	// Marker is the migration marker as Consul held it (nil: not read):
	// a dependency of the transaction, counted in its operations.
	Marker *KVKey
	// Live decides whether the replicas that answered the fleet read are
	// enough (fleet.Replica.Live); nil: every replica must have answered
	// (fleet.Missing).
	Live func([]api.ReplicaAnswer) error
}

// intent is what a write does to the servers it reaches, decided once from
// the value it writes.
type intent struct {
	clear bool
	// ready: plain ready (no weight); a server's own key is deleted
	// instead when no backend-wide key covers it.
	ready bool
	// out: drain, maint or 0%, which take servers out of rotation.
	out   bool
	value state.Value
}

func intentOf(o Options) (intent, error) {
	if o.Command == "clear" {
		return intent{clear: true}, nil
	}
	v, err := state.ParseValue(o.Value)
	if err != nil {
		return intent{}, fmt.Errorf("%w: %v", ctl.ErrUsage, err) // a bug: Value checks what it builds
	}
	return intent{value: v, ready: v.Admin == state.Ready && !v.WeightSet,
		out: v.Admin != state.Ready || (v.WeightSet && v.Weight == 0)}, nil
}

// planner holds one planning pass.
type planner struct {
	o     Options
	in    intent
	kv    *KVRead
	view  *api.StateView // nil: no replica answered (Allow.NoReplica)
	rows  []api.ServerState
	ix    *fleetIndex
	needs *kvNeeds
	p     Plan
	seen  map[string]bool
	deps  map[string]KVKey
	// refusal is the first refusal decided from Consul's keys.
	refusal error
}

// PlanWrite expands the selectors into one transaction. Which servers
// exist and who polls them comes from view (the cluster's view; nil when
// no replica could be asked, which only Allow.NoReplica with literal
// backend/server arguments allows); which keys exist and what covers a
// server comes from kv, Consul's consistent read:
//
//   - backend/server: that key; backend/*: the backend-wide key;
//   - <glob>/*: one backend-wide key per known backend that matches;
//   - <glob>/<glob>: one key per known server that matches.
//
// When kv lacks a key or a backend the plan depends on, PlanWrite returns
// what to read (needs) and no decision: read it and plan again.
//
// ready deletes a server's own key when no backend-wide key covers it
// (the absent key is ready, and later backend-wide drains reach it again),
// and writes ready under one. A literal key with glob characters is never
// written. A selector that matches nothing fails with ctl.ErrNoMatch, naming
// the known backends; a backend-wide drain, maint or 0% that servers with
// their own key would escape is refused unless Override or KeepOwn; an
// expansion past MaxTxnKeys is refused; either way nothing is written.
func PlanWrite(view *api.StateView, kv *KVRead, sels []ctl.Selector, o Options) (Plan, *kvNeeds, error) {
	in, err := intentOf(o)
	if err != nil {
		return Plan{Command: o.Command}, nil, err
	}
	if err := migrationRefuses(o, in); err != nil {
		return Plan{Command: o.Command}, nil, err
	}
	pl := &planner{o: o, in: in, kv: kv, view: view, p: Plan{Command: o.Command}, seen: map[string]bool{}, deps: map[string]KVKey{},
		needs: &kvNeeds{backends: map[string]bool{}, keys: map[string]bool{}}}
	if view != nil {
		// The view holds the selected backends; the others are named
		// (for a selector that matches nothing and its did-you-mean).
		pl.rows = fleet.KnownRows(*view)
		live := o.Live
		if live == nil {
			live = fleet.Missing
		}
		if err := live(view.Replicas); err != nil {
			if !o.Allow.NoReplica {
				return pl.p, nil, fmt.Errorf("%w; %s", err, GuardNoReplica.advice(o.Allow))
			}
			pl.lift(GuardNoReplica, err.Error())
		}
	}
	if view == nil {
		pl.note("no replica was asked: neither the unknown-server guard nor --min-ready could be checked; which keys exist and what covers them still come from Consul")
	}
	pl.ix = indexFleet(pl.rows)
	var individual []ctl.Selector // servers the write takes out one by one
	for _, sel := range sels {
		if err := pl.selector(sel, &individual); err != nil {
			return pl.p, nil, err
		}
	}
	capacity := in.out && view != nil && !o.Allow.BelowMinReady && o.MinReady > 0 && len(individual) > 0
	if capacity {
		// The capacity guard counts from Consul too: every key of the
		// backends it counts is read.
		for _, s := range individual {
			pl.readBackend(s.Backend)
			pl.read(s.Backend, state.Wildcard)
		}
	}
	// Every key is read before a refusal is returned, so that a dry run
	// shows the whole transaction it refused.
	if pl.needs.any() {
		return pl.p, pl.needs, nil
	}
	if pl.refusal != nil {
		return pl.p, nil, pl.refusal
	}
	if o.Marker != nil {
		pl.dep(*o.Marker)
	}
	if in.out && view != nil {
		if err := pl.minReady(individual, capacity); err != nil {
			if !o.Allow.BelowMinReady {
				return pl.p, nil, fmt.Errorf("%w; %s", err, GuardMinReady.advice(o.Allow))
			}
			pl.lift(GuardMinReady, err.Error())
		}
	}
	for _, k := range slices.Sorted(maps.Keys(pl.deps)) {
		pl.p.Deps = append(pl.p.Deps, pl.deps[k])
	}
	if n := txnLen(pl.p.Ops) + len(pl.checks()); n > MaxTxnKeys && o.Migration {
		return pl.p, nil, fmt.Errorf("refused, nothing was written: %d keys, each with its meta key, and %d checks of keys the plan read are %d operations, more than one Consul transaction holds (%d); "+
			"a migration from the per-node agent is marked, so backend-wide keys are not an option: split the command (a backend, or a zone of one backend, at a time)", len(pl.p.Ops), len(pl.checks()), n, MaxTxnKeys)
	}
	if n := txnLen(pl.p.Ops) + len(pl.checks()); n > MaxTxnKeys {
		return pl.p, nil, fmt.Errorf("refused, nothing was written: %d keys, each with its meta key, and %d checks of keys the plan read are %d operations, more than one Consul transaction holds (%d); "+
			"use backend-wide keys (<backend>/*, or '<glob>/*') or split the command (a backend-wide drain checks every own key of the backend unless --keep-own)", len(pl.p.Ops), len(pl.checks()), n, MaxTxnKeys)
	}
	pl.droppedReason()
	lifted := pl.p.liftedNames()
	for i, op := range pl.p.Ops {
		pl.p.Ops[i].Lifted = lifted
		if k, ok := pl.deps[op.Key]; ok {
			pl.p.Ops[i].Replaces = replaces(k, pl.rowOf(strings.TrimPrefix(op.Key, o.Prefix)))
		}
	}
	return pl.p, nil, nil
}

// checks are the deps the transaction checks without writing them.
func (pl *planner) checks() []KVKey {
	var out []KVKey
	for _, d := range pl.p.Deps {
		if !pl.seen[d.Key] {
			out = append(out, d)
		}
	}
	return out
}

func (pl *planner) add(op Op) {
	if !pl.seen[op.Key] {
		pl.seen[op.Key] = true
		pl.p.Ops = append(pl.p.Ops, op)
	}
}

func (pl *planner) note(format string, a ...any) {
	pl.p.Notes = append(pl.p.Notes, fmt.Sprintf(format, a...))
}

// read returns Consul's backend/server key, and false (recording the need)
// when it has not been read yet.
func (pl *planner) read(backend, server string) (KVKey, bool) {
	k, ok := pl.kv.key(backend, server)
	if !ok {
		pl.needs.keys[k.Key] = true
	}
	return k, ok
}

// readBackend reports whether every key of backend was read (recording
// the need when not).
func (pl *planner) readBackend(backend string) bool {
	if !pl.kv.full[backend] {
		pl.needs.backends[backend] = true
		return false
	}
	return true
}

func (pl *planner) dep(k KVKey) { pl.deps[k.Key] = k }

// droppedReason says that ready's --reason is recorded nowhere for the
// keys it deletes: the meta key a reason lives in goes with its state key
// (an absent key is ready), and the leader's "kv change applied" log line
// names the key and what it held, not why.
func (pl *planner) droppedReason() {
	if !pl.in.ready || pl.in.value.Reason == "" {
		return
	}
	var deleted []string
	for _, op := range pl.p.Ops {
		if op.Delete {
			deleted = append(deleted, strings.TrimPrefix(op.Key, pl.o.Prefix))
		}
	}
	if len(deleted) == 0 {
		return
	}
	pl.note("--reason %q is recorded nowhere: ready deletes %s (%s; an absent key is ready), each with its meta key, where a reason lives; "+
		"the leader's log line \"kv change applied\" names each deleted key and what it held, not the reason: keep it in your change record",
		pl.in.value.Reason, ctl.PluralN(len(deleted), "key", "keys"), strings.Join(deleted, ", "))
}

// rowOf is a row of the replica's view whose answer comes from key
// (relative to the prefix), nil when none does.
func (pl *planner) rowOf(key string) *api.ServerState {
	for i := range pl.rows {
		if pl.rows[i].Key == key {
			return &pl.rows[i]
		}
	}
	return nil
}

func (pl *planner) selector(sel ctl.Selector, individual *[]ctl.Selector) error {
	literal := !ctl.Globbed(sel.Backend) && (sel.Server == state.Wildcard || !ctl.Globbed(sel.Server))
	if !literal && pl.view == nil {
		return fmt.Errorf("%w: %s needs the servers the cluster knows, and no replica answered; name servers one by one", ctl.ErrCannotConfirm, sel)
	}
	if pl.o.Migration && sel.Server == state.Wildcard && pl.view == nil {
		return fmt.Errorf("%w: a migration from the per-node agent is marked, so %s expands to per-server keys, which needs the servers the cluster knows, and no replica answered; name servers one by one", ctl.ErrCannotConfirm, sel)
	}
	switch {
	case literal && sel.Server == state.Wildcard:
		if pl.view != nil && !pl.in.clear && !pl.ix.known(sel.Backend) {
			err := ctl.NoMatch(sel, pl.rows)
			if !pl.o.Allow.Unknown {
				return fmt.Errorf("%w (%s)", err, GuardUnknown.advice(pl.o.Allow))
			}
			pl.lift(GuardUnknown, err.Error())
		}
		if pl.o.Migration {
			pl.perServer(sel, sel.Backend)
			break
		}
		pl.backendWide(sel.Backend)
	case literal:
		if err := pl.polled(sel); err != nil {
			return err
		}
		pl.server(sel.Backend, sel.Server, true)
		*individual = append(*individual, sel)
	case sel.Server == state.Wildcard:
		if !pl.kv.listed() {
			pl.needs.list = true
		}
		n := 0
		for _, b := range pl.backends() {
			if sel.Match(b, state.Wildcard) {
				n++
				if pl.o.Migration {
					pl.perServer(sel, b)
					continue
				}
				pl.backendWide(b)
			}
		}
		if n == 0 && pl.kv.listed() {
			return ctl.NoMatch(sel, pl.rows)
		}
	default:
		n := 0
		for _, r := range pl.rows {
			if r.Server == state.Wildcard || !sel.Match(r.Backend, r.Server) {
				continue
			}
			n++
			if pl.server(r.Backend, r.Server, false) {
				*individual = append(*individual, ctl.Selector{Backend: r.Backend, Server: r.Server})
			}
		}
		if n == 0 {
			return ctl.NoMatch(sel, pl.rows)
		}
	}
	return nil
}

// backends are the known backends: the fleet's and those with keys in
// Consul.
func (pl *planner) backends() []string {
	set := map[string]bool{}
	for _, b := range pl.ix.backends {
		set[b] = true
	}
	for _, b := range pl.kv.backends {
		set[b] = true
	}
	return slices.Sorted(maps.Keys(set))
}

// server plans the operation on one server's own key, from what Consul
// holds. ready deletes the key unless a backend-wide key covers the server
// (or the value carries a ramp, which lives in the key), so that the
// server follows backend-wide keys again. literal: the operator named the
// server (a clear of an absent key then says so). It reports whether the
// server is written.
func (pl *planner) server(backend, srv string, literal bool) bool {
	o, in := pl.o, pl.in
	k, ok := pl.read(backend, srv)
	if !ok {
		if in.ready {
			pl.read(backend, state.Wildcard)
		}
		return true
	}
	pl.dep(k)
	switch {
	case in.clear && !k.Present:
		if literal {
			// A name with no key that the cluster does not know either
			// is a typo (the runbook's zonal undrain is a clear): exit 3
			// with did-you-mean, not a quiet "nothing to clear".
			if err := pl.unpolled(ctl.Selector{Backend: backend, Server: srv}); pl.view != nil && errors.Is(err, ctl.ErrNoMatch) {
				pl.refuse(fmt.Errorf("%w; nothing to clear: %s does not exist", err, k.Key))
				return false
			}
			pl.note("nothing to clear: %s does not exist", k.Key)
		}
		return false
	case in.clear:
		pl.add(Op{Delete: true, Key: k.Key})
		return true
	case !in.ready:
		pl.add(Op{Key: k.Key, Value: o.Value})
		return true
	}
	w, ok := pl.read(backend, state.Wildcard)
	if !ok {
		return true
	}
	pl.dep(w)
	keys := ServerKeys{Own: k, Backend: w}
	switch {
	case keys.UnderBackend():
		pl.note("%s/%s: written as ready under %s/* (%s), so it now stays out of backend-wide drains and maints; "+
			"`hastate clear %s/%s` makes it follow %s/* again", backend, srv, backend, w.short(), backend, srv, backend)
		pl.add(Op{Key: k.Key, Value: o.Value})
	case in.value.RampSet && k.Present:
		pl.note("%s/%s: left as the key ready (its --ramp lives in the meta key beside it), and it stays after the ramp: "+
			"it answers as no key does, but backend-wide drains do not reach it; `hastate clear --ramped` deletes it once it has ramped (%s)",
			backend, srv, in.value.Ramp)
		pl.add(Op{Key: k.Key, Value: o.Value})
	case in.value.RampSet:
		pl.note("already ready: %s does not exist (no key means ready), so there is nothing to ramp; --ramp is not written", k.Key)
		return false
	case keys.Coverage() == CoverAbsent:
		pl.note("already ready: %s does not exist (no key means ready)", k.Key)
		return false
	default: // CoverOwn: deleting its key makes it ready
		if in.value.Reason != "" || !in.value.Until.IsZero() {
			pl.note("%s/%s: its key is deleted (no key means ready), so --reason and --for are not kept", backend, srv)
		}
		pl.add(Op{Delete: true, Key: k.Key})
	}
	return true
}

// backendWide plans the backend-wide key of backend, and deals with the
// servers whose own key it does not reach (as Consul holds them): Override
// deletes those keys in the same transaction; a drain, maint or 0% that
// some would escape (they keep serving, or stay out of a maint) is refused
// without Override or KeepOwn; the others are named in a note.
func (pl *planner) backendWide(backend string) {
	o, in := pl.o, pl.in
	w, ok := pl.read(backend, state.Wildcard)
	full := in.clear || pl.readBackend(backend)
	if !ok || !full {
		return
	}
	pl.dep(w)
	switch {
	case in.clear && !w.Present:
		if pl.view != nil && !pl.ix.known(backend) && len(pl.kv.ownKeys(backend)) == 0 {
			pl.refuse(fmt.Errorf("%w; nothing to clear: %s does not exist", ctl.NoMatch(ctl.Selector{Backend: backend, Server: state.Wildcard}, pl.rows), w.Key))
			return
		}
		pl.note("nothing to clear: %s does not exist", w.Key)
		return
	case in.clear:
		pl.add(Op{Delete: true, Key: w.Key})
		return
	case in.ready && !w.Present:
		pl.note("already ready: %s does not exist (no key means ready)", w.Key)
	case in.ready && !in.value.RampSet:
		pl.add(Op{Delete: true, Key: w.Key}) // ready is what no key means
	case in.ready:
		// hastate never writes KV itself, so no one deletes this key
		// when the ramp is done: say so, and how.
		pl.note("%s: left as the key ready (its --ramp lives in the meta key beside it), and it stays after the ramp: "+
			"it answers as no key does; `hastate clear --ramped` deletes it once it has ramped (%s), or next time `hastate ready %s` without --ramp "+
			"(the drain's own --ramp applies)", w.Key, in.value.Ramp, backend)
		pl.add(Op{Key: w.Key, Value: o.Value})
	default:
		pl.add(Op{Key: w.Key, Value: o.Value})
	}
	own := pl.kv.ownKeys(backend)
	var kept, escape []string
	for _, srv := range slices.Sorted(maps.Keys(own)) {
		k := own[srv]
		if o.Override {
			pl.dep(k)
			pl.add(Op{Delete: true, Key: k.Key})
			continue
		}
		desc := fmt.Sprintf("%s keeps %s", srv, k.short())
		if in.out && !o.KeepOwn {
			pl.dep(k) // the write goes ahead because k does not escape
		}
		if in.out && escapes(k, in) {
			escape = append(escape, desc)
		} else {
			kept = append(kept, desc)
		}
	}
	if len(escape) > 0 && !o.KeepOwn {
		pl.refuse(fmt.Errorf("refused, nothing was written: %s/* would not reach servers with their own key: %s; "+
			"add --override to clear their keys in the same transaction, or --keep-own to leave them as they are (--force does not choose for you)",
			backend, strings.Join(escape, ", ")))
		return
	}
	if kept = append(escape, kept...); len(kept) > 0 {
		advice := "; add --override to clear their keys in the same transaction"
		if o.KeepOwn {
			advice = " (--keep-own)"
		}
		pl.note("%s/* does not reach servers with their own key: %s%s", backend, strings.Join(kept, ", "), advice)
	}
	if in.out {
		pl.empties(backend, w.Key, own)
	}
}

// empties says, in the notes and in the backend-wide key's meta key, when
// a backend-wide drain, maint or 0% leaves no known server of backend in
// rotation: HAProxy sends it no traffic ("no server available"). A server
// stays in rotation only by its own key (kept: no --override) holding a
// ready weight above 0%.
func (pl *planner) empties(backend, key string, own map[string]KVKey) {
	servers := pl.ix.byBackend[backend]
	if pl.view == nil || len(servers) == 0 {
		return
	}
	for _, r := range servers {
		if k, ok := own[r.Server]; ok && !pl.o.Override && escapes(k, intent{}) {
			return // its own key keeps it in rotation
		}
	}
	effect := fmt.Sprintf("no server of %s in rotation", backend)
	pl.note("%s/*: leaves %s (%s, each covered by it): HAProxy sends the backend no traffic and logs \"no server available\"",
		backend, effect, ctl.PluralN(len(servers), "known server", "known servers"))
	for i := range pl.p.Ops {
		if pl.p.Ops[i].Key == key && !pl.p.Ops[i].Delete {
			pl.p.Ops[i].Effect = effect
		}
	}
}

// refuse records a refusal decided from what Consul holds; PlanWrite
// returns the first.
func (pl *planner) refuse(err error) {
	if pl.refusal == nil {
		pl.refusal = err
	}
}

// escapes reports whether a server's own key (as Consul holds it) keeps it
// from what a backend-wide drain, maint or 0% means: it stays in rotation
// (or its value is invalid: its answer is not the drain's), or, for a
// maint, it is not in maint.
func escapes(k KVKey, in intent) bool {
	v, ok := k.parsed()
	switch {
	case !ok:
		return true
	case in.value.Admin == state.Maint:
		return v.Admin != state.Maint
	}
	return v.Admin == state.Ready && !(v.WeightSet && v.Weight == 0)
}
