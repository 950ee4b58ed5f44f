package write

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/hastate/hastate/cmd/hastate/internal/ctl"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/fleet"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/haproxy"
)

// DefaultIdleTimeout is how long `maint --drain-first` waits for the
// drained servers to be idle before it sets maint anyway: the fixed sleep
// of ChatOps `canary --disable`.
const DefaultIdleTimeout = 60 * time.Second

// DrainFirstOptions configure DrainFirst. The steps are functions so that
// the writes go through the write commands' own path (selector expansion,
// --min-ready and the typo guard, --dry-run) and the waits are fleet.Wait and
// haproxy.WaitIdle.
type DrainFirstOptions struct {
	// Targets names the selected servers in messages.
	Targets string
	// Write writes st ("drain" or "maint") for the selectors and prints
	// what it wrote.
	Write func(ctx context.Context, st string) error
	// Told returns once every HAProxy polling the servers was told their
	// current answer (fleet.Wait).
	Told func(ctx context.Context) error
	// Idle returns once every HAProxy reports no session on them
	// (haproxy.WaitIdle); nil when no haproxy.Prometheus is configured: the idle timeout
	// is then waited out in full, as ChatOps did.
	Idle func(ctx context.Context) (haproxy.IdleResult, error)
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
		return fmt.Errorf("%w: --idle-timeout %s: want a positive duration such as 60s", ctl.ErrUsage, o.IdleTimeout)
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
		sctx, cancel := ctl.WithTimeout(ctx, d)
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
	if o.Idle == nil {
		// Said before the wait, not after it: the operator knows at once
		// that this is the ChatOps sleep.
		step(2, "no Prometheus (--prometheus / HASTATE_PROMETHEUS_URL): cannot see sessions, so waiting the whole --idle-timeout (%s) before maint", o.IdleTimeout)
	} else {
		step(2, "waiting up to %s (--idle-timeout) until every HAProxy was told the drain and reports no session", o.IdleTimeout)
	}
	ictx, cancel := context.WithTimeout(ctx, o.IdleTimeout)
	err := o.Told(ictx)
	blind := err == nil && o.Idle == nil // told, and no way to see sessions
	var res haproxy.IdleResult
	switch {
	case blind:
		fmt.Fprintf(o.Out, "every HAProxy was told the drain after %s; sessions unchecked: waiting out the idle timeout (%s left)\n", ctl.RoundAge(time.Since(start)), ctl.RoundAge(time.Until(ctl.Deadline(ictx))))
		<-ictx.Done()
		err = fmt.Errorf("%w: no Prometheus to ask", ctl.ErrCannotConfirm)
	case err == nil:
		fmt.Fprintf(o.Out, "every HAProxy was told the drain after %s; waiting for its sessions to end\n", ctl.RoundAge(time.Since(start)))
		res, err = o.Idle(ictx)
	}
	switch {
	case ctx.Err() != nil:
		cancel()
		return interrupted("the wait for idle", err)
	case err == nil:
		fmt.Fprintf(o.Out, "idle after %s: %s\n", ctl.RoundAge(time.Since(start)), res)
	default:
		// Whatever failed (HAProxy not told in time, sessions left, a
		// replica or haproxy.Prometheus that cannot be read, anything else), idle
		// is not proven: maint waits until the idle timeout has passed in
		// full, never less (what ChatOps did: a fixed wait).
		if ictx.Err() == nil {
			fmt.Fprintf(o.Out, "cannot confirm idle: %v\nwaiting out the idle timeout (%s left)\n", err, ctl.RoundAge(time.Until(ctl.Deadline(ictx))))
			<-ictx.Done()
			if ctx.Err() != nil {
				cancel()
				return interrupted("the wait for idle", ctx.Err())
			}
		}
		if blind {
			fmt.Fprintf(o.Out, "idle timeout %s passed; setting maint (sessions unchecked)\n", o.IdleTimeout)
		} else {
			fmt.Fprintf(o.Out, "idle timeout %s passed, setting maint anyway; %v\n", o.IdleTimeout, err)
		}
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
	fmt.Fprintf(o.Out, "done: %s in maint, drained for %s first\n", o.Targets, ctl.RoundAge(time.Since(start)))
	return nil
}

// MaintDrainFirst is `hastate maint --drain-first` wired to the write path
// and the gates: each write is Write (every guard, the conditional
// transaction; Value builds the value written for "drain" and "maint"),
// told is fleet.Wait on the same replica, idle is haproxy.WaitIdle on prom (nil: no
// haproxy.Prometheus, the idle timeout is waited out in full). cmd/hastate only
// turns flags into the request.
type MaintDrainFirst struct {
	// Write is the write request of both steps; Command and Value are set
	// for each.
	Write Request
	// Value is the value written for st ("drain" or "maint").
	Value      func(st string) (string, error)
	Prometheus *haproxy.Prometheus
	// Timeout bounds each write and the wait until maint was told;
	// IdleTimeout the wait until told and idle after the drain.
	Timeout, IdleTimeout time.Duration
	Targets              string
	Out                  io.Writer
}

// Run runs it (see DrainFirst).
func (m MaintDrainFirst) Run(ctx context.Context) error {
	gate := fleet.GateOptions{Consul: m.Write.Writer.Client, ConsulAddr: m.Write.Writer.Addr, Prefix: m.Write.Writer.Prefix,
		Replica: m.Write.Replica, Selectors: m.Write.Selectors, Out: m.Out}
	o := DrainFirstOptions{
		Targets: m.Targets,
		Write: func(ctx context.Context, st string) error {
			val, err := m.Value(st)
			if err != nil {
				return err
			}
			req := m.Write
			req.Command, req.Value = st, val
			plan, err := Write(ctx, req)
			if err != nil {
				return err
			}
			plan.Report(m.Out)
			return nil
		},
		Told:        func(ctx context.Context) error { return fleet.Wait(ctx, gate) },
		Timeout:     m.Timeout,
		IdleTimeout: m.IdleTimeout,
		DryRun:      m.Write.DryRun,
		Out:         m.Out,
	}
	if m.Prometheus != nil {
		o.Idle = func(ctx context.Context) (haproxy.IdleResult, error) {
			return haproxy.WaitIdle(ctx, haproxy.IdleOptions{Prometheus: m.Prometheus, Replica: m.Write.Replica, Selectors: m.Write.Selectors, Out: m.Out})
		}
	}
	return DrainFirst(ctx, o)
}
