package fsm

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/hastate/hastate/internal/testenv/raftenv"
	"github.com/hastate/hastate/state"
)

func TestFSMSnapshotVersioning(t *testing.T) {
	f := New(Options{})
	m := state.NewMirror()
	m.Apply(state.Change{Set: map[string]string{"state/a/b": "drain"}})
	f.mirror, f.kvIndex = m, 9
	f.index.Store(42)
	g, sink := roundTrip(t, f)
	if got := string(g.Serving().Lookup([]byte("a/b"), 1)); got != "drain\n" || g.kvIndex != 9 || g.Index() != 42 {
		t.Fatalf("restored answer %q kv index %d state index %d, want drain, 9, 42", got, g.kvIndex, g.Index())
	}
	// A version 2 snapshot has no state index: it restores with 0 (the
	// node then takes the snapshot's raft index).
	v2 := `{"version":2,"kv_index":9,"mirror":{"synced":true,"kv":{"state/a/b":"maint"}}}`
	if err := g.Restore(io.NopCloser(strings.NewReader(v2))); err != nil {
		t.Fatalf("restoring a version 2 snapshot: %v", err)
	}
	if got := string(g.Serving().Lookup([]byte("a/b"), 1)); got != "maint\n" || g.Index() != 0 {
		t.Fatalf("version 2 snapshot restored answer %q state index %d, want maint, 0", got, g.Index())
	}
	// A mirror at the base level writes the shape release 0.13.0 reads.
	if !strings.Contains(sink.String(), fmt.Sprintf(`"version":%d`, SnapshotVersionBase)) {
		t.Fatalf("a snapshot at level %d: %s, want version %d", state.LevelBase, sink.String(), SnapshotVersionBase)
	}
	newer := strings.Replace(sink.String(), fmt.Sprintf(`"version":%d`, SnapshotVersionBase), fmt.Sprintf(`"version":%d`, SnapshotVersion+1), 1)
	if err := g.Restore(io.NopCloser(strings.NewReader(newer))); err == nil || !strings.Contains(err.Error(), "upgrade") {
		t.Fatalf("restoring a newer snapshot: %v, want an error telling to upgrade", err)
	}
	if res := g.Apply(&raft.Log{Type: raft.LogCommand, Index: 3, Data: []byte(`{"type":"ramp-v9"}`)}); res == nil {
		t.Fatal("an unknown entry type must be reported")
	}
}

// roundTrip persists f's snapshot and restores it into a new FSM, as a
// restarted replica does; the buffer holds the persisted bytes.
func roundTrip(t *testing.T, f *FSM) (*FSM, *bytes.Buffer) {
	t.Helper()
	g := New(Options{})
	return g, raftenv.Snapshot(t, f, g)
}

// A snapshot keeps release 0.13.0's shape (version 4) until level 2 is in
// force, and then says version 5 and the level, which a replica capped
// below it refuses.
func TestSnapshotShapeFollowsTheLevel(t *testing.T) {
	f := New(Options{})
	f.Apply(&raft.Log{Type: raft.LogCommand, Index: 1, Data: entry(t, Command{Type: CmdKV, Change: state.Change{Set: map[string]string{"state/web/a": "drain"}}})})
	_, base := roundTrip(t, f)
	if !strings.Contains(base.String(), `"version":4`) || strings.Contains(base.String(), `"level"`) {
		t.Fatalf("a snapshot at level 1: %s", base.String())
	}
	f.Apply(&raft.Log{Type: raft.LogCommand, Index: 2, Data: entry(t, Command{Type: CmdLevel, Level: state.LevelMeta})})
	g, meta := roundTrip(t, f)
	if !strings.Contains(meta.String(), `"version":5`) || !strings.Contains(meta.String(), `"level":2`) || g.Level() != state.LevelMeta {
		t.Fatalf("a snapshot at level 2: %s (restored level %d)", meta.String(), g.Level())
	}
	old := New(Options{})
	old.maxLevel = state.LevelBase
	if err := old.Restore(io.NopCloser(strings.NewReader(meta.String()))); err == nil || !strings.Contains(err.Error(), "upgrade") {
		t.Fatalf("a replica capped at level 1 restoring a level 2 snapshot: %v", err)
	}
}

// The record rides in snapshots, and a replica of a release below
// state.LevelRecorded refuses such a snapshot (the level says so first).
func TestHAProxiesInSnapshot(t *testing.T) {
	f := New(Options{})
	f.Apply(&raft.Log{Type: raft.LogCommand, Index: 1, Data: entry(t, Command{Type: CmdKV, Change: state.Change{Set: map[string]string{"state/web/a": "drain"}}})})
	f.Apply(&raft.Log{Type: raft.LogCommand, Index: 2, Data: entry(t, Command{Type: CmdLevel, Level: state.LevelRecorded})})
	at := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	f.Apply(&raft.Log{Type: raft.LogCommand, Index: 3, Data: entry(t, Command{Type: CmdHAProxies, HAProxies: &state.HAProxyChange{Seen: map[string]time.Time{"10.0.0.1": at}}})})
	g, snap := roundTrip(t, f)
	if rec := g.HAProxies(); len(rec) != 1 || !rec["10.0.0.1"].Last.Equal(at) {
		t.Fatalf("restored record %v from %s", rec, snap.String())
	}
	old := New(Options{})
	old.maxLevel = state.LevelMeta
	if err := old.Restore(io.NopCloser(strings.NewReader(snap.String()))); err == nil || !strings.Contains(err.Error(), "upgrade") {
		t.Fatalf("a replica capped at level %d restoring a level %d snapshot: %v", state.LevelMeta, state.LevelRecorded, err)
	}
	// An entry without its payload is skipped, on every replica alike.
	var rejected []error
	f.o.Rejected = func(err error) { rejected = append(rejected, err) }
	f.Apply(&raft.Log{Type: raft.LogCommand, Index: 4, Data: []byte(`{"type":"haproxies"}`)})
	if len(rejected) != 1 || f.NotUnderstood() != nil {
		t.Fatalf("payload-less entry: rejected %v, not understood %v", rejected, f.NotUnderstood())
	}
}

// A snapshot carries the source (version 6); without one it keeps the
// shape 0.14.0 restores (version 5), and a replica capped below level 3
// refuses a version 6 snapshot loudly.
func TestSnapshotCarriesTheSource(t *testing.T) {
	f := New(Options{})
	f.Apply(&raft.Log{Type: raft.LogCommand, Index: 1, Data: entry(t, Command{Type: CmdLevel, Level: state.LevelMeta})})
	f.Apply(&raft.Log{Type: raft.LogCommand, Index: 2, Data: entry(t, Command{Type: CmdKV, KVIndex: 9, Change: state.Change{Set: map[string]string{"state/web/a": "drain"}}})})
	if _, snap := roundTrip(t, f); !strings.Contains(snap.String(), `"version":5`) || strings.Contains(snap.String(), `"source"`) {
		t.Fatalf("a snapshot at level 2 without a source: %s", snap.String())
	}
	src := state.MirrorSource{ClusterID: "aaaa", Datacenter: "dc1", Servers: "127.0.0.1:8300", Prefix: "hastate/"}
	f.Apply(&raft.Log{Type: raft.LogCommand, Index: 3, Data: entry(t, Command{Type: CmdLevel, Level: state.LevelRecorded})})
	f.Apply(&raft.Log{Type: raft.LogCommand, Index: 4, Data: entry(t, Command{Type: CmdSource, Source: &src})})
	g, snap := roundTrip(t, f)
	if !strings.Contains(snap.String(), `"version":6`) {
		t.Fatalf("a snapshot with a source: %s", snap.String())
	}
	if rec, idx := g.Recorded(); rec == nil || *rec != src || idx != 9 {
		t.Fatalf("restored source %v at kv index %d, want %v at 9", rec, idx, src)
	}
	old := New(Options{})
	old.maxLevel = state.LevelMeta
	if err := old.Restore(io.NopCloser(strings.NewReader(snap.String()))); err == nil || !strings.Contains(err.Error(), "upgrade") {
		t.Fatalf("a replica capped at level 2 restoring a version 6 snapshot: %v", err)
	}
	// An adopting source entry forgets the other cluster's index.
	f.Apply(&raft.Log{Type: raft.LogCommand, Index: 5, Data: entry(t, Command{Type: CmdSource, Source: &src, Adopt: true})})
	if _, idx := f.Recorded(); idx != 0 {
		t.Errorf("kv index after an adoption: %d, want 0", idx)
	}
}

// TestUnknownEntryIsNotUnderstood: an entry this release does not
// understand (a type, or a feature level, of a newer release) is not
// skipped: the FSM says why, once, and applies the entries after it (an
// upgraded binary replays them).
func TestUnknownEntryIsNotUnderstood(t *testing.T) {
	for name, data := range map[string][]byte{
		"unknown type":     []byte(`{"type":"ramp-v9"}`),
		"level from later": entry(t, Command{Type: CmdLevel, Level: state.MaxLevel + 1}),
	} {
		t.Run(name, func(t *testing.T) {
			f := New(Options{})
			var told []error
			f.o.NotUnderstood = func(err error) { told = append(told, err) }
			f.Apply(&raft.Log{Type: raft.LogCommand, Index: 1, Data: entry(t, Command{Type: CmdKV, Change: state.Change{Set: map[string]string{"state/web/a": "drain"}}})})
			f.Apply(&raft.Log{Type: raft.LogCommand, Index: 2, Data: data})
			if err := f.NotUnderstood(); err == nil || !strings.Contains(err.Error(), "upgrade") || len(told) != 1 {
				t.Errorf("notUnderstood = %v (told %d times), want the reason with what to do, told once", err, len(told))
			}
			// Later entries are applied (an upgraded binary replays them).
			f.Apply(&raft.Log{Type: raft.LogCommand, Index: 3, Data: data})
			f.Apply(&raft.Log{Type: raft.LogCommand, Index: 4, Data: entry(t, Command{Type: CmdKV, Change: state.Change{Set: map[string]string{"state/web/b": "drain"}}})})
			if f.Index() != 4 || len(told) != 1 {
				t.Errorf("after later entries: index %d, told %d times", f.Index(), len(told))
			}
		})
	}
}
