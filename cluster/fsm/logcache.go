package fsm

// This file keeps the recent raft entries decoded. Raft reads the entry
// before the next one to send for every AppendEntries, the idle ones sent
// each commitTimeout included; from boltdb that decodes the whole entry
// every time, and a new leader's full-KV entry at 50,000 keys is 5 MB
// (decoded every few milliseconds per follower, it set the replicas'
// memory). raft.LogCache solves that but keeps such an entry for as long
// as it is among the last few, on every replica; this cache keeps a large
// entry only while it is the newest or the one before it (sending the
// next entry needs it as the previous one; then nothing does, unless a
// follower lags, which reads it from the store).

import (
	"fmt"
	"sync"

	"github.com/hashicorp/raft"
)

// LargeEntry is the size of an entry's data above which the cache keeps it
// only while it is one of the newest two.
const LargeEntry = 256 << 10

// LogCache is a raft.LogStore that keeps the last entries it stored (a
// ring of fixed size) in front of store.
type LogCache struct {
	store raft.LogStore

	mu   sync.RWMutex
	ring []*raft.Log // by index modulo its length
}

var _ raft.LogStore = (*LogCache)(nil)

func NewLogCache(entries int, store raft.LogStore) *LogCache {
	return &LogCache{store: store, ring: make([]*raft.Log, entries)}
}

func (c *LogCache) GetLog(index uint64, l *raft.Log) error {
	c.mu.RLock()
	cached := c.ring[index%uint64(len(c.ring))]
	c.mu.RUnlock()
	if cached != nil && cached.Index == index {
		*l = *cached
		return nil
	}
	return c.store.GetLog(index, l)
}

func (c *LogCache) StoreLog(l *raft.Log) error { return c.StoreLogs([]*raft.Log{l}) }

// StoreLogs stores logs, then caches them; a large entry older than the
// newest two leaves the cache.
func (c *LogCache) StoreLogs(logs []*raft.Log) error {
	if err := c.store.StoreLogs(logs); err != nil {
		return fmt.Errorf("store raft entries: %w", err)
	}
	if len(logs) == 0 {
		return nil
	}
	newest := logs[len(logs)-1].Index
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, l := range logs {
		c.ring[l.Index%uint64(len(c.ring))] = l
	}
	for i, l := range c.ring {
		if l != nil && l.Index+1 < newest && len(l.Data) > LargeEntry {
			c.ring[i] = nil
		}
	}
	return nil
}

func (c *LogCache) FirstIndex() (uint64, error) { return c.store.FirstIndex() }
func (c *LogCache) LastIndex() (uint64, error)  { return c.store.LastIndex() }

// DeleteRange empties the cache, then deletes from the store.
func (c *LogCache) DeleteRange(min, max uint64) error {
	c.mu.Lock()
	clear(c.ring)
	c.mu.Unlock()
	return c.store.DeleteRange(min, max)
}
