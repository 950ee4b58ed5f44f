package state

import (
	"hash/maphash"
	"maps"
	"slices"
	"strings"
)

// Snapshot returns the immutable serving view of the mirror. It rebuilds
// only the shards (backends) changed since the last call, and shares the
// others with the snapshot that call returned: applying an entry costs what
// the entry touches, not the size of the fleet.
func (m *Mirror) Snapshot() *Snapshot {
	if m.last == nil {
		return m.RebuildSnapshot()
	}
	if len(m.dirty) == 0 {
		return m.last
	}
	s := *m.last // the group array is copied; the groups are shared
	var copied [snapshotGroups]bool
	for name := range m.dirty {
		g := int(maphash.String(s.seed, name) & (snapshotGroups - 1))
		if !copied[g] {
			s.groups[g] = maps.Clone(s.groups[g])
			if s.groups[g] == nil {
				s.groups[g] = map[string]*shard{}
			}
			copied[g] = true
		}
		if old := s.groups[g][name]; old != nil {
			s.count(old, -1)
			delete(s.groups[g], name)
		}
		if p := m.parts[name]; p != nil {
			sh := buildShard(p)
			s.groups[g][name] = sh
			s.count(sh, 1)
		}
	}
	clear(m.dirty)
	m.last = &s
	return &s
}

// RebuildSnapshot builds the serving view from scratch, every shard anew,
// and makes it the base of the next Snapshot. Snapshot gives the same
// answers for less; this is the reference it is tested against, and the
// way back to a known state after a failed apply.
func (m *Mirror) RebuildSnapshot() *Snapshot {
	s := &Snapshot{seed: maphash.MakeSeed()}
	for name, p := range m.parts {
		g := int(maphash.String(s.seed, name) & (snapshotGroups - 1))
		if s.groups[g] == nil {
			s.groups[g] = map[string]*shard{}
		}
		sh := buildShard(p)
		s.groups[g][name] = sh
		s.count(sh, 1)
	}
	clear(m.dirty)
	m.last = s
	return s
}

// count adds (sign 1) or removes (sign -1) a shard's share of the totals.
func (s *Snapshot) count(sh *shard, sign int) {
	s.entries += sign * len(sh.entries)
	s.invalid += sign * sh.invalid
	s.ramps += sign * len(sh.ramps)
}

// buildShard builds one shard from its part of the mirror: its entries
// (shared: the mirror never changes an entry in place), copies of its
// ramps, and the wire line of every target they name.
func buildShard(p *part) *shard {
	sh := &shard{
		exact:   make(map[string]*[]byte, len(p.entries)+len(p.ramps)),
		entries: make([]*Entry, 0, len(p.entries)),
		ramps:   make(map[string]Ramp, len(p.ramps)),
	}
	for _, e := range p.entries {
		sh.entries = append(sh.entries, e)
		if !e.Valid() {
			sh.invalid++
		}
	}
	slices.SortFunc(sh.entries, func(a, b *Entry) int { return strings.Compare(a.Key, b.Key) })
	for t, r := range p.ramps {
		sh.ramps[t] = *r
	}
	// The exact map's keys are the servers' names as the entries and
	// ramps already hold them (a substring of the key or target), not a
	// new string each.
	put := func(b, srv string) {
		line := sh.resolve(b, srv).Answer.lineRef()
		if srv == Wildcard {
			sh.wildcard, sh.hasWild = *line, true
		} else {
			sh.exact[srv] = line
		}
	}
	for _, e := range sh.entries {
		if e.Backend != "" {
			put(e.Backend, e.Server)
		}
	}
	for t := range sh.ramps {
		b, srv, _ := strings.Cut(t, "/")
		put(b, srv)
	}
	return sh
}
