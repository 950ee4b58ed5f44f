package leader

import (
	"context"
	"time"

	"github.com/hastate/hastate/cluster/fsm"
	"github.com/hastate/hastate/state"
	"go.uber.org/zap"
)

// expiryEvery is how often the leader looks for states whose "until" has
// passed.
const expiryEvery = 250 * time.Millisecond

// expiryLoop is the leader's expiry engine: when a key's "until" passes
// (hastate drain --for 2h), it writes an expire entry, and every replica
// treats the key as absent from then on (an expired drain ramps back up).
// hastate never writes KV: the key stays in Consul, marked expired in
// status, until an operator changes or clears it.
func (d *Duties) expiryLoop(ctx context.Context) {
	t := time.NewTicker(expiryEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := d.now()
		keys, raw, ok := d.o.FSM.Due(now, RampConfigKey)
		if len(keys) == 0 {
			continue
		}
		_, migrating := d.o.FSM.Raw(state.MigrationKey)
		res, raftIndex, err := d.apply(ctx, fsm.Command{Type: fsm.CmdExpire, Expire: keys, At: now, Ramp: noRampWhile(migrating, d.rampPolicy(raw, ok))})
		if err != nil {
			d.log.Warn("expiring states not applied; retrying", zap.Strings("keys", keys), zap.Error(err))
			continue
		}
		d.log.Info("states expired: the keys now count as absent", zap.Strings("keys", keys), zap.Uint64("raft_index", raftIndex))
		d.logRampEvents(res.Events)
	}
}
