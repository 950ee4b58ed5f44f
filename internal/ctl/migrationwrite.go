package ctl

import (
	"context"
	"fmt"
	"strings"

	consul "github.com/hashicorp/consul/api"
	"github.com/hastate/hastate/state"
)

// While a migration from the per-node agent is marked, a write is one the
// per-node agent serves the same way as hastate: it knows per-server keys
// with the four words only. PlanWrite calls these in that case.

// migrationRefuses refuses --for and --ramp while a migration is marked:
// they live in the meta key, which the per-node agent never reads.
func migrationRefuses(o WriteOptions, in intent) error {
	if !o.Migration {
		return nil
	}
	const finish = "write without it, or after `hastate migration finish` once every HAProxy node asks hastate"
	switch {
	case !in.value.Until.IsZero():
		return fmt.Errorf("refused, nothing was written: a migration from the per-node agent is marked (%s): --for would expire the state only on the HAProxy nodes that ask hastate, "+
			"while the nodes still on their per-node agent keep it (the agent reads the word, never the meta key's until); %s", o.MigrationKey, finish)
	case in.value.RampSet:
		return fmt.Errorf("refused, nothing was written: a migration from the per-node agent is marked (%s): --ramp would ramp the weight only on the HAProxy nodes that ask hastate, "+
			"while the per-node agent restores full weight at once (undrains do not ramp during a migration); %s", o.MigrationKey, finish)
	}
	return nil
}

// perServer is what a backend selector (backend/*, '<glob>/*') writes
// while a migration is marked: the per-node agent ignores backend-wide
// keys, so each server of backend that the cluster knows gets its own key,
// and the output says so. ready and clear delete every key the backend
// has (the backend-wide one too): no key is ready for both. drain, maint
// and a weight treat the servers' own keys as a backend-wide write does
// (--override writes over them, --keep-own leaves them, a server that
// would escape a drain or maint is refused without either). A backend of
// which no HAProxy that asks hastate polls a server is refused: hastate
// knows only its servers with keys, and the others would be left out.
func (p *Plan) perServer(ix *fleetIndex, sel Selector, backend string, o WriteOptions, in intent, add func(Op)) error {
	servers := ix.byBackend[backend]
	polled := 0
	for _, r := range servers {
		if r.Polled > 0 {
			polled++
		}
	}
	if polled == 0 && !in.clear && !in.ready && !o.Force {
		return fmt.Errorf("refused, nothing was written: a migration from the per-node agent is marked (%s), so %s expands to the per-server keys of %s's servers, "+
			"but no HAProxy that asks hastate polls any of them: hastate knows only those with a key (%s) and would leave the others out; "+
			"name the servers (%s/<server>), or move an HAProxy node that has %s to hastate first (--force writes the servers it knows)",
			o.MigrationKey, sel, backend, knownServers(servers, backend), backend, backend)
	}
	var wrote, kept, escape []string
	if (in.clear || in.ready) && ix.own[[2]string{backend, state.Wildcard}] {
		add(Op{Delete: true, Key: Key(o.Prefix, backend, state.Wildcard)})
		wrote = append(wrote, state.Wildcard)
	}
	for _, r := range servers {
		own := ownKey(r)
		key := Key(o.Prefix, r.Backend, r.Server)
		switch {
		case in.clear || in.ready:
			if own {
				add(Op{Delete: true, Key: key})
				wrote = append(wrote, r.Server)
			}
			continue
		case own && r.Desired != in.value.String() && !o.Override:
			desc := fmt.Sprintf("%s keeps %s", r.Server, orInvalid(r))
			if in.out && escapes(r, in) {
				escape = append(escape, desc)
			} else {
				kept = append(kept, desc)
			}
			continue
		}
		add(Op{Key: key, Value: o.Value})
		wrote = append(wrote, r.Server)
	}
	if len(escape) > 0 && !o.KeepOwn {
		return fmt.Errorf("refused, nothing was written: %s (expanded to per-server keys: a migration from the per-node agent is marked) would not change servers with their own key: %s; "+
			"add --override to write over their keys, or --keep-own to leave them as they are",
			sel, strings.Join(escape, ", "))
	}
	verb := "expanded to the per-server keys of"
	if in.clear || in.ready {
		verb = "deletes every key of"
	}
	names := strings.Join(wrote, ", ")
	if names == "" {
		names = "none"
	}
	p.Notes = append(p.Notes, fmt.Sprintf("migration from the per-node agent marked (%s): %s %s %s (the per-node agent ignores backend-wide keys): %s; "+
		"hastate knows the servers that have a key or that an HAProxy asking hastate polls (%d of %d polled): name any other server of %s",
		o.MigrationKey, sel, verb, backend, names, polled, len(servers), backend))
	if kept = append(escape, kept...); len(kept) > 0 {
		p.Notes = append(p.Notes, fmt.Sprintf("%s: servers with their own key left as they are: %s", backend, strings.Join(kept, ", ")))
	}
	return nil
}

// migrationGuard reads the migration marker from Consul (consistently) and
// returns whether a migration is marked, with the transaction check that
// keeps the write to what was read: the marker at that ModifyIndex, or no
// marker. A `migration start` or `finish` made between the read and the
// write fails the transaction instead of being missed.
func (w Writer) migrationGuard(ctx context.Context) (bool, *consul.KVTxnOp, error) {
	key := w.MigrationKey()
	pair, _, err := w.Client.KV().Get(key, (&consul.QueryOptions{RequireConsistent: true}).WithContext(ctx))
	if err != nil {
		return false, nil, consulError(ctx, w.Addr, err, "nothing was written")
	}
	if pair == nil {
		return false, &consul.KVTxnOp{Verb: consul.KVCheckNotExists, Key: key}, nil
	}
	return true, &consul.KVTxnOp{Verb: consul.KVCheckIndex, Key: key, Index: pair.ModifyIndex}, nil
}
