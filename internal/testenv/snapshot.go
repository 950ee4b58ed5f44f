package testenv

import (
	"bytes"
	"io"
	"os"
	"testing"

	"github.com/hashicorp/raft"
)

// Snapshot persists from's snapshot and restores it into to, as a
// restarted replica does, and returns the persisted bytes.
func Snapshot(t testing.TB, from, to raft.FSM) *bytes.Buffer {
	t.Helper()
	snap, err := from.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	sink := &memSink{}
	if err := snap.Persist(sink); err != nil {
		t.Fatal(err)
	}
	if err := to.Restore(io.NopCloser(bytes.NewReader(sink.Bytes()))); err != nil {
		t.Fatal(err)
	}
	return &sink.Buffer
}

// memSink is a raft.SnapshotSink in memory.
type memSink struct{ bytes.Buffer }

func (s *memSink) ID() string    { return "mem" }
func (s *memSink) Cancel() error { return nil }
func (s *memSink) Close() error  { return nil }

// Lines reads the file at path (a fixture under testdata/) as one item
// per line, without the line breaks; empty lines are skipped.
func Lines(t testing.TB, path string) [][]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for _, l := range bytes.Split(b, []byte("\n")) {
		if len(l) > 0 {
			out = append(out, l)
		}
	}
	return out
}
