package state

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
	"unique"
)

// StatePrefix is the part of a KV key, after the configured prefix, under
// which server states live: <prefix>state/<backend>/<server>.
const StatePrefix = "state/"

// Wildcard is the server name of a backend-wide key.
const Wildcard = "*"

// Change is a set of KV differences: keys (relative to the prefix) to set to
// a raw value and keys to delete. It is the payload the raft leader applies.
type Change struct {
	Set    map[string]string `json:"set,omitempty"`
	Delete []string          `json:"delete,omitempty"`
}

// Empty reports whether the change changes nothing.
func (c Change) Empty() bool { return len(c.Set) == 0 && len(c.Delete) == 0 }

// Entry is one key under <prefix>state/ with its raw value and the last
// value of it that parsed.
//
// An Entry a Mirror has handed to a Snapshot never changes: the mirror
// replaces an entry it changes with a changed copy, so that snapshots
// share entries with the mirror and with each other instead of copying
// every one. Callers given an *Entry (Resolution.Entry) must not modify it.
type Entry struct {
	Key     string // relative KV key, e.g. "state/web/a"
	Backend string
	Server  string // a server name or Wildcard
	Raw     string // current KV value
	Err     string // why Raw is invalid; empty when it is valid
	// last is the last valid value (see Last), interned: most keys of a
	// fleet hold one of a few values (drain, maint, the same JSON drain
	// for a whole zone), so entries share one copy each instead of
	// holding about 100 bytes apiece. Zero when HasLast is false.
	last    unique.Handle[Value]
	LastRaw string
	HasLast bool
	// Expired is true once the leader expired the key (its value's
	// "until" passed): it then counts as absent, until a valid value is
	// written (an invalid one changes nothing, see set).
	Expired bool
	// Since is when the key's last valid value took the state it holds
	// (Last().String(): drain, maint, ready, N%): the leader's time in the
	// raft entry that set it, so it is the same on every replica. A new
	// reason or an invalid value does not move it. Zero when not known
	// (applied without a time, or restored from a snapshot written before
	// hastate recorded it).
	Since time.Time
	// Note says what status should know about the key and its meta key
	// (NoteJSONState, NoteOutside, an ignored meta key); empty when
	// nothing.
	Note string
}

// Valid reports whether the current raw value parsed.
func (e *Entry) Valid() bool { return e.Err == "" }

// Last returns the last valid value: Raw's when Err is empty, the zero
// Value when HasLast is false.
func (e *Entry) Last() Value {
	if !e.HasLast {
		return Value{}
	}
	return e.last.Value()
}

// Mirror is the mirrored KV content under the prefix plus, for every state
// key, its last valid value. It is the state machine's data: Apply must be
// deterministic. A Mirror is not safe for concurrent use; readers use the
// immutable Snapshot it builds.
type Mirror struct {
	raw    map[string]string
	synced bool
	// level is the feature level in force (see LevelMeta): it says
	// whether meta keys give state keys their until and ramp.
	level int

	// parts holds the state keys' entries and the ramps, by snapshot
	// shard (backend), so that a shard is rebuilt from its own alone.
	parts map[string]*part
	// The leader reads these on every tick, under the state machine's
	// lock, so they are kept as entries and ramps change rather than
	// found by a scan of every part: until holds Last.Until of every
	// entry that may come due (a valid last value with an until, not
	// expired), by key; ramping holds the ramps of parts, by target.
	until   map[string]time.Time
	ramping map[string]*Ramp
	// dirty holds the shards changed since last was built; Snapshot
	// rebuilds them and shares the others with last.
	dirty map[string]struct{}
	last  *Snapshot
}

// part is one shard's share of the mirror.
type part struct {
	entries map[string]*Entry // by key
	ramps   map[string]*Ramp  // by target: "backend/server" or "backend/*"
}

// NewMirror returns an empty mirror that holds no state yet.
func NewMirror() *Mirror {
	return &Mirror{raw: map[string]string{}, parts: map[string]*part{}, dirty: map[string]struct{}{},
		until: map[string]time.Time{}, ramping: map[string]*Ramp{}, level: LevelBase}
}

// entryShard returns the name of the shard that holds a state key.
func entryShard(key string) string { return shardName(strings.TrimPrefix(key, StatePrefix)) }

// entry returns a state key's entry, or nil.
func (m *Mirror) entry(key string) *Entry {
	if p := m.parts[entryShard(key)]; p != nil {
		return p.entries[key]
	}
	return nil
}

// ramp returns the ramp of a target, or nil.
func (m *Mirror) ramp(target string) *Ramp {
	if p := m.parts[shardName(target)]; p != nil {
		return p.ramps[target]
	}
	return nil
}

// edit returns the part called name, created if need be, and marks it as
// changed since the last Snapshot.
func (m *Mirror) edit(name string) *part {
	m.dirty[name] = struct{}{}
	p := m.parts[name]
	if p == nil {
		p = &part{entries: map[string]*Entry{}, ramps: map[string]*Ramp{}}
		m.parts[name] = p
	}
	return p
}

// settle forgets a part that holds nothing any more.
func (m *Mirror) settle(name string) {
	if p := m.parts[name]; len(p.entries) == 0 && len(p.ramps) == 0 {
		delete(m.parts, name)
	}
}

// putEntry makes e the entry of its key.
func (m *Mirror) putEntry(p *part, e *Entry) {
	p.entries[e.Key] = e
	m.noteUntil(e)
}

// noteUntil keeps the until index up to date with e, the key's entry now.
func (m *Mirror) noteUntil(e *Entry) {
	// Last is the zero Value, without an until, when HasLast is false.
	if until := e.Last().Until; !e.Expired && !until.IsZero() {
		m.until[e.Key] = until
	} else {
		delete(m.until, e.Key)
	}
}

func (m *Mirror) deleteEntry(key string) {
	name := entryShard(key)
	delete(m.edit(name).entries, key)
	delete(m.until, key)
	m.settle(name)
}

// putRamp makes r the ramp of its target.
func (m *Mirror) putRamp(r *Ramp) {
	m.edit(shardName(r.Target)).ramps[r.Target] = r
	m.ramping[r.Target] = r
}

func (m *Mirror) deleteRamp(target string) {
	name := shardName(target)
	delete(m.edit(name).ramps, target)
	delete(m.ramping, target)
	m.settle(name)
}

// reindex rebuilds the until and ramping indexes from the parts.
func (m *Mirror) reindex() {
	clear(m.until)
	clear(m.ramping)
	for _, p := range m.parts {
		for _, e := range p.entries {
			m.noteUntil(e)
		}
		for t, r := range p.ramps {
			m.ramping[t] = r
		}
	}
}

// Synced reports whether the mirror holds state: a KV read was applied to it
// or it was restored from a snapshot of a mirror that had one.
func (m *Mirror) Synced() bool { return m.synced }

// Len returns the number of mirrored keys.
func (m *Mirror) Len() int { return len(m.raw) }

// Diff returns the change that turns the mirror's KV content into desired
// (a full read of the prefix, keys relative to it).
func (m *Mirror) Diff(desired map[string]string) Change {
	var c Change
	for k, v := range desired {
		if old, ok := m.raw[k]; !ok || old != v {
			if c.Set == nil {
				// Sized for a first read (everything is new); a later
				// difference usually is a few keys.
				c.Set = make(map[string]string, max(len(desired)-len(m.raw), 1))
			}
			c.Set[k] = v
		}
	}
	for k := range m.raw {
		if _, ok := desired[k]; !ok {
			c.Delete = append(c.Delete, k)
		}
	}
	slices.Sort(c.Delete)
	pairMeta(&c, desired)
	return c
}

// pairMeta sets a state key again, at the value it holds, beside its meta
// key when only the meta key changed: an operator who drains an expired
// drain again writes the same word with a new meta key, and setting the
// state key is what brings an expired key back on every release (0.13.0
// reads no meta key, but un-expires a key that is set).
func pairMeta(c *Change, desired map[string]string) {
	add := func(mk string) {
		sk, ok := StateKeyOf(mk)
		if !ok || !strings.HasPrefix(mk, MetaPrefix) {
			return
		}
		if _, set := c.Set[sk]; set {
			return
		}
		if v, ok := desired[sk]; ok {
			if c.Set == nil {
				c.Set = map[string]string{}
			}
			c.Set[sk] = v
		}
	}
	for k := range c.Set {
		add(k)
	}
	for _, k := range c.Delete {
		add(k)
	}
}

// ErrIndexBehind: a read's Consul index is below the one the mirror holds
// (a restored Consul snapshot, or an answer of a server that lags); it is
// applied only once the reader read again and Consul confirmed it
// (KVRead.Reread).
var ErrIndexBehind = errors.New("the Consul index went below the one the mirror holds: read again to confirm")

// KVRead is one read of the KV prefix, as the leader's Consul watch hands
// it over.
type KVRead struct {
	// Index is Consul's index of the read (X-Consul-Index).
	Index uint64
	// KV is the whole prefix: values by key relative to it, valid during
	// the call it is handed to only (the reader changes it in place).
	KV map[string]string
	// Base, when not 0, is the Index of an earlier read that KV differs
	// from only in Changed: the keys set, added or deleted since.
	Base    uint64
	Changed []string
	// Source is the Consul cluster and prefix the read came from (nil:
	// not known, e.g. a test's read); the raft leader applies a read only
	// from the source recorded with the mirror.
	Source *MirrorSource
	// Reread: the reader read again, consistently, and Consul confirmed
	// an index below the one the mirror holds (a restored snapshot of the
	// same cluster): it may be applied.
	Reread bool
}

// DiffKeys is Diff for a desired content that differs from the mirror's
// only in keys (the caller knows the mirror holds the rest): it costs what
// changed, not the prefix.
func (m *Mirror) DiffKeys(desired map[string]string, keys []string) Change {
	var c Change
	for _, k := range keys {
		v, want := desired[k]
		old, have := m.raw[k]
		switch {
		case want && (!have || old != v):
			if c.Set == nil {
				c.Set = map[string]string{}
			}
			c.Set[k] = v
		case !want && have:
			c.Delete = append(c.Delete, k)
		}
	}
	slices.Sort(c.Delete)
	c.Delete = slices.Compact(c.Delete)
	pairMeta(&c, desired)
	return c
}

// Apply applies a change and marks the mirror as synced. An invalid value
// keeps the key's last valid value. It neither starts nor ends ramps; the
// state machine uses ApplyAt.
func (m *Mirror) Apply(c Change) { m.apply(c, time.Time{}) }

// apply is Apply that also starts a new Since, at, for every key whose last
// valid value changes state (a new reason or an invalid value does not);
// a zero at leaves Since alone.
func (m *Mirror) apply(c Change, at time.Time) {
	// A key both deleted and set is compared with the state it held
	// before the change, not with its absence in between.
	var was map[string]Value
	m.synced = true
	for _, k := range c.Delete {
		if _, ok := c.Set[k]; ok && !at.IsZero() {
			if e := m.entry(k); e != nil && e.HasLast {
				if was == nil {
					was = map[string]Value{}
				}
				was[k] = e.Last()
			}
		}
		delete(m.raw, k)
		m.deleteEntry(k)
	}
	// Meta keys first, so that a state key set in the same change is
	// read with its new meta key.
	var described []string // state keys whose meta key changed
	for _, k := range c.Delete {
		if sk, ok := StateKeyOf(k); ok && strings.HasPrefix(k, MetaPrefix) {
			described = append(described, sk)
		}
	}
	for k, v := range c.Set {
		m.raw[k] = v
		if sk, ok := StateKeyOf(k); ok && strings.HasPrefix(k, MetaPrefix) {
			described = append(described, sk)
		}
	}
	for k, v := range c.Set {
		if !strings.HasPrefix(k, StatePrefix) {
			continue
		}
		p := m.edit(entryShard(k))
		var e *Entry
		if old := p.entries[k]; old != nil {
			// A copy: a snapshot may hold old.
			cp := *old
			e = &cp
		} else {
			e = newEntry(k)
		}
		prev, hadLast := e.Last(), e.HasLast
		if w, ok := was[k]; ok {
			prev, hadLast = w, true
		}
		e.Raw = v
		m.evaluate(e)
		// An invalid value leaves an expiry alone (issue 15.1), from
		// LevelMeta on: release 0.13.0 brings the key back on any value,
		// and every replica of a mixed cluster must do the same.
		if e.Valid() || m.level < LevelMeta {
			e.Expired = false
		}
		if !at.IsZero() && e.HasLast && (!hadLast || !sameState(prev, e.Last())) {
			// No monotonic reading and one location, so that a
			// restored Since compares equal.
			e.Since = at.UTC().Round(0)
		}
		m.putEntry(p, e)
	}
	// A state key whose meta key alone changed keeps its raw value and
	// whether it expired (release 0.13.0, which reads no meta key, does
	// the same): only its additions change. The leader sets the state key
	// again beside a changed meta key (see Diff), which brings an expired
	// key back on every release alike.
	for _, k := range described {
		if _, set := c.Set[k]; set {
			continue
		}
		m.reevaluate(k)
	}
}

// reevaluate reads a state key's entry again with its meta key as the
// mirror holds it now.
func (m *Mirror) reevaluate(key string) {
	p := m.parts[entryShard(key)]
	if p == nil || p.entries[key] == nil {
		return
	}
	p = m.edit(entryShard(key))
	cp := *p.entries[key]
	m.evaluate(&cp)
	m.putEntry(p, &cp)
}

// Level returns the feature level in force.
func (m *Mirror) Level() int { return m.level }

// SetLevel puts a feature level in force (the level entry of the raft
// log): every state key with a meta key is read again under it. A level
// never goes down.
func (m *Mirror) SetLevel(level int) {
	if level <= m.level {
		return
	}
	m.level = level
	for k := range m.raw {
		if sk, ok := StateKeyOf(k); ok && strings.HasPrefix(k, MetaPrefix) {
			m.reevaluate(sk)
		}
	}
}

// sameState reports whether a and b hold the same state, the one
// Value.String names (drain, maint, ready, N%), without building the
// strings.
func sameState(a, b Value) bool {
	if a.WeightSet || b.WeightSet {
		return a.WeightSet == b.WeightSet && a.Weight == b.Weight
	}
	return a.Admin.String() == b.Admin.String()
}

func newEntry(key string) *Entry {
	e := &Entry{Key: key}
	e.Backend, e.Server = splitKey(key)
	return e
}

// splitKey returns the backend and server a state key names, or "", ""
// for a misshapen key (state/x, state/a/b/c, state//x).
func splitKey(key string) (backend, server string) {
	rest := strings.TrimPrefix(key, StatePrefix)
	b, s, ok := strings.Cut(rest, "/")
	if ok && b != "" && s != "" && !strings.Contains(s, "/") {
		return b, s
	}
	return "", ""
}

func keyError(key string) error {
	return fmt.Errorf("%w %q: want %s<backend>/<server> or %s<backend>/%s",
		ErrInvalidKey, cut(key, 80), StatePrefix, StatePrefix, Wildcard)
}

// CheckKV reports why a key under state/ and its value are ignored (the
// key's shape, else the value), or nil when they are valid.
func CheckKV(key, raw string) error {
	if b, _ := splitKey(key); b == "" {
		return keyError(key)
	}
	_, err := ParseValue(raw)
	return err
}

// evaluate parses e.Raw with the key's meta key: Err, the last valid value
// and Note. An invalid raw value keeps the last valid one (read again with
// the meta key as it is now).
func (m *Mirror) evaluate(e *Entry) {
	e.Note = ""
	if e.Backend == "" {
		e.Err = keyError(e.Key).Error()
		return
	}
	v, err := ParseValue(e.Raw)
	if err != nil {
		e.Err = err.Error()
		if !e.HasLast || IsJSONValue(e.LastRaw) {
			return
		}
		if v, err = ParseValue(e.LastRaw); err != nil {
			return
		}
		v, _ = m.withMeta(e.Key, v)
		e.last = unique.Make(v)
		return
	}
	if IsJSONValue(e.Raw) {
		e.Note = NoteJSONState
	} else {
		v, e.Note = m.withMeta(e.Key, v)
	}
	e.Err, e.last, e.LastRaw, e.HasLast = "", unique.Make(v), e.Raw, true
}

// withMeta is the package's withMeta for a state key's meta key as the
// mirror holds it.
func (m *Mirror) withMeta(key string, v Value) (Value, string) {
	mk, _ := MetaKeyOf(key)
	raw, ok := m.raw[mk]
	return withMeta(v, raw, ok, m.level)
}

// Persisted is the mirror's durable form, used by raft snapshots.
type Persisted struct {
	Synced bool              `json:"synced"`
	KV     map[string]string `json:"kv"`
	// LastValid holds, for keys whose current value is invalid, the raw
	// text of the last valid value.
	LastValid map[string]string `json:"last_valid,omitempty"`
	// Ramps are the ramps in progress.
	Ramps []Ramp `json:"ramps,omitempty"`
	// Expired lists the keys the leader expired.
	Expired []string `json:"expired,omitempty"`
	// Since holds each state key's Entry.Since, where known.
	Since map[string]time.Time `json:"since,omitempty"`
	// Level is the feature level in force; 0 (absent: written by
	// release 0.13.0) is LevelBase.
	Level int `json:"level,omitempty"`
}

// Export returns the mirror's durable form.
func (m *Mirror) Export() Persisted {
	p := Persisted{Synced: m.synced, KV: maps.Clone(m.raw)}
	if m.level > LevelBase {
		p.Level = m.level
	}
	if ramps := m.Ramps(); len(ramps) > 0 {
		p.Ramps = ramps
	}
	for _, e := range m.sortedEntries() {
		k := e.Key
		if e.Expired {
			p.Expired = append(p.Expired, k)
		}
		if !e.Since.IsZero() {
			if p.Since == nil {
				p.Since = map[string]time.Time{}
			}
			p.Since[k] = e.Since
		}
		if !e.Valid() && e.HasLast {
			if p.LastValid == nil {
				p.LastValid = map[string]string{}
			}
			p.LastValid[k] = e.LastRaw
		}
	}
	return p
}

// Restore rebuilds a mirror from its durable form.
func Restore(p Persisted) *Mirror {
	m := NewMirror()
	m.level = max(p.Level, LevelBase)
	for k, v := range p.LastValid {
		m.Apply(Change{Set: map[string]string{k: v}})
	}
	m.Apply(Change{Set: p.KV})
	for _, r := range p.Ramps {
		m.putRamp(&r)
	}
	// No snapshot holds the new mirror's entries yet: they are changed in
	// place.
	for _, k := range p.Expired {
		if e := m.entry(k); e != nil {
			e.Expired = true
		}
	}
	for k, t := range p.Since {
		if e := m.entry(k); e != nil {
			e.Since = t
		}
	}
	m.synced = p.Synced
	// The loops above changed entries behind the indexes' back.
	m.reindex()
	return m
}

// sortedEntries returns the state keys' entries, sorted by key.
func (m *Mirror) sortedEntries() []*Entry {
	var out []*Entry
	for _, p := range m.parts {
		for _, e := range p.entries {
			out = append(out, e)
		}
	}
	slices.SortFunc(out, func(a, b *Entry) int { return strings.Compare(a.Key, b.Key) })
	return out
}

// Raw returns the mirrored raw value of a key.
func (m *Mirror) Raw(key string) (string, bool) {
	v, ok := m.raw[key]
	return v, ok
}

// KV returns a copy of the mirrored KV content.
func (m *Mirror) KV() map[string]string { return maps.Clone(m.raw) }
