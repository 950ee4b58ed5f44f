package cluster

import (
	"context"
	"time"

	"github.com/hashicorp/raft"
	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/cluster/leader"
	"github.com/hastate/hastate/state"
	"go.uber.org/zap"
)

// leadershipLoop runs the leader duty while this node leads.
func (n *Node) leadershipLoop(notify <-chan bool) {
	defer n.wg.Done()
	var cur *runningDuty
	stopDuty := func() {
		if cur != nil {
			cur.stop()
			cur = nil
		}
	}
	defer stopDuty()
	for {
		select {
		case <-n.stop:
			return
		case leader := <-notify:
			switch {
			case !leader:
				n.reads.LostLeadership(time.Now()) // the contact loop: led until now
				n.log.Info("lost raft leadership")
				stopDuty()
			case cur == nil:
				n.log.Info("became raft leader")
				cur = startDuty(n.duties.Run)
			}
		}
	}
}

// runningDuty is a leader duty goroutine and the way to stop it.
type runningDuty struct {
	cancel context.CancelFunc
	done   chan struct{}
}

func startDuty(f func(context.Context)) *runningDuty {
	ctx, cancel := context.WithCancel(context.Background())
	d := &runningDuty{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(d.done)
		f(ctx)
	}()
	return d
}

func (d *runningDuty) stop() {
	d.cancel()
	<-d.done
}

func (n *Node) observeLoop(obs <-chan raft.Observation) {
	defer n.wg.Done()
	for {
		select {
		case <-n.stop:
			return
		case o := <-obs:
			if lo, ok := o.Data.(raft.LeaderObservation); ok {
				n.metrics.leaderChanges.Inc()
				n.log.Info("raft leader changed", zap.String("leader_id", string(lo.LeaderID)), zap.String("leader_address", string(lo.LeaderAddr)))
			}
		}
	}
}

// HandOver transfers leadership to another voter when this node leads a
// cluster of several, and waits for the transfer or for ctx. The node stays
// a member: as a follower it keeps applying entries and serving. Shutdown
// calls it first; a replica about to stop can call it earlier.
func (n *Node) HandOver(ctx context.Context) {
	if n.raft.State() != raft.Leader || leader.Voters(n.raft) < 2 {
		return
	}
	start := time.Now()
	f := n.raft.LeadershipTransfer()
	errc := make(chan error, 1)
	go func() { errc <- f.Error() }() // ends when raft resolves the future, at the latest at raft shutdown
	select {
	case err := <-errc:
		if err != nil {
			n.log.Warn("leadership transfer before shutdown failed; followers will elect a new leader after the election timeout", zap.Error(err))
		} else {
			n.log.Info("leadership transferred before shutdown", zap.Duration("took", time.Since(start)))
		}
	case <-ctx.Done():
		n.log.Warn("leadership transfer did not finish before the shutdown deadline")
	}
}

// The leader's writes and what the node reads of the mirror (the leader's
// duties and the state machine answer; see leader/ and fsm/).

// KV returns a copy of the mirrored KV content (keys relative to the prefix).
func (n *Node) KV() map[string]string { return n.fsm.KV() }

// Raw is the mirrored value of key (relative to the prefix), raw.
func (n *Node) Raw(key string) (string, bool) { return n.fsm.Raw(key) }

// ApplyKV makes the replicated mirror equal kv, a full read of the prefix at
// Consul index index, as one raft entry holding only the differences. It
// writes nothing when nothing differs and the mirror already holds state.
// Only the leader may call it; others get ErrNotLeader.
func (n *Node) ApplyKV(ctx context.Context, index uint64, kv map[string]string) error {
	return n.duties.ApplyRead(ctx, state.KVRead{Index: index, KV: kv})
}

// ApplyRead is ApplyKV for a read that may say what changed since an
// earlier one, and where it was read (leader.Duties.ApplyRead).
func (n *Node) ApplyRead(ctx context.Context, r state.KVRead) error {
	return n.duties.ApplyRead(ctx, r)
}

// Adopt records src as the mirror's source in place of the one recorded
// (leader.Duties.Adopt).
func (n *Node) Adopt(ctx context.Context, src state.MirrorSource, want string) (*state.MirrorSource, error) {
	return n.duties.Adopt(ctx, src, want)
}

// RecordedSource is the Consul cluster and prefix recorded with the
// mirror (nil: none yet).
func (n *Node) RecordedSource() *state.MirrorSource {
	s, _ := n.fsm.Recorded()
	return s
}

// RampPolicyProblem returns <prefix>config/ramp as this replica holds it
// and why it is ignored (leader.Duties.RampPolicyProblem).
func (n *Node) RampPolicyProblem() (raw string, err error) { return n.duties.RampPolicyProblem() }

// HAProxies returns the record of which HAProxy nodes exist, and whether
// it is kept (state.LevelRecorded in force).
func (n *Node) HAProxies() (state.HAProxies, bool) {
	return n.fsm.HAProxies(), n.fsm.Level() >= state.LevelRecorded
}

// MirrorVerdict is whether this replica could mirror Consul into raft if
// it led, and why not (leader.Verdict; with no wiring, nothing to compare).
func (n *Node) MirrorVerdict() api.MirrorVerdict { return n.verdictOf(n.consulHealth()) }

func (n *Node) verdictOf(h leader.ConsulHealth) api.MirrorVerdict {
	if n.opts.ConsulHealth == nil {
		return h.Reported()
	}
	return leader.Verdict(h, n.RecordedSource())
}
