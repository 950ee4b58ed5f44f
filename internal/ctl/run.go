package ctl

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/hastate/hastate/api"
)

// WriteRequest is one write command (drain, maint, ready, weight, clear)
// as the operator gave it.
type WriteRequest struct {
	WriteOptions
	Selectors []Selector
	// DryRun prints the transaction and writes nothing.
	DryRun  bool
	Writer  Writer
	Replica *Replica
	// Warn receives warnings (with Force: why the checks were skipped);
	// nil: none.
	Warn io.Writer
}

// forcedRead bounds the replica read of a --force write, so that a hung
// replica leaves the write its time.
const forcedRead = 2 * time.Second

// Write runs a write command: it waits until the replica holds every write
// made to Consul so far (a drain written a moment ago counts for
// --min-ready), reads the fleet, plans the transaction, drops deletes of
// keys that do not exist, and applies it as one Consul transaction (not
// with DryRun). With Force there are no checks: the fleet only expands
// globs, and the write does not wait for a replica that cannot sync. The
// plan says what was (or would be) written; Report prints it.
func Write(ctx context.Context, req WriteRequest) (Plan, error) {
	req.Prefix = req.Writer.Prefix
	// --force or not, a write during a migration is one the per-node
	// agent serves the same way.
	migrating, check, err := req.Writer.migrationGuard(ctx)
	if err != nil {
		return Plan{Command: req.Command}, err
	}
	req.Migration, req.MigrationKey = migrating, req.Writer.MigrationKey()
	gate := GateOptions{Consul: req.Writer.Client, ConsulAddr: req.Writer.Addr, Prefix: req.Writer.Prefix, Replica: req.Replica}
	var (
		fleet *api.StateView
		v     api.StateView
	)
	if req.Force {
		fctx, cancel := context.WithTimeout(ctx, forcedRead)
		v, err = req.Replica.Fleet(fctx)
		cancel()
	} else {
		index, ierr := gate.consulIndex(ctx)
		if ierr != nil {
			// Without Consul nothing can be written, --force or not.
			return Plan{Command: req.Command}, fmt.Errorf("%w; nothing was written", ierr)
		}
		if err = gate.synced(ctx, index); err == nil {
			v, err = req.Replica.Fleet(ctx)
		}
	}
	switch {
	case err == nil:
		fleet = &v
	case !req.Force:
		return Plan{Command: req.Command}, fmt.Errorf("%w; the replica tells which servers exist and who polls them (nothing was written; --force writes literal <backend>/<server> keys without it)", err)
	case req.Warn != nil:
		fmt.Fprintf(req.Warn, "warning: %v; --force: writing without checks\n", err)
	}
	plan, err := PlanWrite(fleet, req.Selectors, req.WriteOptions)
	if err != nil {
		return plan, err
	}
	plan.check = check
	if plan.hasDeletes() {
		if err := req.Writer.DropAbsent(ctx, &plan); err != nil {
			return plan, err
		}
	}
	if len(plan.Ops) > 0 && !req.DryRun {
		if err := req.Writer.Apply(ctx, plan); err != nil {
			return plan, err
		}
		plan.Written = true
	}
	return plan, nil
}

func (p Plan) hasDeletes() bool {
	for _, o := range p.Ops {
		if o.Delete {
			return true
		}
	}
	return false
}

// Report prints what Write did: a header, the operations, the notes.
func (p Plan) Report(w io.Writer) {
	switch {
	case len(p.Ops) == 0:
		fmt.Fprintf(w, "%s: nothing to write\n", p.Command)
	case !p.Written:
		fmt.Fprintf(w, "%s (dry run, nothing written): %s in one transaction:\n", p.Command, keys(len(p.Ops)))
	default:
		fmt.Fprintf(w, "%s: %s written in one Consul transaction:\n", p.Command, keys(len(p.Ops)))
	}
	p.Print(w)
}

func keys(n int) string {
	if n == 1 {
		return "1 key"
	}
	return fmt.Sprintf("%d keys", n)
}
