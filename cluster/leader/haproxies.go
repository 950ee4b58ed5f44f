package leader

// This file holds the record of which HAProxy nodes exist (state.HAProxies):
// the leader gathers, every state.HAProxySyncEvery, what each replica saw
// (its poller table's sources and their latest poll, the named query
// "sightings"), and writes a haproxies entry only with what changed: new
// sources, sources whose last poll moved by state.HAProxyCoarse or more,
// and sources to forget. It is written only once state.LevelRecorded is in
// force (gate.go). An operator command reads it from any replica to know
// which HAProxy nodes a lost replica may have been the only one to see.

import (
	"cmp"
	"context"
	"time"

	"github.com/hastate/hastate/cluster/fsm"
	"github.com/hastate/hastate/state"
	"go.uber.org/zap"
)

// haproxyLoop is the leader's: while state.LevelRecorded is in force, it
// gathers every replica's sightings each state.HAProxySyncEvery and writes
// the record's changes in one entry (nothing when nothing changed).
func (d *Duties) haproxyLoop(ctx context.Context) {
	t := time.NewTicker(cmp.Or(d.o.HAProxySyncEvery, state.HAProxySyncEvery))
	defer t.Stop()
	var overSaid int
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if d.o.FSM.Level() < state.LevelRecorded {
			continue
		}
		merged := d.o.Peers.Seen()
		plan := state.PlanHAProxies(d.o.FSM.HAProxies(), merged, d.now())
		if plan.Over > 0 && plan.Over != overSaid {
			d.log.Warn("the record of HAProxy nodes is full: sources beyond it are not recorded, and operator commands cannot tell whether only a lost replica saw them",
				zap.Int("max", state.MaxHAProxies), zap.Int("not_recorded", plan.Over))
		}
		overSaid = plan.Over
		if plan.Change.Empty() {
			continue
		}
		c := plan.Change
		_, idx, err := d.apply(ctx, fsm.Command{Type: fsm.CmdHAProxies, HAProxies: &c, At: d.now()})
		if err != nil {
			d.log.Warn("recording the HAProxy nodes not applied; retrying at the next gathering", zap.Error(err))
			continue
		}
		d.m.haproxyWrites.Inc()
		d.log.Debug("recorded HAProxy nodes", zap.Int("seen", len(c.Seen)), zap.Int("forgotten", len(c.Forget)), zap.Uint64("raft_index", idx))
	}
}
