package cluster

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hastate/hastate/cluster/fsm"
	"github.com/hastate/hastate/cluster/leader"
	"github.com/hastate/hastate/internal/testenv"
	"github.com/hastate/hastate/state"
)

// An entry this release does not understand (a type, or a feature level,
// of a newer release) is not skipped: the replica withholds every answer
// from then on, says why, and fails readiness (the state machine's side:
// fsm's TestUnknownEntryIsNotUnderstood).
func TestUnknownEntryWithholds(t *testing.T) {
	n := startLeader(t, Options{})
	if err := n.ApplyKV(context.Background(), 1, map[string]string{"state/web/a": "drain"}); err != nil {
		t.Fatal(err)
	}
	if err := n.raft.Apply([]byte(`{"type":"ramp-v9"}`), 5*time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, holdsf(func() bool { ok, _ := n.Ready(); return !ok }, "ready after an entry it does not understand"))
	if _, detail := n.Ready(); !strings.Contains(detail, "withholds every answer") {
		t.Errorf("readiness detail %q", detail)
	}
	if n.Serving() != nil || !slices.Contains(n.reads.Labels(), "not_understood") {
		t.Errorf("the replica still answers after an entry it does not understand (reasons %v)", n.reads.Labels())
	}
	if in := n.Info(); in.Level.NotUnderstood == "" {
		t.Errorf("/v1/cluster level %+v does not say why the replica withholds", in.Level)
	}
}

// The gate, shown with a replica that plays release 0.13.0 (it advertises
// LevelBase and would withhold on a level entry): the leader defers
// LevelMeta while it runs, says so, and the meta key's until does not
// count on any replica; the older replica never withholds. Once it runs
// this release, the level rises everywhere and the key expires everywhere.
func TestLevelGateDefersUntilEveryVoterAdvertises(t *testing.T) {
	nodes := startCluster(t, func(i int, o *Options) {
		if i == 2 {
			o.MaxLevel = state.LevelBase
		}
	})
	testenv.Eventually(t, 10*time.Second, holdsf(func() bool { return leaderOf(nodes) != nil }, "no leader"))
	ctx := context.Background()
	past := time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)
	kv := map[string]string{"state/web/a": "drain", "meta/web/a": `{"state":"drain","by":"alice","until":"` + past + `","future":1}`}
	applyOnLeader(t, nodes, 1, kv)
	testenv.Eventually(t, 10*time.Second, holdsf(func() bool {
		for _, n := range nodes {
			if answer(n.Node, "web/a") != "drain\n" {
				return false
			}
		}
		return true
	}, "not every replica answers drain"))
	var waiting string
	testenv.Eventually(t, 20*time.Second, func() error {
		if l := leaderOf(nodes); l != nil {
			waiting = l.Info().Level.Waiting
		}
		// n2 itself may lead: it plays the older release, capped.
		return testenv.Expect(strings.Contains(waiting, "n2 (") || strings.Contains(waiting, "is held"), "the leader does not say what waits for n2: %q", waiting)
	})
	// Several gate rounds: nothing expires, nobody withholds.
	testenv.Consistently(t, 3*leader.LevelEvery, func() error {
		for _, n := range nodes {
			if got := answer(n.Node, "web/a"); got != "drain\n" {
				return fmt.Errorf("%s answers %q while the gate waits, want drain (the meta key's until waits)", n.opts.ID, got)
			}
			if err := n.fsm.NotUnderstood(); err != nil || n.fsm.Level() != state.LevelBase {
				return fmt.Errorf("%s: level %d, not understood %v", n.opts.ID, n.fsm.Level(), err)
			}
		}
		return nil
	})
	if got := nodes[0].Snapshot().Resolve("web", "a").Entry.Note; got != state.NoteMetaWaits {
		t.Errorf("status note %q, want %q", got, state.NoteMetaWaits)
	}

	// n2 stops to be upgraded: a member that does not answer has not said
	// that it understands the next level, so nothing rises meanwhile.
	o := nodes[2].opts
	if err := nodes[2].Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	testenv.Consistently(t, 3*leader.LevelEvery, func() error {
		for _, n := range nodes[:2] {
			if lvl := n.fsm.Level(); lvl != state.LevelBase {
				return fmt.Errorf("%s: level %d with n2 down, want %d (n2 never advertised more)", n.opts.ID, lvl, state.LevelBase)
			}
		}
		return nil
	})
	// n2 is upgraded: same data dir, this release.
	o.MaxLevel = 0
	nodes[2] = startNode(t, o)
	testenv.Eventually(t, 15*time.Second, holdsf(func() bool {
		for _, n := range nodes {
			if n.fsm.Level() != state.MaxLevel || answer(n.Node, "web/a") != "ready 100%\n" {
				return false
			}
		}
		return true
	}, "the level did not rise, or the key did not expire, on every replica"))
	if w := leaderOf(nodes).Info().Level.Waiting; w != "" {
		t.Errorf("still waiting: %s", w)
	}
	// Once level 2 is in force, a replica that is down is not a replica
	// below it: nothing is reported.
	var down *testNode
	for _, n := range nodes {
		if !n.IsLeader() {
			down = n
			break
		}
	}
	if err := down.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	testenv.Consistently(t, 3*leader.LevelEvery, func() error {
		if l := leaderOf(nodes); l != nil && l.Node != down.Node {
			if w := l.Info().Level.Waiting; w != "" {
				return fmt.Errorf("with %s down at level 2 the leader reports: %s", down.opts.ID, w)
			}
		}
		return nil
	})
}

// holdsf turns a condition and its failure message into an Eventually
// condition.
func holdsf(cond func() bool, format string, args ...any) func() error {
	return func() error { return testenv.Expect(cond(), format, args...) }
}

// TestNotUnderstoodSurvivesSnapshotsAndRestarts: a replica that met an
// entry it does not understand takes no snapshot past it (a snapshot would
// hold a state that skipped the entry, and the log would lose it). So,
// restarted with its --data-dir, it restores the snapshot taken before the
// entry, replays the entry and withholds again; restarted as a release
// that understands the entry, it applies it and the entries after it, and
// answers.
func TestNotUnderstoodSurvivesSnapshotsAndRestarts(t *testing.T) {
	older := Options{MaxLevel: state.LevelBase} // plays a release that stops at LevelBase
	n := startLeader(t, older)
	ctx := context.Background()
	if err := n.ApplyKV(ctx, 1, map[string]string{"state/web/a": "drain"}); err != nil {
		t.Fatal(err)
	}
	if err := n.raft.Snapshot().Error(); err != nil {
		t.Fatalf("snapshot before the entry: %v", err)
	}
	newer := entry(t, fsm.Command{Type: fsm.CmdLevel, Level: state.LevelBase + 1})
	if err := n.raft.Apply(newer, 5*time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	if err := n.ApplyKV(ctx, 2, map[string]string{"state/web/a": "drain", "state/web/b": "maint"}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, holdsf(func() bool { return slices.Contains(n.reads.Labels(), "not_understood") }, "not withholding after an entry it does not understand"))
	err := n.raft.Snapshot().Error()
	if err == nil || !strings.Contains(err.Error(), "not understood") {
		t.Fatalf("a snapshot while stuck: %v, want it refused", err)
	}
	o := n.opts
	if err := n.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}

	// The same release, the same --data-dir: it withholds again.
	r := startLeader(t, o)
	testenv.Eventually(t, 10*time.Second, holdsf(func() bool { return slices.Contains(r.reads.Labels(), "not_understood") }, "restarted with its data dir, the replica does not withhold: %v", r.reads.Labels()))
	if r.Serving() != nil {
		t.Fatal("restarted with its data dir, the replica answers from a state that skipped an entry")
	}
	if ok, d := r.Ready(); ok || !strings.Contains(d, "newer release") {
		t.Errorf("readiness after the restart: %v %q", ok, d)
	}
	if err := r.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}

	// A release that understands the entry replays it and answers.
	o.MaxLevel = 0
	u := startLeader(t, o)
	testenv.Eventually(t, 10*time.Second, holdsf(func() bool { ok, _ := u.Ready(); return ok }, "the upgraded replica is not ready: %v", u.reads.Labels()))
	if got, lvl := answer(u.Node, "web/b"), u.fsm.Level(); got != "maint\n" || lvl < state.LevelBase+1 {
		t.Errorf("the upgraded replica answers web/b %q at level %d, want maint at level >= %d", got, lvl, state.LevelBase+1)
	}
	if err := u.raft.Snapshot().Error(); err != nil {
		t.Errorf("the upgraded replica cannot snapshot: %v", err)
	}
}
