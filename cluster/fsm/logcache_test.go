package fsm

import (
	"bytes"
	"errors"
	"testing"

	"github.com/hashicorp/raft"
)

// countingStore is an in-memory raft.LogStore that counts GetLog calls.
type countingStore struct {
	*raft.InmemStore
	gets int
	fail error
}

func (s *countingStore) GetLog(index uint64, l *raft.Log) error {
	s.gets++
	return s.InmemStore.GetLog(index, l)
}

func (s *countingStore) StoreLogs(logs []*raft.Log) error {
	if s.fail != nil {
		return s.fail
	}
	return s.InmemStore.StoreLogs(logs)
}

func TestLogCacheKeepsRecentEntriesAndALargeOneOnlyWhileNeeded(t *testing.T) {
	store := &countingStore{InmemStore: raft.NewInmemStore()}
	c := NewLogCache(4, store)
	get := func(i uint64) raft.Log {
		t.Helper()
		var l raft.Log
		if err := c.GetLog(i, &l); err != nil {
			t.Fatalf("GetLog(%d): %v", i, err)
		}
		return l
	}
	small := func(i uint64) *raft.Log { return &raft.Log{Index: i, Term: 1, Data: []byte{byte(i)}} }
	if err := c.StoreLogs([]*raft.Log{small(1), small(2)}); err != nil {
		t.Fatal(err)
	}
	big := &raft.Log{Index: 3, Term: 2, Data: bytes.Repeat([]byte("x"), LargeEntry+1)}
	if err := c.StoreLog(big); err != nil {
		t.Fatal(err)
	}
	// Recent entries, the large one included while it is the newest,
	// come from the cache.
	for range 3 {
		if l := get(3); l.Term != 2 || len(l.Data) != LargeEntry+1 {
			t.Fatalf("entry 3: term %d, %d bytes", l.Term, len(l.Data))
		}
		if l := get(2); l.Data[0] != 2 {
			t.Fatalf("entry 2: %v", l.Data)
		}
	}
	if store.gets != 0 {
		t.Fatalf("%d reads from the store, want 0", store.gets)
	}
	// The next entry is sent with it as the previous one: still cached.
	if err := c.StoreLog(small(4)); err != nil {
		t.Fatal(err)
	}
	if l := get(3); len(l.Data) != LargeEntry+1 || store.gets != 0 {
		t.Fatalf("entry 3 after entry 4: %d bytes, %d store reads; want it whole, from the cache", len(l.Data), store.gets)
	}
	// Two entries on, it is read from the store.
	if err := c.StoreLog(small(5)); err != nil {
		t.Fatal(err)
	}
	if l := get(3); len(l.Data) != LargeEntry+1 || store.gets != 1 {
		t.Fatalf("entry 3 after entry 5: %d bytes, %d store reads; want it whole, from the store", len(l.Data), store.gets)
	}
	get(4)
	// The ring holds the last 4: entry 1 falls out after entry 5.
	get(1)
	if store.gets != 2 {
		t.Fatalf("%d store reads, want 2 (entry 3 and entry 1)", store.gets)
	}
	// DeleteRange empties the cache.
	if err := c.DeleteRange(1, 2); err != nil {
		t.Fatal(err)
	}
	get(5)
	if store.gets != 3 {
		t.Fatalf("%d store reads after DeleteRange, want 3", store.gets)
	}
	// A failed store caches nothing and keeps the store's error.
	errFull := errors.New("no space left on device")
	store.fail = errFull
	if err := c.StoreLog(small(6)); !errors.Is(err, errFull) {
		t.Fatalf("StoreLog on a full store: %v, want it to wrap %v", err, errFull)
	}
	var l raft.Log
	if err := c.GetLog(6, &l); err == nil {
		t.Fatal("an entry that failed to store is served")
	}
}
