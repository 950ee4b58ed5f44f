package state

import (
	"maps"
	"slices"
	"strings"
	"time"
)

// Snapshot is an immutable view of the desired state, built by a Mirror
// after each change and swapped atomically by its owner. All methods are
// safe for concurrent use. A nil *Snapshot holds no state: every lookup is
// withheld, so a replica that knows nothing never undoes a drain.
type Snapshot struct {
	exact    map[string][]byte // "backend/server" -> wire line
	wildcard map[string][]byte // backend -> wire line
	entries  []Entry           // sorted by key
	ramps    map[string]Ramp   // by target
}

// Lookup returns the LF-terminated answer line for a request "backend/server"
// (already stripped of its terminator and checked by ParseRequest; i is the
// index of its '/'), or nil when the answer is withheld. The returned slice
// is shared: callers must not modify it. Lookup does not allocate.
func (s *Snapshot) Lookup(req []byte, i int) []byte {
	if s == nil {
		return nil
	}
	if line, ok := s.exact[string(req)]; ok {
		return line
	}
	if line, ok := s.wildcard[string(req[:i])]; ok {
		return line
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
	// Entry is the key's entry when Source is a key.
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
	r := Resolution{Backend: backend, Server: server}
	if s == nil {
		r.Answer, r.Source = Answer{Withheld: true}, SourceNoState
		return r
	}
	exact := StatePrefix + backend + "/" + server
	r.Answer, r.Source = readyFull, SourceAbsent
	for _, key := range []string{exact, StatePrefix + backend + "/" + Wildcard} {
		e := s.entry(key)
		if e != nil && e.Expired {
			if r.Expired == nil {
				r.Expired = e
			}
			continue
		}
		if e != nil {
			r.Answer, r.Source, r.Entry = entryAnswer(e), Source(key), e
			break
		}
	}
	// A ramp sets the weight of a plain ready answer: the server's own
	// ramp, else (when the answer does not come from its own key) the
	// backend wildcard's.
	if r.Answer.Withheld || r.Answer.Admin != Ready || (r.Entry != nil && r.Entry.Last.WeightSet) {
		return r
	}
	rp, ok := s.ramps[backend+"/"+server]
	if !ok && r.Source != Source(exact) {
		rp, ok = s.ramps[backend+"/"+Wildcard]
	}
	if ok {
		r.Answer.Weight, r.Ramp = rp.Weight, &rp
	}
	return r
}

func (s *Snapshot) entry(key string) *Entry {
	i, ok := slices.BinarySearchFunc(s.entries, key, func(e Entry, k string) int {
		switch {
		case e.Key < k:
			return -1
		case e.Key > k:
			return 1
		}
		return 0
	})
	if !ok {
		return nil
	}
	return &s.entries[i]
}

// Entries returns the state keys, sorted by key. The slice is shared.
func (s *Snapshot) Entries() []Entry {
	if s == nil {
		return nil
	}
	return s.entries
}

// Invalid returns the number of state keys whose current value is invalid.
func (s *Snapshot) Invalid() int {
	n := 0
	for i := range s.Entries() {
		if !s.entries[i].Valid() {
			n++
		}
	}
	return n
}

// Ramps returns the ramps in progress, sorted by target.
func (s *Snapshot) Ramps() []Ramp {
	if s == nil {
		return nil
	}
	out := make([]Ramp, 0, len(s.ramps))
	for _, t := range slices.Sorted(maps.Keys(s.ramps)) {
		out = append(out, s.ramps[t])
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
	seen := map[string]bool{}
	var out []Target
	add := func(t string) {
		if t == "" || seen[t] {
			return
		}
		seen[t] = true
		b, srv, _ := strings.Cut(t, "/")
		out = append(out, Target{b, srv})
	}
	for i := range s.entries {
		add(s.entries[i].target())
	}
	for t := range s.ramps {
		add(t)
	}
	slices.SortFunc(out, func(a, b Target) int {
		return strings.Compare(a.Backend+"/"+a.Server, b.Backend+"/"+b.Server)
	})
	return out
}

// Kinds of effective state, as Resolution.Kind names them.
const (
	KindReady    = "ready"    // ready 100% without a ramp: the default
	KindDrain    = "drain"    // drain
	KindMaint    = "maint"    // maint
	KindWeight   = "weight"   // an explicit N%
	KindRamping  = "ramping"  // ready, its weight set by an undrain ramp
	KindWithheld = "withheld" // no answer: invalid key without a last valid value
)

// Kind names the server's effective state: KindDrain, KindMaint,
// KindWeight, KindRamping, KindWithheld, or KindReady for the default
// (ready 100%, no ramp; an explicit "ready" or "100%" key included).
func (r Resolution) Kind() string {
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
