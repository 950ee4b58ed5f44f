package ctl

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"path"
	"slices"
	"strings"

	consul "github.com/hashicorp/consul/api"
	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/kvsync"
	"github.com/hastate/hastate/state"
)

// A write command (drain, maint, ready, weight, clear) is planned against
// the servers the cluster knows, then written as one Consul transaction:
// all or nothing. The plan says exactly what the transaction does.

// Op is one operation of a write: set a key to a value, or delete it.
type Op struct {
	Delete bool
	Key    string
	Value  string // for a set
	// Absent is the note for a delete of a key that does not exist
	// (DropAbsent drops such deletes); empty: "nothing to clear".
	Absent string
	// Covered, on ready's delete, is the value to write instead when
	// Consul holds a backend-wide key for the server that the replica's
	// view did not show (see DropAbsent).
	Covered string
}

func (o Op) String() string {
	if o.Delete {
		return "delete " + o.Key
	}
	return "set    " + o.Key + " = " + o.Value
}

// Plan is what a write command will do.
type Plan struct {
	// Command names the command in messages ("drain", "weight 25%").
	Command string
	Ops     []Op
	// Written: Write applied the operations (false for a dry run).
	Written bool
	// Notes are what the operator should know: servers a backend-wide
	// key does not reach, keys that were already absent.
	Notes []string
	// check is the transaction's condition on the migration marker (see
	// Writer.migrationGuard); nil: none.
	check *consul.KVTxnOp
}

// Print writes the plan, one Consul operation a line (see TxnOps), then
// the notes.
func (p Plan) Print(w io.Writer) {
	for _, o := range p.Ops {
		for _, t := range TxnOps(o) {
			fmt.Fprintln(w, "  "+t.String())
		}
	}
	for _, n := range p.Notes {
		fmt.Fprintln(w, "note: "+n)
	}
}

// WriteOptions say what a write command writes.
type WriteOptions struct {
	// Command is drain, maint, ready, weight or clear (for messages:
	// "weight 25%"); Value is the value set (unused by clear).
	Command, Value string
	Prefix         string
	// Force skips the checks: a server no HAProxy polls, --min-ready, a
	// replica that did not answer.
	Force bool
	// Override also deletes the own keys of servers that a backend-wide
	// write would not reach; KeepOwn leaves them (a backend-wide drain,
	// maint or 0% that some servers would escape is refused without one
	// of the two).
	Override, KeepOwn bool
	// MinReady is the fewest ready servers (among those HAProxy polls) a
	// drain, maint or 0% of individual servers may leave in a backend.
	MinReady int
	// Migration: a migration from the per-node agent is marked (read
	// from Consul; MigrationKey names the marker). The write is then one
	// both serve the same way: backend selectors expand to per-server
	// keys, --for and --ramp are refused, and the typo guard also accepts
	// a server that has a key of its own.
	Migration    bool
	MigrationKey string
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

func intentOf(o WriteOptions) (intent, error) {
	if o.Command == "clear" {
		return intent{clear: true}, nil
	}
	v, err := state.ParseValue(o.Value)
	if err != nil {
		return intent{}, fmt.Errorf("%w: %v", ErrUsage, err) // a bug: Value checks what it builds
	}
	return intent{value: v, ready: v.Admin == state.Ready && !v.WeightSet,
		out: v.Admin != state.Ready || (v.WeightSet && v.Weight == 0)}, nil
}

// PlanWrite expands the selectors against fleet (the cluster's view; nil
// when no replica could be read, which only --force with literal
// backend/server arguments allows) into one transaction:
//
//   - backend/server: that key; backend/*: the backend-wide key;
//   - <glob>/*: one backend-wide key per known backend that matches;
//   - <glob>/<glob>: one key per known server that matches.
//
// ready deletes a server's own key when no backend-wide key covers it
// (the absent key is ready, and later backend-wide drains reach it again),
// and writes ready under one. A literal key with glob characters is never
// written. A selector that matches nothing fails with ErrNoMatch, naming
// the known backends; a backend-wide drain, maint or 0% that servers with
// their own key would escape is refused unless Override or KeepOwn; an
// expansion past MaxTxnKeys is refused; either way nothing is written.
func PlanWrite(fleet *api.StateView, sels []Selector, o WriteOptions) (Plan, error) {
	p := Plan{Command: o.Command}
	in, err := intentOf(o)
	if err != nil {
		return p, err
	}
	seen := map[string]bool{}
	add := func(op Op) {
		if !seen[op.Key] {
			seen[op.Key] = true
			p.Ops = append(p.Ops, op)
		}
	}
	if err := migrationRefuses(o, in); err != nil {
		return p, err
	}
	var rows []api.ServerState
	if fleet != nil {
		rows = fleet.Servers
		if err := Missing(fleet.Replicas); err != nil && !o.Force {
			return p, fmt.Errorf("%w; add --force to write with what the other replicas know", err)
		}
	}
	ix := indexFleet(rows)
	var individual []Selector // servers the write takes out one by one
	server := func(backend, srv string) {
		add(p.serverOp(ix, fleet != nil, backend, srv, o, in))
		individual = append(individual, Selector{backend, srv})
	}
	for _, sel := range sels {
		literal := !globbed(sel.Backend) && (sel.Server == state.Wildcard || !globbed(sel.Server))
		if !literal && fleet == nil {
			return p, fmt.Errorf("%w: %s needs the servers the cluster knows, and no replica answered; name servers one by one", ErrCannotConfirm, sel)
		}
		switch {
		case literal && sel.Server == state.Wildcard:
			if fleet != nil && !o.Force && !in.clear && !ix.known(sel.Backend) {
				return p, fmt.Errorf("%w (add --force to write it anyway)", noMatch(sel, rows))
			}
			if o.Migration {
				if fleet == nil {
					return p, fmt.Errorf("%w: a migration from the per-node agent is marked, so %s expands to per-server keys, which needs the servers the cluster knows, and no replica answered; name servers one by one", ErrCannotConfirm, sel)
				}
				if err := p.perServer(ix, sel, sel.Backend, o, in, add); err != nil {
					return p, err
				}
				continue
			}
			if err := p.backendWide(ix, sel.Backend, o, in, add); err != nil {
				return p, err
			}
		case literal:
			if err := polled(ix, fleet != nil && !in.clear, sel, o.Force, o.Migration); err != nil {
				return p, err
			}
			server(sel.Backend, sel.Server)
		case sel.Server == state.Wildcard:
			n := 0
			for _, b := range ix.backends {
				if sel.Match(b, state.Wildcard) {
					n++
					if o.Migration {
						if err := p.perServer(ix, sel, b, o, in, add); err != nil {
							return p, err
						}
						continue
					}
					if in.clear && !ix.own[[2]string{b, state.Wildcard}] {
						continue
					}
					if err := p.backendWide(ix, b, o, in, add); err != nil {
						return p, err
					}
				}
			}
			if n == 0 {
				return p, noMatch(sel, rows)
			}
		default:
			n := 0
			for _, r := range rows {
				if r.Server == state.Wildcard || !sel.Match(r.Backend, r.Server) {
					continue
				}
				n++
				if !in.clear || ix.own[[2]string{r.Backend, r.Server}] {
					server(r.Backend, r.Server)
				}
			}
			if n == 0 {
				return p, noMatch(sel, rows)
			}
		}
	}
	if n := txnLen(p.Ops); n > MaxTxnKeys && o.Migration {
		return p, fmt.Errorf("refused, nothing was written: %d keys, each with its meta key, are %d operations, more than one Consul transaction holds (%d); "+
			"a migration from the per-node agent is marked, so backend-wide keys are not an option: split the command (a backend, or a zone of one backend, at a time)", len(p.Ops), n, MaxTxnKeys)
	}
	if n := txnLen(p.Ops); n > MaxTxnKeys {
		return p, fmt.Errorf("refused, nothing was written: %d keys, each with its meta key, are %d operations, more than one Consul transaction holds (%d); "+
			"use backend-wide keys (<backend>/*, or '<glob>/*') or split the command", len(p.Ops), n, MaxTxnKeys)
	}
	if in.out && fleet != nil && !o.Force {
		if err := minReady(rows, individual, o.MinReady); err != nil {
			return p, err
		}
	}
	return p, nil
}

// serverOp is the operation on one server's own key. ready deletes the
// key unless a backend-wide key covers the server (or the value carries a
// ramp, which lives in the key), so that the server follows backend-wide
// keys again.
func (p *Plan) serverOp(ix *fleetIndex, known bool, backend, srv string, o WriteOptions, in intent) Op {
	key := Key(o.Prefix, backend, srv)
	switch {
	case in.clear:
		return Op{Delete: true, Key: key}
	case !in.ready:
		return Op{Key: key, Value: o.Value}
	case !known:
		p.Notes = append(p.Notes, fmt.Sprintf("%s/%s: no replica answered, so ready writes its key (a backend-wide key may cover it); "+
			"it then stays out of backend-wide drains until `hastate clear %s/%s`", backend, srv, backend, srv))
		return Op{Key: key, Value: o.Value}
	}
	if w, ok := ix.wild[backend]; ok && w.Kind != api.KindReady {
		p.Notes = append(p.Notes, fmt.Sprintf("%s/%s: written as ready under %s/* (%s), so it now stays out of backend-wide drains and maints; "+
			"`hastate clear %s/%s` makes it follow %s/* again", backend, srv, backend, orInvalid(w), backend, srv, backend))
		return Op{Key: key, Value: o.Value}
	}
	if in.value.RampSet {
		p.Notes = append(p.Notes, fmt.Sprintf("%s/%s: written as ready because --ramp lives in its key; `hastate clear %s/%s` once it has ramped, "+
			"so that backend-wide drains reach it again", backend, srv, backend, srv))
		return Op{Key: key, Value: o.Value}
	}
	if in.value.Reason != "" || !in.value.Until.IsZero() {
		p.Notes = append(p.Notes, fmt.Sprintf("%s/%s: its key is deleted (no key means ready), so --reason and --for are not kept", backend, srv))
	}
	return Op{Delete: true, Key: key, Absent: "already ready: " + key + " does not exist (no key means ready)", Covered: o.Value}
}

// fleetIndex answers PlanWrite's questions about the fleet without a scan
// per matched server (a glob can match 50,000): which targets have a key
// of their own, each backend's own backend-wide key and servers, the
// known backends.
type fleetIndex struct {
	rows      []api.ServerState
	own       map[[2]string]bool           // (backend, server or "*") with its own key
	wild      map[string]api.ServerState   // backend -> the row of its own backend-wide key
	byBackend map[string][]api.ServerState // backend -> its servers (not "*")
	backends  []string                     // sorted
}

func indexFleet(rows []api.ServerState) *fleetIndex {
	ix := &fleetIndex{rows: rows, own: map[[2]string]bool{}, wild: map[string]api.ServerState{}, byBackend: map[string][]api.ServerState{}}
	for _, r := range rows {
		if _, ok := ix.byBackend[r.Backend]; !ok {
			ix.byBackend[r.Backend] = nil
			ix.backends = append(ix.backends, r.Backend)
		}
		if ownKey(r) {
			ix.own[[2]string{r.Backend, r.Server}] = true
			if r.Server == state.Wildcard {
				ix.wild[r.Backend] = r
			}
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

// backendWide adds the backend-wide key of backend, and deals with the
// servers whose own key it does not reach: Override deletes those keys in
// the same transaction; a drain, maint or 0% that some would escape (they
// keep serving, or stay out of a maint) is refused without Override or
// KeepOwn; the others are named in a note.
func (p *Plan) backendWide(ix *fleetIndex, backend string, o WriteOptions, in intent, add func(Op)) error {
	key := Key(o.Prefix, backend, state.Wildcard)
	switch {
	case in.clear:
		add(Op{Delete: true, Key: key})
		return nil
	case in.ready && !in.value.RampSet:
		// ready is what no key means.
		add(Op{Delete: true, Key: key, Absent: "already ready: " + key + " does not exist (no key means ready)"})
	default:
		add(Op{Key: key, Value: o.Value})
	}
	var kept, escape []string
	for _, r := range ix.byBackend[backend] {
		if !ownKey(r) {
			continue
		}
		if o.Override {
			add(Op{Delete: true, Key: Key(o.Prefix, r.Backend, r.Server)})
			continue
		}
		desc := fmt.Sprintf("%s keeps %s", r.Server, orInvalid(r))
		if in.out && escapes(r, in) {
			escape = append(escape, desc)
		} else {
			kept = append(kept, desc)
		}
	}
	if len(escape) > 0 && !o.KeepOwn {
		return fmt.Errorf("refused, nothing was written: %s/* would not reach servers with their own key: %s; "+
			"add --override to clear their keys in the same transaction, or --keep-own to leave them as they are",
			backend, strings.Join(escape, ", "))
	}
	if kept = append(escape, kept...); len(kept) > 0 {
		advice := "; add --override to clear their keys in the same transaction"
		if o.KeepOwn {
			advice = " (--keep-own)"
		}
		p.Notes = append(p.Notes, fmt.Sprintf("%s/* does not reach servers with their own key: %s%s", backend, strings.Join(kept, ", "), advice))
	}
	return nil
}

// escapes reports whether a server's own key keeps it from what a
// backend-wide drain, maint or 0% means: it stays in rotation (or its
// answer is withheld), or, for a maint, it is not in maint.
func escapes(r api.ServerState, in intent) bool {
	if in.value.Admin == state.Maint {
		return r.Kind != api.KindMaint
	}
	return r.InRotation() || r.Kind == api.KindWithheld
}

func orInvalid(r api.ServerState) string {
	if r.Desired == "" {
		return "an invalid value"
	}
	return r.Desired
}

// ownKey reports whether the row's answer comes from the server's own key.
func ownKey(r api.ServerState) bool {
	return r.Key != "" && strings.HasSuffix(r.Key, state.StatePrefix+r.Backend+"/"+r.Server)
}

// polled refuses a write for a server no HAProxy has polled within
// api.PollerTTL (a typo, or a server not in haproxy.cfg), naming the
// servers the cluster knows in that backend: a server the cluster does not
// know at all matched nothing (ErrNoMatch, and an unknown backend names the
// known backends).
//
// While a migration is marked (migrating), a server with a key of its own
// in Consul passes too: before any HAProxy node is moved, none polls
// hastate, and the keys are what the per-node agents serve.
func polled(ix *fleetIndex, known bool, sel Selector, force, migrating bool) error {
	if force || !known {
		return nil
	}
	rows := ix.rows
	if !ix.known(sel.Backend) {
		return fmt.Errorf("%w (add --force to write it anyway)", noMatch(sel, rows))
	}
	for _, r := range ix.byBackend[sel.Backend] {
		if r.Server == sel.Server {
			if r.Polled > 0 || (migrating && ownKey(r)) {
				return nil
			}
			return fmt.Errorf("refused, nothing was written: no HAProxy has polled %s in the last %s (a typo?); known servers of %s: %s; add --force to write it anyway",
				sel, api.PollerTTL, sel.Backend, knownServers(rows, sel.Backend))
		}
	}
	if migrating {
		return fmt.Errorf("%w: no server matches '%s': no HAProxy that asks hastate has polled %s in the last %s and it has no key in Consul (a typo? HAProxy nodes still on the per-node agent are not seen); known servers of %s: %s; add --force to write it anyway",
			ErrNoMatch, sel, sel, api.PollerTTL, sel.Backend, knownServers(rows, sel.Backend))
	}
	return fmt.Errorf("%w: no server matches '%s': no HAProxy has polled %s in the last %s and it has no key (a typo?); known servers of %s: %s; add --force to write it anyway",
		ErrNoMatch, sel, sel, api.PollerTTL, sel.Backend, knownServers(rows, sel.Backend))
}

// minReady refuses to take individual servers out when that leaves a
// backend with fewer than min ready servers among those HAProxy polls. A
// server at 0% is not ready (HAProxy shows it as DRAIN).
func minReady(rows []api.ServerState, out []Selector, min int) error {
	type count struct{ before, after int }
	counts := map[string]*count{}
	affected := map[string]bool{}
	for _, s := range out {
		affected[s.Backend] = true
	}
	for _, r := range rows {
		if !affected[r.Backend] || r.Server == state.Wildcard || r.Polled == 0 || !r.InRotation() {
			continue
		}
		c := counts[r.Backend]
		if c == nil {
			c = &count{}
			counts[r.Backend] = c
		}
		c.before++
		if !containsSel(out, Selector{r.Backend, r.Server}) {
			c.after++
		}
	}
	var bad []string
	for _, b := range slices.Sorted(maps.Keys(affected)) {
		c := counts[b]
		if c == nil {
			c = &count{}
		}
		if c.after < min && c.after < c.before {
			bad = append(bad, fmt.Sprintf("%s would have %d ready of the servers HAProxy polls (now %d)", b, c.after, c.before))
		}
	}
	if len(bad) == 0 {
		return nil
	}
	return fmt.Errorf("refused, nothing was written: %s, fewer than --min-ready %d (a server at 0%% is not ready: HAProxy shows it as DRAIN); "+
		"drain the whole backend with <backend>/* if you mean to, or add --force",
		strings.Join(bad, "; "), min)
}

// Writer writes desired state to Consul KV.
type Writer struct {
	Client *consul.Client
	Prefix string
	Addr   string // Consul's address, for messages
}

// NewWriter returns a Writer for the Consul at addr ("": CONSUL_HTTP_ADDR,
// else 127.0.0.1:8500; see kvsync.ClientConfig) and the KV prefix.
func NewWriter(addr, prefix string) (Writer, error) {
	if !strings.HasSuffix(prefix, "/") {
		return Writer{}, fmt.Errorf("%w: --kv-prefix %q must end with '/'", ErrUsage, prefix)
	}
	cfg := kvsync.ClientConfig(addr)
	cl, err := consul.NewClient(cfg)
	if err != nil {
		return Writer{}, fmt.Errorf("consul client for %q: %w (check CONSUL_HTTP_ADDR / --consul-addr and the CONSUL_* TLS variables)", cfg.Address, err)
	}
	return Writer{Client: cl, Prefix: prefix, Addr: cfg.Address}, nil
}

// consulError explains a failed call to the Consul at addr; note (if
// any) comes before the advice, e.g. "nothing was written".
func consulError(ctx context.Context, addr string, err error, note string) error {
	if addr == "" {
		addr = "CONSUL_HTTP_ADDR"
	}
	if note != "" {
		note += "; "
	}
	return callError(ctx, "consul", addr, err, note+"check CONSUL_HTTP_ADDR / --consul-addr and CONSUL_HTTP_TOKEN")
}

// DropAbsent removes the deletes of keys that do not exist from the plan,
// with a note for each, so that clear says "nothing to clear" instead of
// claiming a delete.
func (w Writer) DropAbsent(ctx context.Context, p *Plan) error {
	keys, _, err := w.Client.KV().Keys(w.Prefix+state.StatePrefix, "", (&consul.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return consulError(ctx, w.Addr, err, "nothing was written")
	}
	have := map[string]bool{}
	for _, k := range keys {
		have[k] = true
	}
	ops := p.Ops[:0]
	for _, o := range p.Ops {
		if wild := path.Dir(o.Key) + "/" + state.Wildcard; o.Delete && o.Covered != "" && !have[o.Key] && have[wild] {
			// The replica's view showed no backend-wide key, Consul has
			// one: ready must not silently leave the server under it.
			p.Notes = append(p.Notes, fmt.Sprintf("%s: written as ready: Consul holds %s, which the replica had not shown yet", o.Key, wild))
			ops = append(ops, Op{Key: o.Key, Value: o.Covered})
			continue
		}
		if o.Delete && !have[o.Key] {
			p.Notes = append(p.Notes, cmp.Or(o.Absent, "nothing to clear: "+o.Key+" does not exist"))
			continue
		}
		ops = append(ops, o)
	}
	p.Ops = ops
	return nil
}

// txnOps are the Consul transaction operations of one planned operation:
// a state key with its meta key (see TxnOps).
func (o Op) txnOps() consul.TxnOps {
	var ops consul.TxnOps
	for _, t := range TxnOps(o) {
		op := &consul.KVTxnOp{Verb: consul.KVSet, Key: t.Key, Value: []byte(t.Value)}
		if t.Delete {
			op = &consul.KVTxnOp{Verb: consul.KVDelete, Key: t.Key}
		}
		ops = append(ops, &consul.TxnOp{KV: op})
	}
	return ops
}

// Apply writes the plan as one transaction.
func (w Writer) Apply(ctx context.Context, p Plan) error {
	ops := make(consul.TxnOps, 0, 2*len(p.Ops))
	for _, o := range p.Ops {
		ops = append(ops, o.txnOps()...)
	}
	if p.check != nil {
		ops = append(ops, &consul.TxnOp{KV: p.check})
	}
	return w.txn(ctx, ops, "nothing was written", "running the command again is safe")
}

// txn runs one Consul transaction. unwritten says what a failure means
// ("nothing was written"), again what to do when the request may have
// reached Consul before the deadline. A rollback's reasons are in the
// error; errCAS wraps it when an index check failed.
func (w Writer) txn(ctx context.Context, ops consul.TxnOps, unwritten, again string) error {
	ok, resp, _, err := w.Client.Txn().Txn(ops, (&consul.QueryOptions{}).WithContext(ctx))
	if err != nil {
		note := unwritten
		if ctx.Err() != nil {
			// The request may have reached Consul before the deadline.
			note = "the transaction may or may not have been applied (all or nothing); " + again
		}
		return consulError(ctx, w.Addr, err, note)
	}
	if !ok {
		var msgs []string
		for _, e := range resp.Errors {
			msgs = append(msgs, e.What)
		}
		what := strings.Join(msgs, "; ")
		if strings.Contains(what, "index") {
			return fmt.Errorf("%w: %s", errCAS, what)
		}
		return fmt.Errorf("consul rolled back the transaction, %s: %s (check the token's KV write permission on the prefix)", unwritten, what)
	}
	return nil
}
