package ctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"
)

// DefaultIdleTimeout is how long `maint --drain-first` waits for the
// drained servers to be idle before it sets maint anyway: the fixed sleep
// of ChatOps `canary --disable`.
const DefaultIdleTimeout = 60 * time.Second

// DrainFirstOptions configure DrainFirst. The steps are functions so that
// the writes go through the write commands' own path (selector expansion,
// --min-ready and the typo guard, --dry-run) and the waits are Wait and
// WaitIdle.
type DrainFirstOptions struct {
	// Targets names the selected servers in messages.
	Targets string
	// Write writes st ("drain" or "maint") for the selectors and prints
	// what it wrote.
	Write func(ctx context.Context, st string) error
	// Told returns once every HAProxy polling the servers was told their
	// current answer (Wait).
	Told func(ctx context.Context) error
	// Idle returns once every HAProxy reports no session on them
	// (WaitIdle); nil when no Prometheus is configured: the idle timeout
	// is then waited out in full, as ChatOps did.
	Idle func(ctx context.Context) (IdleResult, error)
	// Timeout bounds each write and the wait until maint was told;
	// IdleTimeout bounds the wait until told and idle after the drain.
	Timeout, IdleTimeout time.Duration
	DryRun               bool
	Out                  io.Writer
}

// DrainFirst is `hastate maint --drain-first`, ChatOps `--disable` in one
// command: drain; wait until every HAProxy was told and reports no session
// left, or until IdleTimeout passes; then maint, and wait until it was
// told. Each step is printed. When ctx ends (an interrupt) it returns an
// error that says which state it left the servers in.
func DrainFirst(ctx context.Context, o DrainFirstOptions) error {
	if o.IdleTimeout <= 0 {
		return fmt.Errorf("%w: --idle-timeout %s: want a positive duration such as 60s", ErrUsage, o.IdleTimeout)
	}
	left := "nothing written: the servers are as they were"
	interrupted := func(step string, err error) error {
		if ctx.Err() != nil {
			return fmt.Errorf("interrupted during %s: %s (%w)", step, left, err)
		}
		return fmt.Errorf("%s: %w; %s", step, err, left)
	}
	step := func(n int, format string, a ...any) {
		fmt.Fprintf(o.Out, "step %d/4: %s\n", n, fmt.Sprintf(format, a...))
	}
	within := func(d time.Duration, f func(context.Context) error) error {
		sctx, cancel := WithTimeout(ctx, d)
		defer cancel()
		return f(sctx)
	}

	step(1, "drain %s", o.Targets)
	if err := within(o.Timeout, func(c context.Context) error { return o.Write(c, "drain") }); err != nil {
		if ctx.Err() != nil {
			left = "the drain may or may not have been written: see hastate status " + o.Targets
		}
		return interrupted("the drain", err)
	}
	if o.DryRun {
		step(2, "(dry run) would wait up to %s until every HAProxy was told and holds no session", o.IdleTimeout)
		step(3, "(dry run) maint %s", o.Targets)
		return o.Write(ctx, "maint")
	}
	left = fmt.Sprintf("%s left drained: `hastate maint %[1]s` finishes, `hastate clear %[1]s` undoes", o.Targets)

	start := time.Now()
	step(2, "waiting up to %s (--idle-timeout) until every HAProxy was told the drain and reports no session", o.IdleTimeout)
	ictx, cancel := context.WithTimeout(ctx, o.IdleTimeout)
	err := o.Told(ictx)
	var res IdleResult
	switch {
	case err == nil && o.Idle == nil:
		fmt.Fprintf(o.Out, "every HAProxy was told the drain after %s; no Prometheus (--prometheus): waiting out the idle timeout, sessions unchecked\n", roundAge(time.Since(start)))
		<-ictx.Done()
		err = ictx.Err()
	case err == nil:
		fmt.Fprintf(o.Out, "every HAProxy was told the drain after %s; waiting for its sessions to end\n", roundAge(time.Since(start)))
		res, err = o.Idle(ictx)
	}
	switch {
	case ctx.Err() != nil:
		cancel()
		return interrupted("the wait for idle", err)
	case err == nil:
		fmt.Fprintf(o.Out, "idle after %s: %s\n", roundAge(time.Since(start)), res)
	case errors.Is(err, ErrCannotConfirm):
		// Cannot prove idle: fall back to what ChatOps did, a fixed wait.
		fmt.Fprintf(o.Out, "cannot confirm idle: %v\nwaiting out the idle timeout (%s left)\n", err, roundAge(time.Until(deadline(ictx))))
		<-ictx.Done()
		if ctx.Err() != nil {
			cancel()
			return interrupted("the wait for idle", ctx.Err())
		}
		fmt.Fprintf(o.Out, "idle timeout %s passed; setting maint\n", o.IdleTimeout)
	default:
		fmt.Fprintf(o.Out, "idle timeout %s passed, setting maint anyway; %v\n", o.IdleTimeout, err)
	}
	cancel()

	step(3, "maint %s", o.Targets)
	if err := within(o.Timeout, func(c context.Context) error { return o.Write(c, "maint") }); err != nil {
		if ctx.Err() != nil {
			left = fmt.Sprintf("%s drained; the maint may or may not have been written: see hastate status %[1]s", o.Targets)
		}
		return interrupted("the maint", err)
	}
	left = fmt.Sprintf("%s in maint (written); not every HAProxy was told yet: `hastate wait %[1]s`", o.Targets)
	step(4, "waiting until every HAProxy was told maint")
	if err := within(o.Timeout, o.Told); err != nil {
		return interrupted("the wait for maint", err)
	}
	fmt.Fprintf(o.Out, "done: %s in maint, drained for %s first\n", o.Targets, roundAge(time.Since(start)))
	return nil
}

func deadline(ctx context.Context) time.Time {
	d, _ := ctx.Deadline()
	return d
}
