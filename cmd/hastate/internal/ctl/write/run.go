package write

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/fleet"
	"github.com/hastate/hastate/state"
)

// Request is one write command (drain, maint, ready, weight, clear)
// as the operator gave it.
type Request struct {
	Options
	Selectors []ctl.Selector
	// DryRun prints the transaction and writes nothing.
	DryRun  bool
	Writer  Writer
	Replica *fleet.Replica
	// beforeApply, for tests, runs between the plan and each transaction.
	beforeApply func(attempt int)
}

// maxConflicts bounds how often a write is read and planned again after
// a concurrent write changed a key it depended on.
const maxConflicts = 5

// Write runs a write command:
//
//  1. it checks that the replica reads this KV prefix of this Consul
//     (fleet.CheckReplica), and refuses a mismatch;
//  2. it reads from Consul, consistently, the keys the plan depends on
//     (which exist, which backend-wide keys cover a server);
//  3. it waits (bounded by ctx) until the replica has applied Consul's
//     index of the prefix read after them, and reads the fleet (who polls
//     which server, capacity); a replica that cannot be asked, or does not
//     catch up, is the "no replica to ask" guard, which Allow.NoReplica
//     lifts, saying so: the wait is never skipped silently;
//  4. it plans (PlanWrite) and applies the plan as one Consul transaction
//     conditional on every key step 2 read (not with DryRun). A
//     transaction that fails a condition because a key changed is read and
//     planned again, at most maxConflicts times.
//
// The plan says what was (or would be) written; Report prints it.
func Write(ctx context.Context, req Request) (Plan, error) {
	if req.MinReady < 0 {
		return Plan{Command: req.Command}, fmt.Errorf("%w: --min-ready %d: want 0 or more ready servers (0: no capacity check)", ctl.ErrUsage, req.MinReady)
	}
	req.Prefix = req.Writer.Prefix
	w := &writeRun{req: req, gate: fleet.GateOptions{Consul: req.Writer.Client, ConsulAddr: req.Writer.Addr, Prefix: req.Writer.Prefix, Replica: req.Replica}}
	fail := func(err error) (Plan, error) { return Plan{Command: req.Command, Lifted: w.lifted}, err }
	// Decide from nothing the token cannot vouch for: Consul lists the
	// prefix as empty for a token that may not read it.
	if err := fleet.CheckToken(ctx, req.Writer.Client, req.Writer.Addr, req.Prefix, "nothing was written"); err != nil {
		return fail(err)
	}
	if err := fleet.CheckReplica(ctx, req.Writer.Client, req.Writer.Addr, req.Prefix, req.Replica); err != nil {
		var unknown fleet.ReplicaUnknownError
		if !errors.As(err, &unknown) || !req.Allow.NoReplica {
			if errors.As(err, &unknown) {
				err = fmt.Errorf("%w; nothing was written; %s", err, GuardNoReplica.advice(req.Allow))
			}
			return fail(err)
		}
		w.lift(GuardNoReplica, err.Error())
		w.noReplica = true
	}
	retried := 0
	for {
		plan, err := w.plan(ctx)
		plan.Retried = retried
		if err != nil || len(plan.Ops) == 0 || req.DryRun {
			return plan, err
		}
		if req.beforeApply != nil {
			req.beforeApply(retried)
		}
		err = req.Writer.Apply(ctx, plan)
		if err == nil {
			plan.Written = true
			return plan, nil
		}
		if !isConflict(err) {
			return plan, err
		}
		changed, cerr := req.Writer.changed(ctx, plan.Deps)
		switch {
		case cerr != nil:
			return plan, fmt.Errorf("%w; then: %w", err, cerr)
		case !changed:
			return plan, fmt.Errorf("consul rolled back the transaction, nothing was written: %w, yet the keys read again are as they were (check the token's KV write permission on the prefix)", err)
		case retried+1 >= maxConflicts:
			return plan, fmt.Errorf("refused, nothing was written: the keys this write depends on changed %d times while it ran (%w); run it again when the concurrent writes are done", maxConflicts, err)
		}
		retried++
	}
}

// writeRun is one Write: the guards lifted so far carry over a re-read.
type writeRun struct {
	req       Request
	gate      fleet.GateOptions
	noReplica bool   // the replica could not be asked (lifted)
	liveNote  string // a replica did not answer, and why the others decide
	lifted    []Lifted
}

func (w *writeRun) lift(g Guard, said string) {
	p := Plan{Lifted: w.lifted}
	p.lift(g, w.req.Allow.by(g), said)
	w.lifted = p.Lifted
}

// maxRounds bounds the reads of one plan: a glob can make the plan read
// backends it did not know it needed.
const maxRounds = 4

// plan reads Consul and the fleet and plans, until the plan has read
// every key it depends on.
func (w *writeRun) plan(ctx context.Context) (Plan, error) {
	kv := NewKVRead(w.req.Prefix)
	// --force or not, a write during a migration is one the per-node
	// agent serves the same way; the marker is a dependency of the
	// transaction like every key the plan read.
	marker, err := w.req.Writer.readMigration(ctx)
	if err != nil {
		return Plan{Command: w.req.Command, Lifted: w.lifted}, err
	}
	var needs *kvNeeds
	if literal(w.req.Selectors) {
		// What literal selectors depend on does not depend on the fleet:
		// read it first, so that one index read and one wait cover it.
		o := w.req.Options
		o.Allow.NoReplica = true
		o.Migration, o.MigrationKey = marker.Present, marker.Key
		_, needs, _ = PlanWrite(nil, kv, w.req.Selectors, o)
	}
	var view *api.StateView
	var at uint64 // the index view was read at
	for range maxRounds {
		if err := w.req.Writer.Read(ctx, kv, needs); err != nil {
			return Plan{Command: w.req.Command, Lifted: w.lifted}, err
		}
		index, err := w.gate.ConsulIndex(ctx)
		if err != nil {
			// Without Consul nothing can be written, whatever the flags.
			return Plan{Command: w.req.Command, Lifted: w.lifted}, fmt.Errorf("%w; nothing was written", err)
		}
		if view == nil || index != at {
			if view, err = w.fleetAt(ctx, index); err != nil {
				return Plan{Command: w.req.Command, Lifted: w.lifted}, err
			}
			at = index
		}
		opts := w.req.Options
		opts.Migration, opts.MigrationKey, opts.Marker = marker.Present, marker.Key, &marker
		opts.Live = func(answers []api.ReplicaAnswer) error {
			note, err := w.req.Replica.Live(ctx, answers)
			if note != "" {
				w.liveNote = note
			}
			return err
		}
		plan, more, err := PlanWrite(view, kv, w.req.Selectors, opts)
		plan.Lifted = append(append([]Lifted(nil), w.lifted...), plan.Lifted...)
		if w.liveNote != "" {
			plan.Notes = append(plan.Notes, w.liveNote)
		}
		if err != nil || !more.any() {
			lifted := plan.liftedNames()
			for i := range plan.Ops {
				plan.Ops[i].Lifted = lifted
			}
			return plan, err
		}
		needs = more
	}
	return Plan{Command: w.req.Command, Lifted: w.lifted}, fmt.Errorf("%w: the keys this write depends on kept moving while it read them (%d rounds); nothing was written, run it again", ctl.ErrCannotConfirm, maxRounds)
}

// literal reports whether no selector has a glob (backend/* aside).
func literal(sels []ctl.Selector) bool {
	for _, sel := range sels {
		if ctl.Globbed(sel.Backend) || (sel.Server != state.Wildcard && ctl.Globbed(sel.Server)) {
			return false
		}
	}
	return true
}

// fleetAt waits until the replica has applied Consul index index, then
// reads the fleet. A replica that cannot be asked or does not catch up
// in time refuses the write (ctl.ErrCannotConfirm) unless Allow.NoReplica;
// then the wait takes at most half the time left, the guard is named, and
// the plan has no fleet (literal backend/server only, Consul still
// decides which keys exist).
func (w *writeRun) fleetAt(ctx context.Context, index uint64) (*api.StateView, error) {
	if w.noReplica {
		return nil, nil
	}
	wctx, cancel := ctx, context.CancelFunc(func() {})
	if dl, ok := ctx.Deadline(); ok && w.req.Allow.NoReplica {
		wctx, cancel = context.WithDeadline(ctx, time.Now().Add(time.Until(dl)/2))
	}
	defer cancel()
	err := w.gate.Synced(wctx, index)
	var v api.StateView
	if err == nil {
		// The servers of the backends the selectors name: what the
		// plan expands and the capacity guard counts.
		v, err = w.req.Replica.Fleet(wctx, fleet.BackendsOf(w.req.Selectors)...)
	}
	switch {
	case err == nil:
		return &v, nil
	case !w.req.Allow.NoReplica:
		return nil, fmt.Errorf("%w; the replica tells which servers exist and who polls them, so nothing was written; %s", err, GuardNoReplica.advice(w.req.Allow))
	}
	w.lift(GuardNoReplica, err.Error())
	w.noReplica = true
	return nil, nil
}

// Report prints what Write did: a header, the operations, the notes.
func (p Plan) Report(w io.Writer) {
	switch {
	case len(p.Ops) == 0:
		fmt.Fprintf(w, "%s: nothing to write\n", p.Command)
	case !p.Written:
		fmt.Fprintf(w, "%s (dry run, nothing written): %s in one transaction:\n", p.Command, p.size())
	default:
		fmt.Fprintf(w, "%s: %s written in one Consul transaction:\n", p.Command, p.size())
	}
	p.Print(w)
}

// ReportRefused prints, for a dry run that was refused, the
// transaction it refused, so that the operator sees what the flags that
// lift the refusal would write.
func (p Plan) ReportRefused(w io.Writer) {
	if len(p.Ops) == 0 {
		return
	}
	fmt.Fprintf(w, "%s (dry run, refused, nothing written): the transaction it refused, %s:\n", p.Command, p.size())
	p.Print(w) // the refusal itself follows, as the command's error
}

// size counts what the plan writes: its keys, and the Consul operations
// they make when a meta key goes with each state key ("1 key (2
// operations: with its meta key)").
func (p Plan) size() string {
	ops := 0
	for _, o := range p.Ops {
		ops += len(TxnOps(o))
	}
	out := ctl.PluralN(len(p.Ops), "key", "keys")
	if ops != len(p.Ops) {
		with := "with its meta key"
		if len(p.Ops) > 1 {
			with = "state keys with their meta keys"
		}
		out += fmt.Sprintf(" (%s: %s)", ctl.PluralN(ops, "operation", "operations"), with)
	}
	return out
}
