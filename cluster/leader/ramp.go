package leader

// This file holds the leader's ramp engine.

import (
	"context"
	"time"

	"github.com/hastate/hastate/cluster/fsm"
	"github.com/hastate/hastate/state"
	"go.uber.org/zap"
)

func (d *Duties) logRampEvents(events []state.RampEvent) {
	for _, e := range events {
		r := e.Ramp
		if e.Start {
			d.log.Info("ramp started", zap.String("target", e.Target), zap.String("reason", e.Reason),
				zap.Int("weight_percent", r.Weight), zap.Duration("duration", r.Policy.Duration),
				zap.Duration("interval", r.Policy.Interval), zap.Time("eta", r.ETA()))
			continue
		}
		d.log.Info("ramp ended", zap.String("target", e.Target), zap.String("reason", e.Reason),
			zap.Int("weight_percent", r.Weight), zap.Duration("ran_for", d.now().Sub(r.Started).Round(time.Millisecond)))
	}
}

// rampLoop is the leader's ramp engine: it writes a ramp entry whenever a
// ramp's schedule moves past its last applied step, and ends ramps that are
// done. A new leader runs the same loop on the ramps it finds in the FSM,
// so every ramp resumes from its recorded start and last weight.
func (d *Duties) rampLoop(ctx context.Context) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ramps := d.o.FSM.Ramps()
		if len(ramps) == 0 {
			continue
		}
		steps := state.NextSteps(ramps, d.now())
		if _, migrating := d.o.FSM.Raw(state.MigrationKey); migrating {
			// The per-node agent has no ramps: during a migration from
			// it, a ramp in progress ends at full weight at once.
			steps = state.RampSteps{}
			for _, r := range ramps {
				steps.Done = append(steps.Done, r.Target)
			}
		}
		if steps.Empty() {
			continue
		}
		res, _, err := d.apply(ctx, fsm.Command{Type: fsm.CmdRamp, Steps: steps, At: d.now()})
		if err != nil {
			d.log.Warn("ramp step not applied; retrying", zap.Error(err))
			continue
		}
		d.logRampEvents(res.Events)
	}
}
