package ctl

import (
	"context"
	"fmt"
	"io"
	"maps"
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
}

func (o Op) String() string {
	if o.Delete {
		return "delete " + o.Key
	}
	return "set    " + o.Key + " = " + o.Value
}

// Plan is what a write command will do.
type Plan struct {
	Ops []Op
	// Notes are what the operator should know: servers a backend-wide
	// key does not reach, keys that were already absent.
	Notes []string
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
	// Command is drain, maint, ready, weight or clear; Value is the value
	// set (unused by clear).
	Command, Value string
	Prefix         string
	// Force skips the checks: a server no HAProxy polls, --min-ready, a
	// replica that did not answer.
	Force bool
	// Override also deletes the own keys of servers that a backend-wide
	// write would not reach.
	Override bool
	// MinReady is the fewest ready servers (among those HAProxy polls) a
	// drain or maint of individual servers may leave in a backend.
	MinReady int
}

// PlanWrite expands the selectors against fleet (the cluster's view; nil
// when no replica could be read, which only --force with literal
// backend/server arguments allows) into one transaction:
//
//   - backend/server: that key; backend/*: the backend-wide key;
//   - <glob>/*: one backend-wide key per known backend that matches;
//   - <glob>/<glob>: one key per known server that matches.
//
// A literal key with glob characters is never written. An expansion that
// matches nothing fails with ErrNoMatch and one past MaxTxnKeys is refused;
// either way nothing is written.
func PlanWrite(fleet *api.StateView, sels []Selector, o WriteOptions) (Plan, error) {
	var p Plan
	seen := map[string]bool{}
	add := func(op Op) {
		if !seen[op.Key] {
			seen[op.Key] = true
			p.Ops = append(p.Ops, op)
		}
	}
	clear := o.Command == "clear"
	var rows []api.ServerState
	if fleet != nil {
		rows = fleet.Servers
		if err := Missing(fleet.Replicas); err != nil && !o.Force {
			return p, fmt.Errorf("%w; add --force to write with what the other replicas know", err)
		}
	}
	var individual []Selector // servers a drain or maint takes out one by one
	for _, sel := range sels {
		literal := !globbed(sel.Backend) && (sel.Server == state.Wildcard || !globbed(sel.Server))
		if !literal && fleet == nil {
			return p, fmt.Errorf("%w: %s needs the servers the cluster knows, and no replica answered; name servers one by one", ErrCannotConfirm, sel)
		}
		switch {
		case literal && sel.Server == state.Wildcard:
			if fleet != nil && !o.Force && !clear && !slices.Contains(backends(rows), sel.Backend) {
				return p, fmt.Errorf("%w (add --force to write it anyway)", noMatch(sel, rows))
			}
			p.backendWide(rows, sel.Backend, o, add)
		case literal:
			if err := polled(rows, fleet != nil && !clear, sel, o.Force); err != nil {
				return p, err
			}
			add(setOrDelete(Key(o.Prefix, sel.Backend, sel.Server), o))
			individual = append(individual, sel)
		case sel.Server == state.Wildcard:
			n := 0
			for _, b := range backends(rows) {
				if sel.Match(b, state.Wildcard) {
					n++
					if !clear || hasOwnKey(rows, b, state.Wildcard) {
						p.backendWide(rows, b, o, add)
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
				if !clear || hasOwnKey(rows, r.Backend, r.Server) {
					add(setOrDelete(Key(o.Prefix, r.Backend, r.Server), o))
					individual = append(individual, Selector{r.Backend, r.Server})
				}
			}
			if n == 0 {
				return p, noMatch(sel, rows)
			}
		}
	}
	if n := txnLen(p.Ops); n > MaxTxnKeys {
		return p, fmt.Errorf("refused, nothing was written: %d keys, each with its meta key, are %d operations, more than one Consul transaction holds (%d); "+
			"use backend-wide keys (<backend>/*, or '<glob>/*') or split the command", len(p.Ops), n, MaxTxnKeys)
	}
	if (o.Command == "drain" || o.Command == "maint") && fleet != nil && !o.Force {
		if err := minReady(rows, individual, o.MinReady); err != nil {
			return p, err
		}
	}
	return p, nil
}

func setOrDelete(key string, o WriteOptions) Op {
	if o.Command == "clear" {
		return Op{Delete: true, Key: key}
	}
	return Op{Key: key, Value: o.Value}
}

// backendWide adds the backend-wide key of backend, and says which servers
// keep their own key (and so are not reached by it), or deletes those keys
// with Override.
func (p *Plan) backendWide(rows []api.ServerState, backend string, o WriteOptions, add func(Op)) {
	add(setOrDelete(Key(o.Prefix, backend, state.Wildcard), o))
	if o.Command == "clear" {
		return
	}
	var kept []string
	for _, r := range rows {
		if r.Backend != backend || r.Server == state.Wildcard || !ownKey(r) {
			continue
		}
		if o.Override {
			add(Op{Delete: true, Key: Key(o.Prefix, r.Backend, r.Server)})
			continue
		}
		kept = append(kept, fmt.Sprintf("%s keeps %s", r.Server, orInvalid(r)))
	}
	if len(kept) > 0 {
		p.Notes = append(p.Notes, fmt.Sprintf("%s/* does not reach servers with their own key: %s; add --override to clear their keys in the same transaction",
			backend, strings.Join(kept, ", ")))
	}
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

func hasOwnKey(rows []api.ServerState, backend, server string) bool {
	for _, r := range rows {
		if r.Backend == backend && r.Server == server && ownKey(r) {
			return true
		}
	}
	return false
}

func backends(rows []api.ServerState) []string {
	set := map[string]bool{}
	for _, r := range rows {
		set[r.Backend] = true
	}
	return slices.Sorted(maps.Keys(set))
}

// polled refuses a write for a server no HAProxy has polled within
// api.PollerTTL (a typo, or a server not in haproxy.cfg), naming the
// servers the cluster knows in that backend.
func polled(rows []api.ServerState, known bool, sel Selector, force bool) error {
	if force || !known {
		return nil
	}
	for _, r := range rows {
		if r.Backend == sel.Backend && r.Server == sel.Server && r.Polled > 0 {
			return nil
		}
	}
	return fmt.Errorf("refused, nothing was written: no HAProxy has polled %s in the last %s (a typo?); known servers of %s: %s; add --force to write it anyway",
		sel, api.PollerTTL, sel.Backend, knownServers(rows, sel.Backend))
}

// minReady refuses to take individual servers out when that leaves a
// backend with fewer than min ready servers among those HAProxy polls.
func minReady(rows []api.ServerState, out []Selector, min int) error {
	type count struct{ before, after int }
	counts := map[string]*count{}
	affected := map[string]bool{}
	for _, s := range out {
		affected[s.Backend] = true
	}
	for _, r := range rows {
		if !affected[r.Backend] || r.Server == state.Wildcard || r.Polled == 0 || !servesTraffic(r.Answer) {
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
	return fmt.Errorf("refused, nothing was written: %s, fewer than --min-ready %d; drain the whole backend with <backend>/* if you mean to, or add --force",
		strings.Join(bad, "; "), min)
}

// servesTraffic reports whether an answer lets HAProxy send traffic.
func servesTraffic(answer string) bool {
	return strings.HasPrefix(answer, "ready ") && answer != "ready 0%"
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
		if o.Delete && !have[o.Key] {
			p.Notes = append(p.Notes, "nothing to clear: "+o.Key+" does not exist")
			continue
		}
		ops = append(ops, o)
	}
	p.Ops = ops
	return nil
}

// Apply writes the plan as one transaction.
func (w Writer) Apply(ctx context.Context, p Plan) error {
	ops := make(consul.TxnOps, 0, 2*len(p.Ops))
	for _, planned := range p.Ops {
		for _, o := range TxnOps(planned) {
			op := &consul.KVTxnOp{Verb: consul.KVSet, Key: o.Key, Value: []byte(o.Value)}
			if o.Delete {
				op = &consul.KVTxnOp{Verb: consul.KVDelete, Key: o.Key}
			}
			ops = append(ops, &consul.TxnOp{KV: op})
		}
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
