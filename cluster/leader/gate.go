package leader

// This file holds the feature-level gate. Releases N and N-1 form one
// cluster during a rolling upgrade (DESIGN.md, Compatibility and
// upgrades): what a replica applies must not depend on its release. So a
// feature that changes what entries mean (a new entry type, a snapshot
// shape, a value read differently) has a level, each replica advertises the
// highest level it understands in its raft-port status, and the leader
// writes the level entry that puts a level in force only once every member
// of the configuration advertises it. Until then the feature waits and
// says so: a log line when what waits changes, hastate_cluster_level_waiting,
// and /v1/cluster's level.waiting.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/cluster/fsm"
	"github.com/hastate/hastate/state"
	"go.uber.org/zap"
)

// LevelEvery is how often the leader asks its peers for their level while
// a level waits.
const LevelEvery = time.Second

// levelFeatures names what each level brings, for the operator.
var levelFeatures = map[int]string{
	state.LevelMeta:     "meta keys give until (expiry) and ramp",
	state.LevelRecorded: "the mirror records its Consul cluster and prefix and applies reads only from them; the cluster records which HAProxy nodes exist, so operator commands decide from the replicas that are up",
}

// levelFeature returns what level brings.
func levelFeature(level int) string {
	if f, ok := levelFeatures[level]; ok {
		return f
	}
	return fmt.Sprintf("level %d", level)
}

// below returns the members that do not advertise level: those whose
// status says less and, with silent, those that did not answer (before a
// level is raised, a member that cannot be asked cannot be counted on; once
// it is in force, a member that is down is not a member below it).
// statuses are the members' answers.
func (d *Duties) below(level int, statuses map[string]api.PeerStatus, silent bool) []string {
	cf := d.o.Raft.GetConfiguration()
	if cf.Error() != nil {
		return []string{"(raft configuration unknown)"}
	}
	var out []string
	for _, s := range cf.Configuration().Servers {
		st, ok := statuses[string(s.ID)]
		switch {
		case !ok && silent:
			out = append(out, string(s.ID)+" (no answer)")
		case !ok:
		case max(st.Level, state.LevelBase) < level:
			v := st.Version
			if v == "" {
				v = "0.13.0 or older"
			}
			out = append(out, fmt.Sprintf("%s (%s, level %d)", s.ID, v, max(st.Level, state.LevelBase)))
		}
	}
	slices.Sort(out)
	return out
}

// waitingText says what waits for whom.
func waitingText(level int, below []string) string {
	return fmt.Sprintf("level %d (%s) waits for every replica to run a release that understands it; not yet: %s",
		level, levelFeature(level), strings.Join(below, ", "))
}

// heldText says that the levels above capped wait for the operator.
func heldText(capped int) string {
	return fmt.Sprintf("level %d (%s) is held: this replica runs with --feature-level %d (drop the flag on every replica to let it rise)",
		capped+1, levelFeature(capped+1), capped)
}

// levelLoop is the leader's gate: it raises the cluster's level, one at a
// time, to this build's as soon as every member advertises it. Once it is
// there, it keeps asking, and says loudly when a member advertises less
// (a replica rolled back with its data after the level was raised: it does
// not apply entries as the others do; see docs/deploy.md, Upgrades).
func (d *Duties) levelLoop(ctx context.Context) {
	defer d.levelWaiting.Store(nil)
	t := time.NewTicker(LevelEvery)
	defer t.Stop()
	var said string
	for {
		cur := d.o.FSM.Level()
		next := min(cur+1, d.o.FSM.MaxLevel())
		below := d.below(next, d.o.Peers.Statuses(LevelEvery), cur < next)
		var w string
		switch {
		case len(below) > 0 && cur >= d.o.FSM.MaxLevel():
			w = fmt.Sprintf("level %d is in force, but not every replica understands it: %s; they may serve other answers: upgrade them, "+
				"or roll every replica back the documented way (stop all, clear their data, start the older release)", cur, strings.Join(below, ", "))
		case len(below) > 0:
			w = waitingText(next, below)
		case cur < next:
			if _, idx, err := d.apply(ctx, fsm.Command{Type: fsm.CmdLevel, Level: next, At: d.now()}); err != nil {
				d.log.Warn("raising the feature level not applied; retrying", zap.Int("level", next), zap.Error(err))
			} else {
				d.log.Info("feature level raised: every replica understands it", zap.Int("level", next),
					zap.String("feature", levelFeature(next)), zap.Uint64("raft_index", idx))
				d.recordReadSource(ctx)
				continue
			}
		}
		if w == "" && cur < state.MaxLevel {
			w = heldText(d.o.FSM.MaxLevel())
		}
		if w == "" {
			d.levelWaiting.Store(nil)
		} else {
			d.levelWaiting.Store(&w)
		}
		if w != said && w != "" {
			if cur >= d.o.FSM.MaxLevel() {
				d.log.Error("a replica runs a release below the cluster's feature level", zap.Int("level_in_force", cur), zap.Strings("below", below))
			} else {
				d.log.Warn("feature waits for a rolling upgrade to finish", zap.Int("level", next), zap.String("feature", levelFeature(next)),
					zap.Strings("not_yet", below), zap.Int("level_in_force", cur))
			}
		}
		said = w
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// LevelInfo is /v1/cluster's level; statuses are the members' answers
// (Info asks for them anyway), from which a follower says what waits.
func (d *Duties) LevelInfo(statuses map[string]api.PeerStatus) api.LevelInfo {
	in := api.LevelInfo{Applied: d.o.FSM.Level(), Build: d.o.FSM.MaxLevel()}
	if err := d.o.FSM.NotUnderstood(); err != nil {
		in.NotUnderstood = err.Error()
	}
	if w := d.levelWaiting.Load(); w != nil && d.leading() {
		in.Waiting = *w
	} else if in.Applied < in.Build && !d.leading() {
		if below := d.below(in.Applied+1, statuses, true); len(below) > 0 {
			in.Waiting = waitingText(in.Applied+1, below)
		}
	}
	if in.Waiting == "" && in.Applied < state.MaxLevel && in.Build < state.MaxLevel {
		in.Waiting = heldText(in.Build)
	}
	return in
}
