package cluster

// This file holds leadership: running the leader's duties while this node
// leads, and handing leadership over.

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	"go.uber.org/zap"
)

// LeaderDuty is work that runs only on the leader: it is started once the
// leader's FSM has caught up (a barrier) and its context is cancelled when
// leadership is lost or the node shuts down. It must return promptly then.
// An error returned before that means this node cannot do the duty: it
// hands leadership to another voter and, while it still leads, tries the
// duty again after a pause.
type LeaderDuty func(ctx context.Context) error

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
				n.ledUntil.Store(time.Now().UnixNano()) // contactLoop: led until now
				n.log.Info("lost raft leadership")
				stopDuty()
			case cur == nil:
				n.log.Info("became raft leader")
				cur = startDuty(n.leaderDuty)
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

func (n *Node) leaderDuty(ctx context.Context) {
	// The FSM must hold every committed entry before the leader diffs
	// against it.
	if !n.barrier(ctx) {
		return
	}
	var wg sync.WaitGroup
	wg.Add(4)
	go func() {
		defer wg.Done()
		n.rampLoop(ctx)
	}()
	go func() {
		defer wg.Done()
		n.haproxyLoop(ctx)
	}()
	go func() {
		defer wg.Done()
		n.levelLoop(ctx)
	}()
	go func() {
		defer wg.Done()
		n.expiryLoop(ctx)
	}()
	if n.opts.ConsulHealth != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n.kvFailoverLoop(ctx)
		}()
	}
	if n.opts.LeaderDuty != nil {
		n.runLeaderDuty(ctx)
	}
	wg.Wait()
}

// barrier waits until the FSM holds every entry committed before this
// node's leadership (raft's Barrier, retried until ctx ends) and records
// the term it did so in (barrierTerm: confirmation rounds and contactLoop
// read it). The term is read before the barrier and recorded only if it
// is still the term after: a barrier that completes in term T proves
// nothing about a later term T' in which this node leads again (its
// no-op of T' may not be committed yet), and recording T' for it would let
// the node answer before it knows the commit index of T'. ctx ending returns
// false.
func (n *Node) barrier(ctx context.Context) bool {
	for {
		term := n.raft.CurrentTerm()
		err := n.raft.Barrier(n.opts.ApplyTimeout).Error()
		if n.opts.afterBarrier != nil {
			n.opts.afterBarrier()
		}
		if err == nil && n.raft.CurrentTerm() == term && n.raft.State() == raft.Leader {
			n.barrierTerm.Store(term) // contactLoop: caught up
			return true
		}
		if err == nil {
			err = fmt.Errorf("the term moved from %d to %d during the barrier", term, n.raft.CurrentTerm())
		}
		n.log.Warn("raft barrier on new leader failed; retrying", zap.Error(err))
		select {
		case <-ctx.Done():
			return false
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// leaderDutyRetry is the pause before a leader that could not hand over
// tries its failed duty again.
const leaderDutyRetry = 5 * time.Second

// runLeaderDuty runs the wiring's duty until ctx ends; when the duty fails
// it hands leadership over, or retries it while this node still leads.
func (n *Node) runLeaderDuty(ctx context.Context) {
	for {
		err := n.opts.LeaderDuty(ctx)
		if err == nil || ctx.Err() != nil {
			return
		}
		n.metrics.dutyFailures.Inc()
		if n.voters() < 2 {
			n.log.Error("leader duty failed and no other replica can take over; retrying", zap.Error(err), zap.Duration("retry_in", leaderDutyRetry))
		} else {
			n.log.Error("leader duty failed; handing leadership to another replica", zap.Error(err))
			if terr := n.raft.LeadershipTransfer().Error(); terr != nil {
				n.log.Warn("leadership transfer after a failed leader duty failed; retrying the duty", zap.Error(terr), zap.Duration("retry_in", leaderDutyRetry))
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(leaderDutyRetry):
		}
	}
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
	if n.raft.State() != raft.Leader || n.voters() < 2 {
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

func (n *Node) voters() int {
	f := n.raft.GetConfiguration()
	if f.Error() != nil {
		return 0
	}
	c := 0
	for _, s := range f.Configuration().Servers {
		if s.Suffrage == raft.Voter {
			c++
		}
	}
	return c
}
