package state

import (
	"hash/maphash"
	"maps"
	"slices"
	"strings"
	"time"
)

// Snapshot is an immutable view of the desired state, built by a Mirror
// after each change and swapped atomically by its owner. All methods are
// safe for concurrent use. A nil *Snapshot holds no state: every lookup is
// withheld, so a replica that knows nothing never undoes a drain.
//
// It is sharded by backend so that a change costs what it touches: a
// shard holds one backend's keys, ramps and precomputed wire lines, and
// the next snapshot shares every shard the change did not touch. Shards
// sit in a fixed number of groups (maps by backend name, picked by a hash
// of it), so a new snapshot copies the group array and the groups it
// touches, never a map of the whole fleet.
type Snapshot struct {
	seed   maphash.Seed
	groups [snapshotGroups]map[string]*shard // shard name -> shard
	// Totals over the shards, kept as shards are swapped.
	entries, invalid, ramps int
}

// snapshotGroups is the number of shard groups; a power of two.
const snapshotGroups = 256

// shard is one backend's part of a Snapshot. Its name is what precedes the
// first '/' of its keys (after StatePrefix) and of its ramp targets: the
// backend of every valid key, so one shard answers every server of one
// backend. A misshapen key (state/x, state/a/b/c) lives in the shard its
// text names and only shows in Entries and Resolve.
type shard struct {
	exact    map[string]*[]byte // server -> wire line (Answer.lineRef)
	wildcard []byte             // the backend wildcard's line (nil: withheld)
	hasWild  bool               // whether the backend has a wildcard line
	entries  []*Entry           // sorted by key; shared with the mirror
	ramps    map[string]Ramp    // by target
	invalid  int                // entries whose current value is invalid
}

// emptyShard stands for a backend without keys or ramps.
var emptyShard = &shard{}

// group returns the group index of a shard name.
func (s *Snapshot) group(name []byte) int {
	return int(maphash.Bytes(s.seed, name) & (snapshotGroups - 1))
}

// shard returns the shard called name, or emptyShard.
func (s *Snapshot) shard(name string) *shard {
	g := int(maphash.String(s.seed, name) & (snapshotGroups - 1))
	if sh := s.groups[g][name]; sh != nil {
		return sh
	}
	return emptyShard
}

// shardName returns the name of the shard that holds a key relative to
// StatePrefix ("web/a") or a ramp target ("web/a", "web/*").
func shardName(rest string) string {
	name, _, _ := strings.Cut(rest, "/")
	return name
}

// Lookup returns the LF-terminated answer line for a request "backend/server"
// (already stripped of its terminator and checked by ParseRequest; i is the
// index of its '/'), or nil when the answer is withheld. The returned slice
// is shared: callers must not modify it. Lookup does not allocate.
func (s *Snapshot) Lookup(req []byte, i int) []byte {
	if s == nil {
		return nil
	}
	backend := req[:i]
	sh, ok := s.groups[s.group(backend)][string(backend)]
	if !ok {
		return lineReady[100]
	}
	if line, ok := sh.exact[string(req[i+1:])]; ok {
		return *line
	}
	if sh.hasWild {
		return sh.wildcard
	}
	return lineReady[100]
}

// Source is where an answer comes from.
type Source string

// The kinds of source besides a key.
const (
	SourceAbsent  Source = "absent"   // no key: ready 100%
	SourceNoState Source = "no-state" // the replica holds no state yet
)

// Resolution explains the answer for one server.
type Resolution struct {
	Backend string
	Server  string
	Answer  Answer
	// Source is the relative KV key the answer comes from, or SourceAbsent.
	Source Source
	// Entry is the key's entry when Source is a key. It is the snapshot's
	// own (shared, like Expired): read it, do not modify it.
	Entry *Entry
	// Ramp is the ramp that sets the weight, if one does.
	Ramp *Ramp
	// Expired is the expired key skipped on the way (the server's own, or
	// its backend's), if any: status shows it as expired.
	Expired *Entry
}

// Resolve returns the answer for a server with its provenance, applying the
// precedence exact key > backend wildcard > absent (ready 100%).
func (s *Snapshot) Resolve(backend, server string) Resolution {
	if s == nil {
		return Resolution{Backend: backend, Server: server, Answer: Answer{Withheld: true}, Source: SourceNoState}
	}
	// The server's key, its backend's wildcard and both ramps all live
	// in the shard named by the backend's text up to any '/'.
	return s.shard(shardName(backend)).resolve(backend, server)
}

// resolve is Resolve within the shard that holds backend's keys and ramps.
func (sh *shard) resolve(backend, server string) Resolution {
	r := Resolution{Backend: backend, Server: server, Answer: readyFull, Source: SourceAbsent}
	if len(sh.entries) == 0 && len(sh.ramps) == 0 {
		return r // no key and no ramp (a server known only by its polls): nothing to look up
	}
	e, expired := pick(sh.entry, backend, server)
	r.Expired = expired
	if e != nil {
		r.Answer, r.Source, r.Entry = entryAnswer(e), Source(e.Key), e
	}
	// A ramp sets the weight of a plain ready answer: the server's own
	// ramp, else (when the answer does not come from its own key) the
	// backend wildcard's.
	if r.Answer.Withheld || r.Answer.Admin != Ready || (r.Entry != nil && r.Entry.Last().WeightSet) {
		return r
	}
	rp, ok := sh.ramps[backend+"/"+server]
	if !ok && (e == nil || e.Server != server) {
		rp, ok = sh.ramps[backend+"/"+Wildcard]
	}
	if ok {
		r.Answer.Weight, r.Ramp = rp.Weight, &rp
	}
	return r
}

// pick is the precedence rule, the one place it is written (the
// snapshot's answers and the leader's ramp decisions both use it): the
// target's own key, else, for a server, its backend's wildcard, else none
// (absent: ready 100%). An expired key counts as absent; expired is the
// first one passed over.
func pick(entry func(key string) *Entry, backend, server string) (e, expired *Entry) {
	keys := [2]string{StatePrefix + backend + "/" + server, StatePrefix + backend + "/" + Wildcard}
	n := len(keys)
	if server == Wildcard {
		n = 1
	}
	for _, k := range keys[:n] {
		switch e := entry(k); {
		case e == nil:
		case e.Expired:
			if expired == nil {
				expired = e
			}
		default:
			return e, expired
		}
	}
	return nil, expired
}

func (sh *shard) entry(key string) *Entry {
	i, ok := slices.BinarySearchFunc(sh.entries, key, func(e *Entry, k string) int { return strings.Compare(e.Key, k) })
	if !ok {
		return nil
	}
	return sh.entries[i]
}

// shards returns the shards in key order: by name followed by '/', which
// is the order of their keys "state/<name>/...".
func (s *Snapshot) shards() []*shard {
	var names []string
	for g := range s.groups {
		for name := range s.groups[g] {
			names = append(names, name)
		}
	}
	slices.SortFunc(names, func(a, b string) int { return strings.Compare(a+"/", b+"/") })
	out := make([]*shard, len(names))
	for i, name := range names {
		out[i] = s.shard(name)
	}
	return out
}

// Entries returns copies of the state keys' entries, sorted by key. It
// gathers them from every shard into a new slice: it is for status and
// tests, not the hot path.
func (s *Snapshot) Entries() []Entry {
	if s == nil {
		return nil
	}
	out := make([]Entry, 0, s.entries)
	for _, sh := range s.shards() {
		for _, e := range sh.entries {
			out = append(out, *e)
		}
	}
	// Shards come in key order, unless a misshapen key without a '/'
	// (state/web) meets a backend that extends its name (state/web-2/a).
	byKey := func(a, b Entry) int { return strings.Compare(a.Key, b.Key) }
	if !slices.IsSortedFunc(out, byKey) {
		slices.SortFunc(out, byKey)
	}
	return out
}

// Len returns the number of state keys.
func (s *Snapshot) Len() int {
	if s == nil {
		return 0
	}
	return s.entries
}

// Invalid returns the number of state keys whose current value is invalid.
func (s *Snapshot) Invalid() int {
	if s == nil {
		return 0
	}
	return s.invalid
}

// Ramps returns the ramps in progress, sorted by target.
func (s *Snapshot) Ramps() []Ramp {
	if s == nil {
		return nil
	}
	out := make([]Ramp, 0, s.ramps)
	for _, sh := range s.shards() {
		for _, t := range slices.Sorted(maps.Keys(sh.ramps)) {
			out = append(out, sh.ramps[t])
		}
	}
	byTarget := func(a, b Ramp) int { return strings.Compare(a.Target, b.Target) }
	if !slices.IsSortedFunc(out, byTarget) {
		slices.SortFunc(out, byTarget)
	}
	return out
}

// Target is a backend/server (or backend/*) the snapshot knows: a key's or
// a ramp's.
type Target struct{ Backend, Server string }

// Targets returns every server and backend wildcard that has a key or a
// ramp, sorted.
func (s *Snapshot) Targets() []Target {
	if s == nil {
		return nil
	}
	type sortable struct {
		key string // Backend + "/" + Server
		t   Target
	}
	var all []sortable
	for _, sh := range s.shards() {
		// A target lives in one shard only: no need to look further.
		seen := make(map[string]bool, len(sh.entries)+len(sh.ramps))
		add := func(t string) {
			if t == "" || seen[t] {
				return
			}
			seen[t] = true
			b, srv, _ := strings.Cut(t, "/")
			all = append(all, sortable{b + "/" + srv, Target{b, srv}})
		}
		for i := range sh.entries {
			add(sh.entries[i].target())
		}
		for t := range sh.ramps {
			add(t)
		}
	}
	if len(all) == 0 {
		return nil
	}
	slices.SortFunc(all, func(a, b sortable) int { return strings.Compare(a.key, b.key) })
	out := make([]Target, len(all))
	for i := range all {
		out[i] = all[i].t
	}
	return out
}

// Kind is a kind of effective state, as Resolution.Kind names it. api.Kind
// is its wire form (api imports no hastate package; see there).
type Kind string

// The kinds of effective state.
const (
	KindReady    Kind = "ready"    // ready 100% without a ramp: the default
	KindDrain    Kind = "drain"    // drain
	KindMaint    Kind = "maint"    // maint
	KindWeight   Kind = "weight"   // an explicit N%
	KindRamping  Kind = "ramping"  // ready, its weight set by an undrain ramp
	KindWithheld Kind = "withheld" // no answer: invalid key without a last valid value
)

// Kind names the server's effective state: KindDrain, KindMaint,
// KindWeight, KindRamping, KindWithheld, or KindReady for the default
// (ready 100%, no ramp; an explicit "ready" or "100%" key included).
func (r Resolution) Kind() Kind {
	a := r.Answer
	switch {
	case a.Withheld:
		return KindWithheld
	case a.Admin == Drain:
		return KindDrain
	case a.Admin == Maint:
		return KindMaint
	case r.Ramp != nil:
		return KindRamping
	case a.Weight != 100:
		return KindWeight
	}
	return KindReady
}

// Since is when the server's effective state took effect, on the leader's
// clock: a ramp's start for a ramping server, else its key's Entry.Since.
// Zero when not known: no key (the default), or a key restored from a
// snapshot written before hastate recorded it.
func (r Resolution) Since() time.Time {
	if r.Ramp != nil {
		return r.Ramp.Started
	}
	if r.Entry != nil {
		return r.Entry.Since
	}
	return time.Time{}
}

// Changed is when the server's answer last changed, as far as the
// snapshot knows, on the leader's clock: Since, or, when the answer is
// what an expired key gave way to, that key's until if it is later (the
// leader expires a key once its until has passed, so this is at most a
// tick early). A ramp's steps change only the weight: a ramping server's
// Changed is its ramp's start. Zero when not known: the default ready
// 100% after a key was deleted or when none was ever set.
func (r Resolution) Changed() time.Time {
	t := r.Since()
	if r.Expired != nil {
		if u := r.Expired.Last().Until; u.After(t) {
			t = u
		}
	}
	return t
}
