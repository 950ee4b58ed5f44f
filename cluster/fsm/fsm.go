package fsm

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"github.com/hastate/hastate/state"
)

// Command is one raft log entry. Entries are JSON so that a newer binary
// can read what an older one wrote; unknown types are rejected loudly.
type Command struct {
	Type    string       `json:"type"`
	KVIndex uint64       `json:"kv_index,omitempty"`
	Change  state.Change `json:"change"`
	// At is the leader's clock when it wrote the entry; ramps started by
	// the entry start then. Ramp is the policy in force for them.
	At   time.Time        `json:"at,omitempty"`
	Ramp state.RampPolicy `json:"ramp,omitempty"`
	// Steps is the payload of a ramp entry.
	Steps state.RampSteps `json:"steps,omitempty"`
	// Expire lists the keys an expire entry expires (their "until" has
	// passed at At).
	Expire []string `json:"expire,omitempty"`
	// Level is the feature level a level entry puts in force (see
	// state.LevelMeta and leader/gate.go).
	Level int `json:"level,omitempty"`
	// Source is what a source entry records: the Consul cluster and
	// prefix the mirror is tied to (state.LevelRecorded). Adopt: an
	// operator adopted it in place of another (hastate adopt-consul), so
	// the Consul index held is the other cluster's and is forgotten.
	Source *state.MirrorSource `json:"source,omitempty"`
	Adopt  bool                `json:"adopt,omitempty"`
	// HAProxies is the payload of a haproxies entry (state.LevelRecorded):
	// what changed in the record of which HAProxy nodes exist.
	HAProxies *state.HAProxyChange `json:"haproxies,omitempty"`
}

// Entry types. An older binary that meets an unknown type fails the entry
// loudly instead of guessing.
//
// Release 0.13.0 knows kv, ramp and expire; it logs and skips any other
// type. So a new type is written only once every voter advertises a level
// that includes it (leader/gate.go): level, from 0.14.0 on, is written only then.
const (
	CmdKV     = "kv"
	CmdRamp   = "ramp"
	CmdExpire = "expire"
	CmdLevel  = "level"
	// CmdSource (state.LevelRecorded, 0.15.0) records the mirror's
	// Consul cluster and prefix; written only once every voter
	// advertises that level.
	CmdSource = "source"
	// CmdHAProxies records which HAProxy nodes exist (leader/haproxies.go),
	// written only once state.LevelRecorded is in force.
	CmdHAProxies = "haproxies"
)

// ApplyResult is what Apply returns to the leader that wrote the entry.
type ApplyResult struct {
	Events []state.RampEvent // the ramps the entry started and ended
}

// SnapshotVersion is written into every FSM snapshot. Restore accepts this
// version and older ones; bump it when the persisted shape changes and keep
// reading the old shape.
//
// Version 2 added ramps; version 1 snapshots have none and read fine.
// Version 3 added Index; older snapshots restore with Index 0, and the node
// takes the snapshot's raft index instead (see Node.New).
// Version 4 added the expired keys (state.Persisted.Expired) and the
// mirror's since (when each key's state took effect); older snapshots
// restore with since unknown until the key next changes.
// Version 5 added the feature level (state.Persisted.Level). It is written
// only once the level is above state.LevelBase, which happens only once
// every voter understands version 5: until then snapshots are version 4,
// which release 0.13.0 restores. A 0.13.0 replica given a version 5
// snapshot refuses it loudly (its Restore says to upgrade).
//
// Version 6 added the mirror's source (Source: its Consul cluster and
// prefix). A source is recorded only at state.LevelRecorded, which every
// voter understands only once it reads version 6; a mirror without a
// source writes version 5 (or 4), which release 0.14.0 restores.
const (
	SnapshotVersion      = 6
	SnapshotVersionLevel = 5 // what a mirror above state.LevelBase without a source writes
	SnapshotVersionBase  = 4 // what a mirror at state.LevelBase writes
)

type fsmSnapshotData struct {
	Version int    `json:"version"`
	KVIndex uint64 `json:"kv_index"`
	// Index is the raft index of the last entry the mirror holds.
	Index  uint64          `json:"index,omitempty"`
	Mirror state.Persisted `json:"mirror"`
	// Source is the mirror's recorded Consul cluster and prefix (version
	// 6; nil when none is recorded).
	Source *state.MirrorSource `json:"source,omitempty"`
	// HAProxies is the record of which HAProxy nodes exist; present only
	// once state.LevelRecorded is in force (a release before it never
	// restores such a snapshot: the level refuses first).
	HAProxies state.HAProxies `json:"haproxies,omitempty"`
}

// FSM applies committed entries to the mirror and publishes a new immutable
// serving snapshot after each one. Only raft's FSM goroutine writes; the
// leader's diffing reads under mu; the hot path only loads serving.
type FSM struct {
	mu      sync.Mutex
	mirror  *state.Mirror
	kvIndex uint64
	// source is the Consul cluster and prefix recorded with the mirror
	// (nil: none yet); replaced, never modified.
	source *state.MirrorSource
	// kvGen counts the changes to the mirror's KV content (KV entries,
	// restores); digestGen and digestVal cache its digest, asked for by
	// every /v1/cluster and gate poll, for one generation.
	kvGen, digestGen uint64
	digestVal        string
	// index is the raft index of the last entry the mirror holds (the
	// last one applied, or the restored snapshot's). Unlike
	// raft.AppliedIndex, which counts entries handed to the FSM's queue,
	// it moves only once the serving snapshot includes the entry.
	index atomic.Uint64

	// haproxies is the record of which HAProxy nodes exist (haproxies
	// entries); read under mu.
	haproxies state.HAProxies

	serving atomic.Pointer[state.Snapshot]
	o       Options

	// maxLevel is the highest feature level this replica understands
	// (state.MaxLevel; lower only in tests that play an older release).
	maxLevel int
	// stuck, once set, is why this replica met an entry it cannot
	// understand (a type or level of a newer release): the node withholds
	// every answer and fails readiness from then on (withholdNotUnderstood),
	// until it runs a release that understands the entry. Skipping the
	// entry would serve something the other replicas do not. While it is
	// set, Snapshot refuses, so the entry stays in the raft log and is met
	// again after a restart. Read under mu.
	stuck error
}

// Options are what the FSM reports to its node; every field may be nil
// (zero).
type Options struct {
	// MaxLevel is the highest feature level this replica understands (0:
	// state.MaxLevel; lower in tests that play an older release).
	MaxLevel int
	// Stepped is called with the number of ramp steps applied.
	Stepped func(int)
	// Lag is called with the time from the leader writing an entry to this
	// replica applying it.
	Lag func(time.Duration)
	// Rejected is called for every entry Apply skips or applies only in
	// part.
	Rejected func(error)
	// Large is called after a restore or an entry that changed at least
	// LargeChange keys (the node then returns memory to the OS).
	Large func()
	// Advanced is called after the index moved (the confirmation loop
	// waits on it).
	Advanced func()
	// NotUnderstood is called once, with the reason, when the replica
	// meets an entry it does not understand.
	NotUnderstood func(error)
}

// LargeChange is the number of keys an entry sets or deletes from which
// Options.Large is called after it is applied.
const LargeChange = 5000

// New returns an FSM that holds no state.
func New(o Options) *FSM {
	f := &FSM{mirror: state.NewMirror(), maxLevel: state.MaxLevel, haproxies: state.HAProxies{}, o: o}
	if o.MaxLevel > 0 {
		f.maxLevel = min(o.MaxLevel, state.MaxLevel)
	}
	return f
}

// Index is the raft index of the last entry the serving snapshot holds.
func (f *FSM) Index() uint64 { return f.index.Load() }

// StartIndex sets the index, while none is known, to the raft index of
// the snapshot the node started from (a snapshot older than version 3 does
// not carry it).
func (f *FSM) StartIndex(i uint64) { f.index.CompareAndSwap(0, i) }

// Serving is the serving snapshot (nil while the FSM holds no state). It
// never blocks.
func (f *FSM) Serving() *state.Snapshot { return f.serving.Load() }

// MaxLevel is the highest feature level this replica understands.
func (f *FSM) MaxLevel() int { return f.maxLevel }

// NotUnderstood returns why the replica withholds every answer, or nil.
func (f *FSM) NotUnderstood() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.stuck
}

// Level returns the feature level in force.
func (f *FSM) Level() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.mirror.Level()
}

// stop records an entry this replica cannot understand and withholds
// every answer from now on.
func (f *FSM) stop(index uint64, err error) error {
	err = f.reject(index, err)
	f.mu.Lock()
	first := f.stuck == nil
	if first {
		f.stuck = err
	}
	f.mu.Unlock()
	if first && f.o.NotUnderstood != nil {
		f.o.NotUnderstood(err)
	}
	return err
}

// Ramps returns the ramps in progress.
func (f *FSM) Ramps() []state.Ramp {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.mirror.Ramps()
}

var _ raft.FSM = (*FSM)(nil)

// Apply is total: no committed entry can crash a replica, since every
// replica would crash again on it when it replays its log. An entry that
// cannot be decoded, has an unknown type, or panics while applied is
// reported (logged and counted) and skipped; an entry whose ramp policy is
// invalid (written by an older leader that did not validate it) is applied
// with ramps off. All of this depends on the entry alone, so every replica
// does the same.
func (f *FSM) Apply(l *raft.Log) any {
	defer f.advance(l.Index)
	if l.Type != raft.LogCommand {
		return nil
	}
	var c Command
	if err := json.Unmarshal(l.Data, &c); err != nil {
		return f.reject(l.Index, fmt.Errorf("undecodable entry: %w", err))
	}
	if f.o.Lag != nil && !c.At.IsZero() {
		// Observed once the entry is applied and served (deferred calls
		// run last first: after the switch below, before advance).
		defer func() { f.o.Lag(time.Since(c.At)) }()
	}
	switch c.Type {
	case CmdKV:
		policy := c.Ramp
		if err := policy.Validate(); err != nil && policy != (state.RampPolicy{}) {
			f.reject(l.Index, fmt.Errorf("%w; the change is applied without ramps", err))
			policy = state.RampPolicy{}
		}
		if f.o.Large != nil && len(c.Change.Set)+len(c.Change.Delete) >= LargeChange {
			defer f.o.Large()
		}
		return f.mutate(l.Index, func(m *state.Mirror) []state.RampEvent {
			events := m.ApplyAt(c.Change, c.At, policy)
			f.kvIndex = c.KVIndex
			f.kvGen++
			return events
		})
	case CmdExpire:
		policy := c.Ramp
		if err := policy.Validate(); err != nil && policy != (state.RampPolicy{}) {
			f.reject(l.Index, fmt.Errorf("%w; the keys expire without ramps", err))
			policy = state.RampPolicy{}
		}
		return f.mutate(l.Index, func(m *state.Mirror) []state.RampEvent { return m.Expire(c.Expire, c.At, policy) })
	case CmdRamp:
		res := f.mutate(l.Index, func(m *state.Mirror) []state.RampEvent { return m.ApplySteps(c.Steps) })
		if f.o.Stepped != nil {
			f.o.Stepped(len(c.Steps.Weights) + len(c.Steps.Done))
		}
		return res
	case CmdLevel:
		if c.Level > f.maxLevel {
			return f.stop(l.Index, fmt.Errorf("feature level %d is above this release's %d (written by a newer hastate): "+
				"this replica withholds every answer until it runs that release; upgrade it", c.Level, f.maxLevel))
		}
		return f.mutate(l.Index, func(m *state.Mirror) []state.RampEvent {
			m.SetLevel(c.Level)
			return nil
		})
	case CmdSource:
		if c.Source == nil {
			return f.reject(l.Index, errors.New("a source entry without a source; skipped"))
		}
		return f.mutate(l.Index, func(*state.Mirror) []state.RampEvent {
			src := *c.Source
			f.source = &src
			if c.Adopt {
				// The index held is the other cluster's: the adopted
				// one's reads are compared from scratch.
				f.kvIndex = 0
			}
			return nil
		})
	case CmdHAProxies:
		if c.HAProxies == nil {
			return f.reject(l.Index, errors.New("haproxies entry without its change; skipped"))
		}
		f.mu.Lock()
		f.haproxies.Apply(*c.HAProxies)
		f.mu.Unlock()
		return nil
	default:
		return f.stop(l.Index, fmt.Errorf("unknown type %q (written by a newer hastate): this replica withholds every answer until it runs that release; upgrade it", c.Type))
	}
}

// mutate runs apply on the mirror under the lock and publishes the result.
// A panic in apply is reported instead of crashing the replica; what the
// mirror holds then is still published, rebuilt in full (the mirror may
// have changed where it had not yet noted it), so serving matches the
// mirror.
func (f *FSM) mutate(index uint64, apply func(*state.Mirror) []state.RampEvent) (res any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	defer func() {
		if r := recover(); r != nil {
			f.publishFullLocked()
			res = f.reject(index, fmt.Errorf("panic while applying: %v\n%s", r, debug.Stack()))
		}
	}()
	events := apply(f.mirror)
	f.publishLocked()
	return ApplyResult{Events: events}
}

// reject reports an entry the FSM cannot apply as it stands and returns the
// error for the leader that wrote it.
func (f *FSM) reject(index uint64, err error) error {
	err = fmt.Errorf("raft entry %d: %w", index, err)
	if f.o.Rejected != nil {
		f.o.Rejected(err)
	}
	return err
}

// advance records that the mirror holds the entries up to i.
func (f *FSM) advance(i uint64) {
	// Only raft's FSM goroutine writes, apart from StartIndex's one
	// compare-and-swap from 0 to the startup snapshot's index, which every
	// later entry exceeds.
	if i > f.index.Load() {
		f.index.Store(i)
		if f.o.Advanced != nil {
			f.o.Advanced()
		}
	}
}

// publishLocked swaps in the serving snapshot of the mirror. The mirror
// rebuilds only the backends the last entry touched (see state.Mirror.Snapshot).
func (f *FSM) publishLocked() {
	if f.mirror.Synced() {
		f.serving.Store(f.mirror.Snapshot())
	} else {
		f.serving.Store(nil)
	}
}

// publishFullLocked is publishLocked with every backend rebuilt.
func (f *FSM) publishFullLocked() {
	if f.mirror.Synced() {
		f.serving.Store(f.mirror.RebuildSnapshot())
	} else {
		f.serving.Store(nil)
	}
}

// Diff returns the change that turns the mirror into kv, the values the
// changed keys hold now (absent keys are missing), and whether the mirror
// already holds state.
func (f *FSM) Diff(r state.KVRead) (c state.Change, old map[string]string, synced bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r.Base != 0 && r.Base == f.kvIndex {
		// The mirror holds the read at Base: only Changed can differ.
		c = f.mirror.DiffKeys(r.KV, r.Changed)
	} else {
		c = f.mirror.Diff(r.KV)
	}
	old = make(map[string]string, len(c.Set)+len(c.Delete))
	for k := range c.Set {
		if v, ok := f.mirror.Raw(k); ok {
			old[k] = v
		}
	}
	for _, k := range c.Delete {
		old[k], _ = f.mirror.Raw(k)
	}
	return c, old, f.mirror.Synced()
}

// Recorded returns the mirror's recorded source (nil: none) and the
// Consul index the mirror holds.
func (f *FSM) Recorded() (*state.MirrorSource, uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.source, f.kvIndex
}

func (f *FSM) Info() (kvIndex uint64, keys int, synced bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.kvIndex, f.mirror.Len(), f.mirror.Synced()
}

// Due returns the keys to expire at now and the raw value of key.
func (f *FSM) Due(now time.Time, key string) ([]string, string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	raw, ok := f.mirror.Raw(key)
	return f.mirror.Due(now), raw, ok
}

// HAProxies returns a copy of the record of which HAProxy nodes
// exist.
func (f *FSM) HAProxies() state.HAProxies {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.haproxies.Clone()
}

func (f *FSM) HAProxiesLen() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.haproxies)
}

// Digest is state.Digest of the mirrored KV content.
func (f *FSM) Digest() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.digestVal == "" || f.digestGen != f.kvGen {
		f.digestVal, f.digestGen = f.mirror.Digest(), f.kvGen
	}
	return f.digestVal
}

func (f *FSM) KV() map[string]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.mirror.KV()
}

// errStuckNoSnapshot wraps fsm.stuck when raft asks for a snapshot.
var errStuckNoSnapshot = errors.New("no snapshot is taken while a raft entry is not understood: the log keeps that entry, so that a release that understands it replays it (and this one meets it again after a restart)")

// Snapshot refuses while the replica is stuck (fsm.stuck): a snapshot then
// would hold a state that skipped the entry, and raft would drop the entry
// from the log. Restarted from it, this release would answer again, and an
// upgraded one could never apply the entry; with no snapshot past it, both
// replay it from the log (restored from the last snapshot before it, or
// from an empty state), this one withholds again, and the upgraded one
// applies it and answers. There is thus no stuck snapshot for a release,
// this one or an older one, to read. Raft logs the refusal and tries again
// at its next snapshot interval; the log grows until the replica is
// upgraded.
func (f *FSM) Snapshot() (raft.FSMSnapshot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stuck != nil {
		return nil, fmt.Errorf("%w: %v", errStuckNoSnapshot, f.stuck)
	}
	version := SnapshotVersionBase
	switch {
	case f.source != nil || len(f.haproxies) > 0:
		version = SnapshotVersion
	case f.mirror.Level() > state.LevelBase:
		version = SnapshotVersionLevel
	}
	d := fsmSnapshotData{Version: version, KVIndex: f.kvIndex, Index: f.index.Load(), Mirror: f.mirror.Export(), Source: f.source}
	if len(f.haproxies) > 0 {
		d.HAProxies = f.haproxies.Clone()
	}
	return &fsmSnapshot{data: d}, nil
}

func (f *FSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	var d fsmSnapshotData
	if err := json.NewDecoder(rc).Decode(&d); err != nil {
		return fmt.Errorf("restore snapshot: %w", err)
	}
	if d.Version > SnapshotVersion {
		return fmt.Errorf("restore snapshot: version %d is newer than this binary's %d: upgrade hastate", d.Version, SnapshotVersion)
	}
	if d.Mirror.Level > f.maxLevel {
		return fmt.Errorf("restore snapshot: feature level %d is above this binary's %d: upgrade hastate", d.Mirror.Level, f.maxLevel)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mirror = state.Restore(d.Mirror)
	f.haproxies = d.HAProxies
	if f.haproxies == nil {
		f.haproxies = state.HAProxies{}
	}
	f.kvIndex = d.KVIndex
	f.source = d.Source
	f.kvGen++
	if f.o.Large != nil {
		defer f.o.Large()
	}
	f.publishLocked()
	f.index.Store(d.Index) // after the snapshot that holds it is served
	if f.o.Advanced != nil {
		f.o.Advanced()
	}
	return nil
}

type fsmSnapshot struct{ data fsmSnapshotData }

func (s *fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	if err := json.NewEncoder(sink).Encode(s.data); err != nil {
		_ = sink.Cancel()
		return fmt.Errorf("persist snapshot: %w", err)
	}
	return sink.Close()
}

func (s *fsmSnapshot) Release() {}

// Raw is the mirrored value of key (relative to the prefix).
func (f *FSM) Raw(key string) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.mirror.Raw(key)
}
