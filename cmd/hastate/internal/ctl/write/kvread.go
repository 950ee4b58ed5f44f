package write

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	consul "github.com/hashicorp/consul/api"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl"
	"github.com/hastate/hastate/state"
)

// What a write decides, it decides from Consul (DESIGN.md, Operator
// commands): which state keys exist, which backend-wide keys cover a
// server, what they hold. KVRead is that read, made in Consul's consistent
// mode (never a stale or default-mode answer, which can be empty right
// after a Consul restart), and the transaction is conditional on every key
// of it that the plan used (see Writer.Apply).

// Coverage is where a server's state comes from in Consul.
type Coverage int

const (
	// CoverAbsent: neither the server nor its backend has a key: ready.
	CoverAbsent Coverage = iota
	// CoverBackend: the backend-wide key <backend>/* covers the server.
	CoverBackend
	// CoverOwn: the server has a key of its own.
	CoverOwn
)

func (c Coverage) String() string {
	switch c {
	case CoverOwn:
		return "own key"
	case CoverBackend:
		return "backend-wide key"
	}
	return "absent"
}

// KVKey is one state key as a consistent read of Consul found it.
type KVKey struct {
	Key     string
	Present bool
	Value   string // the raw value, when Present
	Index   uint64 // its ModifyIndex, when Present
}

// parsed is the key's value; ok is false for an absent key or an invalid
// value.
func (k KVKey) parsed() (state.Value, bool) {
	if !k.Present {
		return state.Value{}, false
	}
	v, err := state.ParseValue(k.Value)
	return v, err == nil
}

// short is the value as status shows it ("drain", "50%", "an invalid
// value").
func (k KVKey) short() string {
	if v, ok := k.parsed(); ok {
		return v.String()
	}
	return "an invalid value"
}

// KVRead holds what consistent reads of Consul found: single keys and
// whole backends. A planner asks it, and says what it lacks (kvNeeds).
type KVRead struct {
	Prefix string
	keys   map[string]KVKey // state key -> what was read; absent keys too
	full   map[string]bool  // backends read whole: a key not in keys is absent
	// backends are the backends with keys, once wasListed.
	backends  []string
	wasListed bool
}

// NewKVRead returns an empty read for prefix.
func NewKVRead(prefix string) *KVRead {
	return &KVRead{Prefix: prefix, keys: map[string]KVKey{}, full: map[string]bool{}}
}

// key returns what was read for backend/server, and whether it was read.
func (r *KVRead) key(backend, server string) (KVKey, bool) {
	k := ctl.Key(r.Prefix, backend, server)
	if got, ok := r.keys[k]; ok {
		return got, true
	}
	if r.full[backend] {
		return KVKey{Key: k}, true
	}
	return KVKey{Key: k}, false
}

// ownKeys returns the present server keys (not "*") of a backend read
// whole, by server name.
func (r *KVRead) ownKeys(backend string) map[string]KVKey {
	out := map[string]KVKey{}
	dir := r.Prefix + state.StatePrefix + backend + "/"
	for k, v := range r.keys {
		if srv, ok := strings.CutPrefix(k, dir); ok && v.Present && srv != state.Wildcard && !strings.Contains(srv, "/") {
			out[srv] = v
		}
	}
	return out
}

// covers reports whether a backend-wide key holds something other than
// ready (a ready backend-wide key means what no key means, with a ramp in
// its meta key too: what it ramps is its servers' undrain, and a server
// readied under it follows it again; issue 27.2).
func covers(w KVKey) bool {
	if !w.Present {
		return false
	}
	v, ok := w.parsed()
	return !ok || v.Admin != state.Ready || v.WeightSet
}

// ServerKeys are the two keys a server's state can come from, as Consul
// holds them: its own and its backend's backend-wide key.
type ServerKeys struct {
	Own, Backend KVKey
}

// Coverage is where the server's state comes from: its own key wins over
// the backend-wide key, which wins over none.
func (k ServerKeys) Coverage() Coverage {
	switch {
	case k.Own.Present:
		return CoverOwn
	case covers(k.Backend):
		return CoverBackend
	}
	return CoverAbsent
}

// UnderBackend reports whether a backend-wide key holds something for the
// server's backend (not ready): without its own key the server follows it.
func (k ServerKeys) UnderBackend() bool { return covers(k.Backend) }

// kvNeeds is what a plan needs read from Consul before it can decide.
type kvNeeds struct {
	backends map[string]bool // read whole
	keys     map[string]bool // state keys
	list     bool            // the backends that have keys
}

func (n *kvNeeds) any() bool { return n != nil && (len(n.backends) > 0 || len(n.keys) > 0 || n.list) }

// maxSingleReads is how many single keys of one backend are read one by
// one before the backend is listed whole instead.
const maxSingleReads = 8

// Read reads what needs lacks, consistently.
func (w Writer) Read(ctx context.Context, r *KVRead, needs *kvNeeds) error {
	if needs == nil {
		return nil
	}
	perBackend := map[string]int{}
	for k := range needs.keys {
		perBackend[backendOf(r.Prefix, k)]++
	}
	for b, n := range perBackend {
		if n > maxSingleReads {
			needs.backends[b] = true
		}
	}
	q := func() *consul.QueryOptions { return (&consul.QueryOptions{RequireConsistent: true}).WithContext(ctx) }
	if needs.list {
		dirs, _, err := w.Client.KV().Keys(r.Prefix+state.StatePrefix, "/", q())
		if err != nil {
			return ctl.ConsulError(ctx, w.Addr, err, "nothing was written")
		}
		r.backends = nil
		for _, d := range dirs {
			if b, ok := strings.CutSuffix(strings.TrimPrefix(d, r.Prefix+state.StatePrefix), "/"); ok && b != "" {
				r.backends = append(r.backends, b)
			}
		}
		slices.Sort(r.backends)
		r.wasListed = true
	}
	for _, b := range slices.Sorted(maps.Keys(needs.backends)) {
		pairs, _, err := w.Client.KV().List(r.Prefix+state.StatePrefix+b+"/", q())
		if err != nil {
			return ctl.ConsulError(ctx, w.Addr, err, "nothing was written")
		}
		for _, p := range pairs {
			r.keys[p.Key] = KVKey{Key: p.Key, Present: true, Value: string(p.Value), Index: p.ModifyIndex}
		}
		r.full[b] = true
	}
	for _, k := range slices.Sorted(maps.Keys(needs.keys)) {
		if r.full[backendOf(r.Prefix, k)] {
			continue
		}
		p, _, err := w.Client.KV().Get(k, q())
		if err != nil {
			return ctl.ConsulError(ctx, w.Addr, err, "nothing was written")
		}
		got := KVKey{Key: k}
		if p != nil {
			got = KVKey{Key: k, Present: true, Value: string(p.Value), Index: p.ModifyIndex}
		}
		r.keys[k] = got
	}
	return nil
}

func backendOf(prefix, key string) string {
	b, _, _ := strings.Cut(strings.TrimPrefix(key, prefix+state.StatePrefix), "/")
	return b
}

// changed reports whether any of the keys the plan depended on is not
// what r read: a concurrent write. It reads them again, consistently.
func (w Writer) changed(ctx context.Context, deps []KVKey) (bool, error) {
	for _, d := range deps {
		p, _, err := w.Client.KV().Get(d.Key, (&consul.QueryOptions{RequireConsistent: true}).WithContext(ctx))
		if err != nil {
			return false, ctl.ConsulError(ctx, w.Addr, err, "nothing was written")
		}
		switch {
		case p == nil && d.Present, p != nil && !d.Present:
			return true, nil
		case p != nil && p.ModifyIndex != d.Index:
			return true, nil
		}
	}
	return false, nil
}

// String names the key for messages.
func (k KVKey) String() string {
	if !k.Present {
		return fmt.Sprintf("%s (absent)", k.Key)
	}
	return fmt.Sprintf("%s = %s (index %d)", k.Key, k.short(), k.Index)
}

// listed reports whether the backends with keys were read.
func (r *KVRead) listed() bool { return r.wasListed }
