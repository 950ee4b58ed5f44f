// Package raftenv is test support that needs hashicorp/raft (kept out of
// internal/testenv, which the test modules of their own import without
// raft): a state machine's snapshot taken and restored in memory.
package raftenv

import (
	"bytes"
	"io"
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
