package leader

// This file holds the duties' runner: the barrier of a new leader, then
// the loops and the wiring's duty until leadership ends.

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	"go.uber.org/zap"
)

// Duty is work that runs only on the leader: it is started once the
// leader's FSM has caught up (a barrier) and its context is cancelled when
// leadership is lost or the node shuts down. It must return promptly then.
// An error returned before that means this node cannot do the duty: it
// hands leadership to another voter and, while it still leads, tries the
// duty again after a pause.
type Duty func(ctx context.Context) error

// Run runs the leader's duties from a new leadership until ctx ends (its
// loss, or shutdown): the barrier, then the ramps, the record of HAProxy
// nodes, the feature level, expiry, the Consul failover and the wiring's
// Duty.
func (d *Duties) Run(ctx context.Context) {
	// The FSM must hold every committed entry before the leader diffs
	// against it.
	if !d.barrier(ctx) {
		return
	}
	var wg sync.WaitGroup
	wg.Add(4)
	go func() {
		defer wg.Done()
		d.rampLoop(ctx)
	}()
	go func() {
		defer wg.Done()
		d.haproxyLoop(ctx)
	}()
	go func() {
		defer wg.Done()
		d.levelLoop(ctx)
	}()
	go func() {
		defer wg.Done()
		d.expiryLoop(ctx)
	}()
	if d.o.ConsulHealth != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d.kvFailoverLoop(ctx)
		}()
	}
	if d.o.Duty != nil {
		d.runLeaderDuty(ctx)
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
func (d *Duties) barrier(ctx context.Context) bool {
	for {
		term := d.o.Raft.CurrentTerm()
		err := d.o.Raft.Barrier(d.o.ApplyTimeout).Error()
		if d.o.AfterBarrier != nil {
			d.o.AfterBarrier()
		}
		if err == nil && d.o.Raft.CurrentTerm() == term && d.o.Raft.State() == raft.Leader {
			d.o.BarrierDone(term) // contactLoop: caught up
			return true
		}
		if err == nil {
			err = fmt.Errorf("the term moved from %d to %d during the barrier", term, d.o.Raft.CurrentTerm())
		}
		d.log.Warn("raft barrier on new leader failed; retrying", zap.Error(err))
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
func (d *Duties) runLeaderDuty(ctx context.Context) {
	for {
		err := d.o.Duty(ctx)
		if err == nil || ctx.Err() != nil {
			return
		}
		d.m.dutyFailures.Inc()
		if Voters(d.o.Raft) < 2 {
			d.log.Error("leader duty failed and no other replica can take over; retrying", zap.Error(err), zap.Duration("retry_in", leaderDutyRetry))
		} else {
			d.log.Error("leader duty failed; handing leadership to another replica", zap.Error(err))
			if terr := d.o.Raft.LeadershipTransfer().Error(); terr != nil {
				d.log.Warn("leadership transfer after a failed leader duty failed; retrying the duty", zap.Error(terr), zap.Duration("retry_in", leaderDutyRetry))
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(leaderDutyRetry):
		}
	}
}
