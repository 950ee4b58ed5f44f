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
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/write"
	"github.com/hastate/hastate/state"
)

// `hastate migrate-kv` rewrites the JSON values that state keys hold
// (written by release 0.13.0's CLI, or by hand) as the plain word in the
// state key and the rest in its meta key: the KV contract of the runbook.
// Each batch is one Consul transaction that checks the ModifyIndex of every
// key it writes, so an operator's concurrent write is never overwritten: a
// batch that loses the race is read again and redone.

// MigrateOptions say how the rewrite runs.
type MigrateOptions struct {
	DryRun bool
	// Now is the CLI's clock: a key whose until is within MigrateMargin
	// of it is left as it is (rewriting sets the key again, which would
	// bring back a key the leader already expired).
	Now time.Time
	// Batch is the number of keys per transaction (0: write.MaxTxnKeys/2, each
	// key is two operations).
	Batch int
	// beforeWrite, for tests, runs between the read and each write.
	beforeWrite func()
}

// MigrateMargin is how close to its until a key may be and still be
// rewritten.
const MigrateMargin = time.Minute

// MigrateResult says what the rewrite did (or, dry, would do).
type MigrateResult struct {
	Ops       []write.Op // the operations written (or to write)
	Rewritten []string   // state keys rewritten
	Left      []string   // state keys left as they are, with why
	Retried   int        // batches read again after a concurrent write
}

// Print writes the result.
func (r MigrateResult) Print(w io.Writer, dry bool) {
	verb := "rewritten"
	if dry {
		verb = "to rewrite (dry run, nothing written)"
	}
	fmt.Fprintf(w, "migrate-kv: %s %s as word + meta key\n", ctl.PluralN(len(r.Rewritten), "JSON state key", "JSON state keys"), verb)
	for _, o := range r.Ops {
		fmt.Fprintln(w, "  "+o.String())
	}
	for _, l := range r.Left {
		fmt.Fprintln(w, "left as is: "+l)
	}
	if r.Retried > 0 {
		fmt.Fprintf(w, "note: %d batches met a concurrent write and were read again\n", r.Retried)
	}
}

// MigrateKV rewrites every JSON state key under the prefix. level is the
// feature level in force in the cluster (ClusterInfo.Level.Applied): below
// state.LevelMeta a meta key's until and ramp do not count yet, so a key
// with either would lose them, and Migrate refuses.
func MigrateKV(ctx context.Context, w write.Writer, level int, o MigrateOptions) (MigrateResult, error) {
	var res MigrateResult
	if level < state.LevelMeta {
		return res, fmt.Errorf("refused, nothing was written: the cluster's feature level is %d, and meta keys give until and ramp only from level %d, "+
			"once every replica runs 0.14.0 or later: finish the rolling upgrade first (hastate status; /v1/cluster level.waiting says what waits)", max(level, state.LevelBase), state.LevelMeta)
	}
	if o.Batch <= 0 {
		o.Batch = write.MaxTxnKeys / 2
	}
	done := map[string]bool{}
	for attempt := 0; ; attempt++ {
		todo, left, err := rewritePlan(ctx, w, o.Now, done)
		if err != nil {
			return res, err
		}
		res.Left = left
		if len(todo) == 0 || o.DryRun {
			for _, m := range todo {
				res.Ops = append(res.Ops, m.ops...)
				res.Rewritten = append(res.Rewritten, m.key)
			}
			return res, nil
		}
		if attempt >= 10 {
			return res, fmt.Errorf("gave up after %d rounds: keys keep changing while migrate-kv runs (%d left, e.g. %s); run it again when writes are quiet", attempt, len(todo), todo[0].key)
		}
		raced := false
		for batch := range slices.Chunk(todo, o.Batch) {
			if o.beforeWrite != nil {
				o.beforeWrite()
			}
			err := casTxn(ctx, w, batch)
			if errors.Is(err, write.ErrConflict) {
				res.Retried++
				raced = true
				continue // read again in the next round
			}
			if err != nil {
				return res, err
			}
			for _, m := range batch {
				done[m.key] = true
				res.Ops = append(res.Ops, m.ops...)
				res.Rewritten = append(res.Rewritten, m.key)
			}
		}
		if !raced {
			return res, nil
		}
	}
}

// rewrite is one state key's rewrite: ops to write, each checked
// against the index read (0: the key must not exist).
type rewrite struct {
	key     string
	ops     []write.Op
	indexes []uint64
}

// rewritePlan reads the prefix and returns the rewrite of every JSON
// state key not in done, and the keys left as they are.
func rewritePlan(ctx context.Context, w write.Writer, now time.Time, done map[string]bool) ([]rewrite, []string, error) {
	pairs, _, err := w.Client.KV().List(w.Prefix, (&consul.QueryOptions{RequireConsistent: true}).WithContext(ctx))
	if err != nil {
		return nil, nil, ctl.ConsulError(ctx, w.Addr, err, "nothing was written")
	}
	index := map[string]uint64{}
	for _, p := range pairs {
		index[p.Key] = p.ModifyIndex
	}
	var todo []rewrite
	var left []string
	for _, p := range pairs {
		raw := string(p.Value)
		if !strings.HasPrefix(p.Key, w.Prefix+state.StatePrefix) || !state.IsJSONValue(raw) || done[p.Key] {
			continue
		}
		mk, ok := state.MetaKeyOf(p.Key)
		if !ok {
			continue // an invalid key: status reports it
		}
		v, err := state.ParseValue(raw)
		switch {
		case err != nil:
			left = append(left, p.Key+": its value is invalid ("+err.Error()+"); fix or clear it by hand")
			continue
		case !v.Until.IsZero() && !now.IsZero() && v.Until.Before(now.Add(MigrateMargin)):
			left = append(left, fmt.Sprintf("%s: its until (%s) has passed or is within %s; clear it, or run migrate-kv again later",
				p.Key, v.Until.Format(time.RFC3339), MigrateMargin))
			continue
		}
		todo = append(todo, rewrite{key: p.Key,
			ops:     []write.Op{{Key: p.Key, Value: v.String()}, {Key: mk, Value: state.MarshalMeta(v)}},
			indexes: []uint64{p.ModifyIndex, index[mk]}})
	}
	return todo, left, nil
}

// casTxn writes the batch as one transaction, each key checked against
// the index it was read at.
func casTxn(ctx context.Context, w write.Writer, batch []rewrite) error {
	var ops consul.TxnOps
	for _, m := range batch {
		for i, o := range m.ops {
			ops = append(ops, &consul.TxnOp{KV: &consul.KVTxnOp{Verb: consul.KVCAS, Key: o.Key, Value: []byte(o.Value), Index: m.indexes[i]}})
		}
	}
	return w.Txn(ctx, ops, "this batch was not written", "running migrate-kv again is safe")
}
