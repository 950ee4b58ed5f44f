package leader

// This file holds the leader's KV apply path: a full read of the prefix
// becomes one raft entry holding the differences, under the ramp policy in
// force.

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/raft"
	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/cluster/fsm"
	"github.com/hastate/hastate/state"
	"go.uber.org/zap"
)

// ApplyKV makes the replicated mirror equal kv, a full read of the prefix at
// Consul index index, as one raft entry holding only the differences. It
// writes nothing when nothing differs and the mirror already holds state.
// Only the leader may call it; others get ErrNotLeader.
func (d *Duties) ApplyKV(ctx context.Context, index uint64, kv map[string]string) error {
	return d.ApplyRead(ctx, state.KVRead{Index: index, KV: kv})
}

// ApplyRead is ApplyKV for a read that may say what changed since an
// earlier one (r.Base, r.Changed): when the mirror holds that earlier read,
// only those keys are compared, so a change costs what it touches.
//
// A read that names its source (r.Source) is applied only from the source
// recorded in raft: from another Consul cluster or prefix it is refused
// with an *api.MirrorError (other_cluster, other_prefix), and the mirror
// keeps what it holds. With none recorded yet and the level in force
// (state.LevelRecorded), the leader records the read's source first. A
// read from the recorded cluster at an index below the one the mirror
// holds is refused with state.ErrIndexBehind until the reader read again
// and Consul confirmed it (r.Reread).
func (d *Duties) ApplyRead(ctx context.Context, r state.KVRead) error {
	if d.o.Raft.State() != raft.Leader {
		return ErrNotLeader
	}
	if err := d.checkSource(ctx, r); err != nil {
		return err
	}
	index, kv := r.Index, r.KV
	change, old, synced := d.o.FSM.Diff(r)
	if change.Empty() && synced {
		return nil
	}
	raw, ok := kv[RampConfigKey]
	_, migrating := kv[state.MigrationKey]
	policy := noRampWhile(migrating, d.rampPolicy(raw, ok))
	res, raftIndex, err := d.apply(ctx, fsm.Command{Type: fsm.CmdKV, KVIndex: index, Change: change, At: d.now(), Ramp: policy})
	if err != nil {
		return fmt.Errorf("cluster: apply KV change (%d set, %d deleted): %w", len(change.Set), len(change.Delete), err)
	}
	d.log.Info("kv change applied", append([]zap.Field{zap.Uint64("kv_index", index), zap.Uint64("raft_index", raftIndex),
		zap.Int("set", len(change.Set)), zap.Int("deleted", len(change.Delete))}, changeFields(change, old)...)...)
	d.logInvalid(change)
	d.logRampEvents(res.Events)
	return nil
}

// checkSource decides whether r may be applied given the source recorded
// in raft, and records r's source when none is and the level allows it.
func (d *Duties) checkSource(ctx context.Context, r state.KVRead) error {
	if r.Source == nil {
		return nil
	}
	rec, held := d.o.FSM.Recorded()
	if rec == nil {
		if d.o.FSM.Level() < state.LevelRecorded {
			// 0.14.0 voters do not know the entry: as before, and the
			// level gate records the source once it can.
			d.readSource.Store(&termSource{src: *r.Source, term: d.o.Raft.CurrentTerm()})
			return nil
		}
		return d.recordSource(ctx, r.Source)
	}
	if v := api.SourceVerdict(*r.Source, *rec); !v.CanMirror() {
		return &api.MirrorError{Verdict: v}
	}
	if r.Index < held && !r.Reread {
		return fmt.Errorf("%w: Consul index %d, the mirror holds %d", state.ErrIndexBehind, r.Index, held)
	}
	// The same cluster, described anew: keep the record current (a
	// Consul server replaced, a cluster ID read once Connect's CA was
	// up), never poorer, so that the servers recorded stay the cluster's.
	cur := *r.Source
	cur.ClusterID, cur.Datacenter = cmp.Or(cur.ClusterID, rec.ClusterID), cmp.Or(cur.Datacenter, rec.Datacenter)
	if cur != *rec {
		return d.recordSource(ctx, &cur)
	}
	return nil
}

// termSource is a read's source and the leader's term it was read in.
type termSource struct {
	src  state.MirrorSource
	term uint64
}

// recordSource writes the source entry that ties the mirror to src.
func (d *Duties) recordSource(ctx context.Context, src *state.MirrorSource) error {
	s := *src
	_, idx, err := d.apply(ctx, fsm.Command{Type: fsm.CmdSource, Source: &s, At: d.now()})
	if err != nil {
		return fmt.Errorf("cluster: record the mirror's Consul source: %w", err)
	}
	d.log.Info("recorded the Consul cluster and prefix of the mirror: reads from any other are refused from now on",
		zap.Stringer("source", &s), zap.Uint64("raft_index", idx))
	return nil
}

// recordReadSource records, once state.LevelRecorded is in force, the
// source of the reads this leader applied before it was (a cluster that
// formed, or was upgraded, below the level): without it nothing would be
// recorded until the prefix next changes.
func (d *Duties) recordReadSource(ctx context.Context) {
	ts := d.readSource.Load()
	if ts == nil || ts.term != d.o.Raft.CurrentTerm() || d.o.FSM.Level() < state.LevelRecorded {
		return // none read in this term: the term's next read records it
	}
	src := &ts.src
	if rec, _ := d.o.FSM.Recorded(); rec != nil {
		return
	}
	if err := d.recordSource(ctx, src); err != nil {
		d.log.Warn("recording the mirror's Consul source not applied; the next read records it", zap.Error(err))
	}
}

// RecordedSource is the Consul cluster and prefix recorded with the
// mirror (nil: none yet).
func (d *Duties) RecordedSource() *state.MirrorSource {
	s, _ := d.o.FSM.Recorded()
	return s
}

// Adopt records src as the mirror's source in place of the one recorded:
// the operator's "this Consul was restored (or rebuilt); mirror it from
// now on". want, when not empty, is the cluster ID (or, for a Consul that
// says none, its servers) the operator confirmed: Adopt refuses if src is
// another. The Consul index held is forgotten (it was the other
// cluster's); the next read from src is applied as any first read.
func (d *Duties) Adopt(ctx context.Context, src state.MirrorSource, want string) (old *state.MirrorSource, err error) {
	if d.o.Raft.State() != raft.Leader {
		return nil, ErrNotLeader
	}
	if lvl := d.o.FSM.Level(); lvl < state.LevelRecorded {
		return nil, fmt.Errorf("%w: feature level %d is in force, the source is recorded from level %d on (a rolling upgrade has not finished: /v1/cluster level)",
			ErrAdoptRefused, lvl, state.LevelRecorded)
	}
	if want != "" && want != src.ClusterID && want != src.Servers {
		return nil, fmt.Errorf("%w: this leader's Consul is %s, not %q: run the command against a replica whose Consul is the one to adopt, or check the ID",
			ErrAdoptRefused, src, want)
	}
	old, _ = d.o.FSM.Recorded()
	if _, idx, err := d.apply(ctx, fsm.Command{Type: fsm.CmdSource, Source: &src, Adopt: true, At: d.now()}); err != nil {
		return old, fmt.Errorf("cluster: adopt %s: %w", src, err)
	} else {
		d.log.Warn("operator adopted a Consul cluster: the mirror follows it from now on", zap.Stringer("source", &src),
			zap.Stringer("was", old), zap.Uint64("raft_index", idx))
	}
	return old, nil
}

// apply writes one entry and waits until it is applied on this leader.
func (d *Duties) apply(ctx context.Context, c fsm.Command) (fsm.ApplyResult, uint64, error) {
	data, err := json.Marshal(c)
	if err != nil {
		return fsm.ApplyResult{}, 0, fmt.Errorf("encode entry: %w", err)
	}
	start := time.Now()
	timeout := d.o.ApplyTimeout
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < timeout {
		timeout = time.Until(dl)
	}
	f := d.o.Raft.Apply(data, timeout)
	if err := f.Error(); err != nil {
		if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) {
			return fsm.ApplyResult{}, 0, fmt.Errorf("%w: %v", ErrNotLeader, err)
		}
		return fsm.ApplyResult{}, 0, fmt.Errorf("%w (is the data dir's disk full or the quorum lost? the last applied state is still served)", err)
	}
	switch r := f.Response().(type) {
	case error:
		return fsm.ApplyResult{}, 0, r
	case fsm.ApplyResult:
		d.m.applyDuration.Observe(time.Since(start).Seconds())
		return r, f.Index(), nil
	}
	d.m.applyDuration.Observe(time.Since(start).Seconds())
	return fsm.ApplyResult{}, f.Index(), nil
}

// rampPolicy is the policy in force for <prefix>config/ramp's value raw
// (ok: the key exists): the flags, overridden by the key when that
// parses. An invalid override is reported once per value and ignored.
func (d *Duties) rampPolicy(raw string, ok bool) state.RampPolicy {
	if !ok {
		return d.o.Ramp
	}
	p, err := state.ParseRampPolicy(raw, d.o.Ramp)
	if err != nil {
		if prev := d.lastBadPolicy.Swap(&raw); prev == nil || *prev != raw {
			d.log.Warn("ignoring invalid ramp policy in KV; the --ramp-* flags apply (fix or delete the key)",
				zap.String("key", RampConfigKey), zap.String("value", cutValue(raw)), zap.Error(err))
		}
		return d.o.Ramp
	}
	d.lastBadPolicy.Store(nil)
	return p
}

// RampPolicyProblem returns <prefix>config/ramp as this replica holds it
// (from raft, so every replica in sync says the same, leader or not) and
// why it is ignored; err is nil when the key is absent or valid.
func (d *Duties) RampPolicyProblem() (raw string, err error) {
	raw, ok := d.o.FSM.Raw(RampConfigKey)
	if !ok {
		return "", nil
	}
	_, err = state.ParseRampPolicy(raw, d.o.Ramp)
	return raw, err
}

// RampConfigKey is the KV key, relative to the prefix, of the ramp policy
// override.
const RampConfigKey = "config/ramp"
