package write

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	consul "github.com/hashicorp/consul/api"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl"
	"github.com/hastate/hastate/state"
)

// While a migration from the per-node agent is marked, a write is one the
// per-node agent serves the same way as hastate: it knows per-server keys
// with the four words only. The planner calls these in that case.

// migrationRefuses refuses --for and --ramp while a migration is marked:
// they live in the meta key, which the per-node agent never reads.
func migrationRefuses(o Options, in intent) error {
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
// keys, so each server of backend gets its own key instead (the servers
// the cluster knows, and those with a key in Consul), and the output says
// so. ready and clear delete every key the backend has in Consul (its
// backend-wide key too): no key is ready for both; ready leaves a
// server's own maint unless Override. drain, maint and a
// weight treat the servers' own keys as a backend-wide write does
// (--override writes over them, --keep-own leaves them, one that would
// escape a drain or maint is refused without either). A backend of which
// no HAProxy that asks hastate polls a server is refused (the typo guard,
// --allow-unknown): hastate knows only its servers with keys, and the
// others would be left out.
func (pl *planner) perServer(sel ctl.Selector, backend string) {
	o, in := pl.o, pl.in
	w, ok := pl.read(backend, state.Wildcard)
	if !pl.readBackend(backend) || !ok {
		return
	}
	pl.dep(w)
	own := pl.kv.ownKeys(backend)
	set := map[string]bool{}
	polled := 0
	for _, r := range pl.ix.byBackend[backend] {
		set[r.Server] = true
		if r.Polled > 0 {
			polled++
		}
	}
	for s := range own {
		set[s] = true
	}
	servers := slices.Sorted(maps.Keys(set))
	if polled == 0 && !in.clear && !in.ready && pl.view != nil {
		err := fmt.Errorf("refused, nothing was written: a migration from the per-node agent is marked (%s), so %s expands to the per-server keys of %s's servers, "+
			"but no HAProxy that asks hastate polls any of them: hastate knows only those with a key (%s) and would leave the others out; "+
			"name the servers (%s/<server>), or move an HAProxy node that has %s to hastate first",
			o.MigrationKey, sel, backend, ctl.OrNone(servers), backend, backend)
		if !o.Allow.Unknown {
			pl.refuse(fmt.Errorf("%w; %s", err, GuardUnknown.advice(o.Allow)))
			return
		}
		pl.lift(GuardUnknown, err.Error())
	}
	var wrote, kept, escape []string
	if (in.clear || in.ready) && w.Present {
		pl.add(Op{Delete: true, Key: w.Key})
		wrote = append(wrote, state.Wildcard)
	}
	for _, srv := range servers {
		k, _ := pl.kv.key(backend, srv) // the backend was read whole
		pl.dep(k)
		switch {
		case in.ready && k.Present && !o.Override && isMaint(k):
			// A backend's undrain does not take a server out of a maint
			// of its own (as ready of <backend>/* would not).
			kept = append(kept, fmt.Sprintf("%s keeps maint (--override makes it ready too)", srv))
			continue
		case in.clear || in.ready:
			if k.Present {
				pl.add(Op{Delete: true, Key: k.Key})
				wrote = append(wrote, srv)
			}
			continue
		case k.Present && k.short() != in.value.String() && !o.Override:
			desc := fmt.Sprintf("%s keeps %s", srv, k.short())
			if in.out && escapes(k, in) {
				escape = append(escape, desc)
			} else {
				kept = append(kept, desc)
			}
			continue
		}
		pl.add(Op{Key: k.Key, Value: o.Value})
		wrote = append(wrote, srv)
	}
	if len(escape) > 0 && !o.KeepOwn {
		pl.refuse(fmt.Errorf("refused, nothing was written: %s (expanded to per-server keys: a migration from the per-node agent is marked) would not change servers with their own key: %s; "+
			"add --override to write over their keys, or --keep-own to leave them as they are (--force does not choose for you)",
			sel, strings.Join(escape, ", ")))
		return
	}
	verb := "expanded to the per-server keys of"
	if in.clear || in.ready {
		verb = "deletes every key of"
	}
	pl.note("migration from the per-node agent marked (%s): %s %s %s (the per-node agent ignores backend-wide keys): %s; "+
		"hastate knows the servers that have a key or that an HAProxy asking hastate polls (%d of %d polled): name any other server of %s",
		o.MigrationKey, sel, verb, backend, ctl.OrNone(wrote), polled, len(servers), backend)
	if kept = append(escape, kept...); len(kept) > 0 {
		pl.note("%s: servers with their own key left as they are: %s", backend, strings.Join(kept, ", "))
	}
}

// readMigration reads the migration marker from Consul, consistently. Its
// KVKey is a dependency of every write (see Writer.Apply): the
// transaction holds only while the marker is as read, so a `migration
// start` or `finish` made meanwhile makes the write read and plan again.
func (w Writer) readMigration(ctx context.Context) (KVKey, error) {
	key := w.MigrationKey()
	p, _, err := w.Client.KV().Get(key, (&consul.QueryOptions{RequireConsistent: true}).WithContext(ctx))
	if err != nil {
		return KVKey{Key: key}, ctl.ConsulError(ctx, w.Addr, err, "nothing was written")
	}
	if p == nil {
		return KVKey{Key: key}, nil
	}
	return KVKey{Key: key, Present: true, Value: string(p.Value), Index: p.ModifyIndex}, nil
}

// isMaint reports whether a key holds maint.
func isMaint(k KVKey) bool {
	v, ok := k.parsed()
	return ok && v.Admin == state.Maint
}
