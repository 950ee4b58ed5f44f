package cluster

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hastate/hastate/internal/testenv"
	"github.com/hastate/hastate/state"
)

// fakeSightings is one replica's poller table as the node sees it.
type fakeSightings struct {
	mu sync.Mutex
	m  Sightings
}

func (f *fakeSightings) set(src string, at time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.m[src] = at
}

// setAll moves every named source to at in one step, as one gathering
// would see it: a gathering between single sets would see part of them
// moved and write them in two entries.
func (f *fakeSightings) setAll(srcs []string, at time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, src := range srcs {
		f.m[src] = at
	}
}

func (f *fakeSightings) get() Sightings {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := Sightings{}
	for k, v := range f.m {
		out[k] = v
	}
	return out
}

// The record of HAProxy nodes: what any replica saw reaches every
// replica's record; nothing is written while a replica plays a release
// below state.LevelRecorded (it would withhold on the entry), and it is
// once that replica is upgraded. Each source's own sightings stay on the
// replica that saw it: a source only n2 saw is recorded too.
func TestHAProxiesRecordedOnceEveryVoterAdvertises(t *testing.T) {
	seen := [3]*fakeSightings{{m: Sightings{}}, {m: Sightings{}}, {m: Sightings{}}}
	nodes := startCluster(t, func(i int, o *Options) {
		o.Sightings = seen[i].get
		o.HAProxySyncEvery = 100 * time.Millisecond
		if i == 2 {
			o.MaxLevel = state.LevelMeta
		}
	})
	now := time.Now()
	seen[0].set("127.0.0.10", now)
	seen[2].set("127.0.0.12", now)
	testenv.Eventually(t, 20*time.Second, holdsf(func() bool {
		for _, n := range nodes {
			if n.fsm.Level() != state.LevelMeta {
				return false
			}
		}
		return true
	}, "the level did not rise to %d", state.LevelMeta))
	testenv.Consistently(t, 2*time.Second, func() error {
		for _, n := range nodes {
			if rec, on := n.HAProxies(); on || len(rec) > 0 {
				return fmt.Errorf("%s records %v (on %v) while n2 plays a release below level %d", n.opts.ID, rec, on, state.LevelRecorded)
			}
			if err := n.fsm.NotUnderstood(); err != nil {
				return fmt.Errorf("%s: %v", n.opts.ID, err)
			}
		}
		return nil
	})

	o := nodes[2].opts
	if err := nodes[2].Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	o.MaxLevel = 0
	nodes[2] = startNode(t, o)
	testenv.Eventually(t, 20*time.Second, func() error {
		for _, n := range nodes {
			rec, on := n.HAProxies()
			if !on || len(rec) != 2 || rec["127.0.0.10"].Last.IsZero() || rec["127.0.0.12"].Last.IsZero() {
				return fmt.Errorf("%s records %v (on %v), want 127.0.0.10 and 127.0.0.12", n.opts.ID, rec, on)
			}
		}
		return nil
	})
}

// Write volume: with every source polling all the time, the leader writes
// nothing between the coarse steps of the record (state.HAProxyCoarse),
// however often it gathers.
func TestHAProxiesWritesOnlyChanges(t *testing.T) {
	var clock struct {
		mu  sync.Mutex
		now time.Time
	}
	clock.now = time.Now()
	now := func() time.Time {
		clock.mu.Lock()
		defer clock.mu.Unlock()
		return clock.now
	}
	seen := &fakeSightings{m: Sightings{}}
	n := startLeader(t, Options{Sightings: seen.get, HAProxySyncEvery: 20 * time.Millisecond, Now: now})
	var srcs []string
	for i := range 100 {
		srcs = append(srcs, fmt.Sprintf("127.0.0.%d", i+1))
	}
	seen.setAll(srcs, now())
	testenv.Eventually(t, 10*time.Second, holdsf(func() bool { rec, _ := n.HAProxies(); return len(rec) == 100 }, "100 sources not recorded"))
	writes := metricOf(t, n, "hastate_haproxies_writes_total", "")
	// Every source polls again and again within the coarse step.
	for range 10 {
		clock.mu.Lock()
		clock.now = clock.now.Add(state.HAProxyCoarse / 20)
		clock.mu.Unlock()
		seen.setAll(srcs, now())
		// The loop gathers at least twice at this clock.
		testenv.Consistently(t, 60*time.Millisecond, func() error {
			got := metricOf(t, n, "hastate_haproxies_writes_total", "")
			return testenv.Expect(got == writes, "%v haproxies entries within one coarse step, want none", got-writes)
		})
	}
	// Past the step: one entry moves every source.
	clock.mu.Lock()
	clock.now = clock.now.Add(state.HAProxyCoarse)
	clock.mu.Unlock()
	seen.setAll(srcs, now())
	testenv.Eventually(t, 10*time.Second, holdsf(func() bool {
		rec, _ := n.HAProxies()
		return rec["127.0.0.1"].Last.Equal(now()) && rec["127.0.0.100"].Last.Equal(now())
	}, "the record did not move past the coarse step"))
	if got := metricOf(t, n, "hastate_haproxies_writes_total", "") - writes; got != 1 {
		t.Fatalf("%v entries to move 100 sources, want 1", got)
	}
}
