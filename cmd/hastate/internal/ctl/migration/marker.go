package migration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	consul "github.com/hashicorp/consul/api"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/fleet"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/write"
	"github.com/hastate/hastate/state"
)

// A migration from the runbook's per-node agent is marked in KV
// (<prefix>config/migration, state.MigrationKey) while HAProxy nodes move
// one at a time: some ask their local agent, the others hastate, and both
// read the same keys. The per-node agent knows only per-server keys with
// the four words (no backend-wide keys, no meta, no expiry, no ramps), so
// while the marker exists every write is one both serve the same way (see
// WriteOptions.Migration), and `migration start` refuses while KV holds
// keys the two would serve differently.

// Migration is what Consul holds about a migration, read consistently.
type Migration struct {
	// Marked: the marker key exists. Marker is its value and Err why
	// that value could not be read (it still marks a migration).
	Marked bool
	Marker state.Migration
	Err    error
	// ModifyIndex is the marker key's (0: absent), for a conditional
	// finish.
	ModifyIndex uint64
	// Unlike names, one line each, the keys that the per-node agent does
	// not serve as hastate does, with what to do about each.
	Unlike []string
	// Key is the marker's full key.
	Key string
}

// Read reads the marker and every key of the prefix from Consul
// (one consistent read), and lists the keys that the per-node agent would
// serve differently from hastate.
func Read(ctx context.Context, w write.Writer) (Migration, error) {
	m := Migration{Key: w.MigrationKey()}
	// An empty listing is "no marker" only from a token that may read.
	if err := fleet.CheckToken(ctx, w.Client, w.Addr, w.Prefix, "nothing was written"); err != nil {
		return m, err
	}
	pairs, _, err := w.Client.KV().List(w.Prefix, (&consul.QueryOptions{RequireConsistent: true}).WithContext(ctx))
	if err != nil {
		return m, ctl.ConsulError(ctx, w.Addr, err, "nothing was written")
	}
	kv := make(map[string]string, len(pairs))
	for _, p := range pairs {
		kv[strings.TrimPrefix(p.Key, w.Prefix)] = string(p.Value)
		if p.Key == m.Key {
			m.Marked, m.ModifyIndex = true, p.ModifyIndex
			m.Marker, m.Err = state.ParseMigration(string(p.Value))
		}
	}
	m.Unlike = unlikeKeys(kv, time.Now())
	return m, nil
}

// unlikeKeys lists the state keys (relative to the prefix) that the
// per-node agent serves differently from hastate: backend-wide keys other
// than ready, values other than its four words, and keys whose meta key
// makes them expire or ramp (an expired one named as such, with the
// command that removes it), at now.
func unlikeKeys(kv map[string]string, now time.Time) []string {
	var out []string
	for k, raw := range kv {
		rest, ok := strings.CutPrefix(k, state.StatePrefix)
		if !ok {
			continue
		}
		b, s, _ := strings.Cut(rest, "/")
		switch {
		case s == state.Wildcard && strings.TrimSpace(raw) != "ready":
			out = append(out, fmt.Sprintf("%s = %q: a backend-wide key, which the per-node agent ignores (its servers without a key of their own stay ready there); "+
				"write the servers' own keys and `hastate clear '%s/*'`", rest, cutRaw(raw), b))
		case !state.AgentWord(raw):
			out = append(out, fmt.Sprintf("%s = %q: not one of the per-node agent's four words (ready, drain, maint, N%%), so it answers nothing for %s; "+
				"`hastate migrate-kv` rewrites JSON as word + meta key, or write the word with hastate", rest, cutRaw(raw), rest))
		default:
			mk, _ := state.MetaKeyOf(k)
			meta, ok := kv[mk]
			if !ok {
				continue
			}
			v, err := state.ParseValue(meta)
			word, _ := state.ParseValue(raw)
			if err != nil || !state.IsJSONValue(meta) || v.String() != word.String() {
				continue // ignored by hastate too ("set outside hastate")
			}
			switch {
			case !v.Until.IsZero() && !v.Until.After(now):
				out = append(out, fmt.Sprintf("%s = %q expired at %s (its meta key): hastate treats it as absent, the per-node agent would serve %q; "+
					"`hastate clear --expired '%s'` removes it", rest, cutRaw(raw), v.Until.UTC().Format(time.RFC3339), cutRaw(raw), rest))
			case !v.Until.IsZero():
				out = append(out, fmt.Sprintf("%s = %q expires at %s (its meta key), which the per-node agent never does; "+
					"write it again without --for, or once it has expired remove it with `hastate clear --expired '%s'`", rest, cutRaw(raw), v.Until.UTC().Format(time.RFC3339), rest))
			case v.RampSet && v.Ramp > 0:
				out = append(out, fmt.Sprintf("%s = %q undrains with its own ramp (%s, its meta key), which the per-node agent does not; write it again without --ramp", rest, cutRaw(raw), v.Ramp))
			}
		}
	}
	slices.Sort(out)
	return out
}

// cutRaw shortens a raw value for a message.
func cutRaw(s string) string {
	if len(s) > 60 {
		return s[:60] + "..."
	}
	return s
}

// Options are the options of migration start and finish.
type Options struct {
	By, Reason string
	Now        time.Time
	// Force marks the migration although KV holds keys the per-node agent
	// serves differently (they are named).
	Force  bool
	DryRun bool
	// beforeWrite, for tests, runs between the read and the marker's CAS;
	// afterWrite between the CAS and the read that checks it.
	beforeWrite, afterWrite func()
}

// Start writes the marker (only if it does not exist: a
// concurrent start is read again, not overwritten). It refuses, writing
// nothing, while KV holds keys the per-node agent serves differently from
// hastate, unless Force. A migration already marked is left as it is.
func Start(ctx context.Context, w write.Writer, o Options) (Migration, bool, error) {
	m, err := Read(ctx, w)
	if err != nil || m.Marked {
		return m, false, err
	}
	if len(m.Unlike) > 0 && !o.Force {
		return m, false, fmt.Errorf("refused, nothing was written: the per-node agent would serve %s differently from hastate:\n  %s\n"+
			"fix them first (`hastate migration status` lists them again), or add --force to mark the migration anyway", ctl.PluralN(len(m.Unlike), "key", "keys"), strings.Join(m.Unlike, "\n  "))
	}
	m.Marker = state.Migration{Started: o.Now, By: o.By, Reason: o.Reason}
	if o.DryRun {
		return m, false, nil
	}
	if o.beforeWrite != nil {
		o.beforeWrite()
	}
	ops := consul.TxnOps{{KV: &consul.KVTxnOp{Verb: consul.KVCAS, Key: m.Key, Index: 0, Value: []byte(state.MarshalMigration(m.Marker))}}}
	res, err := w.TxnResults(ctx, ops, "nothing was written", "`hastate migration status` shows whether it was")
	if err != nil {
		if errors.Is(err, write.ErrConflict) {
			m, err = Read(ctx, w) // marked meanwhile by someone else
			return m, false, err
		}
		return m, false, err
	}
	m.Marked = true
	if len(res) == 1 && res[0].KV != nil {
		m.ModifyIndex = res[0].KV.ModifyIndex // this start's marker, as written
	}
	if o.Force {
		return m, true, nil
	}
	if o.afterWrite != nil {
		o.afterWrite()
	}
	return recheck(ctx, w, m)
}

// recheck reads the prefix again after the marker was written: the
// marker's CAS covers only the marker, so a write that read it absent and
// committed between Start's read and its CAS (a backend-wide drain, which
// the per-node agents ignore) is seen only now. Every write after the CAS
// depends on the marker (write.Options.Marker) and is planned as a
// migration write. A key found now that the per-node agent serves
// differently makes Start take its marker back (a CAS delete at the index
// its CAS wrote the marker at, so never one written meanwhile by someone
// else, whatever it holds) and refuse, naming the keys.
func recheck(ctx context.Context, w write.Writer, m Migration) (Migration, bool, error) {
	again, err := Read(ctx, w)
	if err != nil {
		return m, true, fmt.Errorf("the migration was marked, but the keys could not be read again to check that no concurrent write left one the per-node agent serves differently: %w; run `hastate migration status`", err)
	}
	if len(again.Unlike) == 0 {
		return again, true, nil
	}
	undone := "the marker was removed again"
	// This start's own marker is the one at the index its CAS wrote: one
	// written anew meanwhile (a finish and a start by someone else) may
	// hold the same words, and is theirs to keep.
	if again.Marked && m.ModifyIndex != 0 && again.ModifyIndex == m.ModifyIndex {
		ops := consul.TxnOps{{KV: &consul.KVTxnOp{Verb: consul.KVDeleteCAS, Key: again.Key, Index: m.ModifyIndex}}}
		if err := w.Txn(ctx, ops, "the marker stays", "`hastate migration status` shows whether it does"); err != nil {
			undone = fmt.Sprintf("removing the marker again failed (%v): run `hastate migration finish`", err)
		} else {
			again.Marked = false
		}
	} else {
		undone = "the marker was changed meanwhile by someone else and is left as it is"
	}
	return again, false, fmt.Errorf("refused: a concurrent write left %d keys the per-node agent serves differently from hastate while the migration was being marked (%s):\n  %s\n"+
		"fix them (`hastate migration status` lists them again), then start the migration again", len(again.Unlike), undone, strings.Join(again.Unlike, "\n  "))
}

// Finish deletes the marker, on condition that it is the one
// read (a start made meanwhile is not deleted unseen). With no migration
// marked it writes nothing.
func Finish(ctx context.Context, w write.Writer, o Options) (Migration, bool, error) {
	m, err := Read(ctx, w)
	if err != nil || !m.Marked || o.DryRun {
		return m, false, err
	}
	ops := consul.TxnOps{{KV: &consul.KVTxnOp{Verb: consul.KVDeleteCAS, Key: m.Key, Index: m.ModifyIndex}}}
	if err := w.Txn(ctx, ops, "nothing was written", "`hastate migration status` shows whether it was"); err != nil {
		return m, false, err
	}
	m.Marked = false
	return m, true, nil
}

// Print writes what the marker says.
func (m Migration) Print(out io.Writer) {
	if !m.Marked {
		fmt.Fprintf(out, "no migration from the per-node agent is marked (%s does not exist): writes use backend-wide keys, --for and --ramp\n", m.Key)
	} else {
		fmt.Fprintf(out, "migration from the per-node agent marked (%s)%s\n", m.Key, m.Marker.Describe())
		if m.Err != nil {
			fmt.Fprintf(out, "warning: %v\n", m.Err)
		}
		fmt.Fprintln(out, "while it is marked, every write is one the per-node agent serves the same way: selectors expand to per-server keys, --for and --ramp are refused, undrains do not ramp (a ramp in progress ends at full weight)")
	}
	if len(m.Unlike) == 0 {
		fmt.Fprintln(out, "KV holds no key that the per-node agent serves differently from hastate")
		return
	}
	fmt.Fprintf(out, "the per-node agent serves %s differently from hastate:\n", ctl.PluralN(len(m.Unlike), "key", "keys"))
	for _, u := range m.Unlike {
		fmt.Fprintln(out, "  "+u)
	}
}
