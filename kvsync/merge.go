package kvsync

// This file merges a listing with the read the Sink holds: both are in key
// order, so a read is one pass that yields the edits (keys set, added,
// deleted) that make the held read the new one, allocating only what
// differs.

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"slices"
)

// held is the read the Sink accepted last: its map, which the Watcher hands
// the Sink and keeps, and the same content as keys in order with their
// values, which the next read is merged with.
type held struct {
	kv   map[string]string
	keys []string // sorted
	vals []string // vals[i] is the value of keys[i]
}

// edit is one difference of a read from the held one.
type edit struct {
	at       int // index in the held keys: of the key, or where it goes
	key, val string
	op       editOp
}

type editOp uint8

const (
	editSet editOp = iota // a held key has a new value
	editAdd               // a key the held read does not have
	editDel               // a held key is gone
)

// setMap applies edits to h's map.
func (h *held) setMap(edits []edit) {
	for _, e := range edits {
		if e.op == editDel {
			delete(h.kv, e.key)
		} else {
			h.kv[e.key] = e.val
		}
	}
}

// setKeys applies edits, in key order as mergeListing returns them, to h's
// keys and values: in place for new values and a few keys added or
// deleted, in one new pass for many.
func (h *held) setKeys(edits []edit) {
	moves := 0
	for _, e := range edits {
		if e.op != editSet {
			moves++
		}
	}
	if moves > 16 {
		keys := make([]string, 0, len(h.keys)+moves)
		vals := make([]string, 0, len(h.keys)+moves)
		i := 0
		for _, e := range edits {
			keys, vals = append(keys, h.keys[i:e.at]...), append(vals, h.vals[i:e.at]...)
			i = e.at
			switch e.op {
			case editSet:
				keys, vals = append(keys, e.key), append(vals, e.val)
				i++
			case editAdd:
				keys, vals = append(keys, e.key), append(vals, e.val)
			case editDel:
				i++
			}
		}
		h.keys, h.vals = append(keys, h.keys[i:]...), append(vals, h.vals[i:]...)
		return
	}
	// Last first, so that the positions of the earlier edits hold.
	for k := len(edits) - 1; k >= 0; k-- {
		switch e := edits[k]; e.op {
		case editSet:
			h.vals[e.at] = e.val
		case editAdd:
			h.keys, h.vals = slices.Insert(h.keys, e.at, e.key), slices.Insert(h.vals, e.at, e.val)
		case editDel:
			h.keys, h.vals = slices.Delete(h.keys, e.at, e.at+1), slices.Delete(h.vals, e.at, e.at+1)
		}
	}
}

// listing is one read of the prefix.
type listing struct {
	count int // keys under the prefix: not the prefix itself, not a folder
	// unchanged: the read holds exactly what the Sink last accepted. Only
	// a read compared with a held one can be.
	unchanged bool
	// A changed read is either merged with the held one (edits, in key
	// order) or read in full (full, whose map is new).
	edits []edit
	full  held
	// changed lists the keys set, added or deleted against the held read
	// it was compared with (nil when there was none).
	changed []string
	// removes: the read lacks keys the held read has.
	removes bool
}

// walkFunc walks a listing: it calls f with the relative key and the value
// of every key under the prefix, in listed order, until f returns an
// error. Both slices are valid during the call only. (decode.go's
// listingReader.walk is the one in use.)
type walkFunc func(f func(rel, v []byte) error) error

// errUnordered is a listing whose keys are not in order, which
// mergeListing relies on. Consul lists keys sorted; the Watcher reads the
// next listings in full if one ever is not.
var errUnordered = errors.New("Consul listed the keys out of order")

// mergeListing reads a listing against last, both in key order, into the
// edits that make last the read. It costs one pass over the body, no
// lookups, and allocates only what differs.
func mergeListing(walk walkFunc, last held) (listing, error) {
	var (
		n, j  int // keys read; last's keys passed
		prev  []byte
		edits []edit
	)
	err := walk(func(rel, v []byte) error {
		if n > 0 {
			switch bytes.Compare(prev, rel) {
			case 0:
				return fmt.Errorf("%w: %q", errDuplicateKey, cutKey(rel))
			case 1:
				return errUnordered
			}
		}
		n++
		prev = append(prev[:0], rel...)
		for ; j < len(last.keys) && last.keys[j] < string(rel); j++ {
			edits = append(edits, edit{at: j, key: last.keys[j], op: editDel})
		}
		if j < len(last.keys) && last.keys[j] == string(rel) {
			if last.vals[j] != string(v) {
				edits = append(edits, edit{at: j, key: last.keys[j], val: string(v), op: editSet})
			}
			j++
			return nil
		}
		edits = append(edits, edit{at: j, key: string(rel), val: string(v), op: editAdd})
		return nil
	})
	if err != nil {
		return listing{}, err
	}
	for ; j < len(last.keys); j++ {
		edits = append(edits, edit{at: j, key: last.keys[j], op: editDel})
	}
	if len(edits) == 0 {
		return listing{count: n, unchanged: true}, nil
	}
	changed := make([]string, len(edits))
	removes := false
	for i, e := range edits {
		changed[i] = e.key
		removes = removes || e.op == editDel
	}
	return listing{count: n, edits: edits, changed: changed, removes: removes}, nil
}

// readListing reads a listing in full into a new held read, and compares
// it with last when there is one (the first read of a Watcher has none).
func readListing(walk walkFunc, last map[string]string) (listing, error) {
	b := newBuilder(len(last))
	err := walk(func(rel, v []byte) error { return b.add(string(rel), string(v)) })
	if err != nil {
		return listing{}, err
	}
	return compared(b.held(), last), nil
}

// builder builds a held read from its keys in any order.
type builder struct {
	h        held
	disorder bool
}

// newBuilder returns a builder sized for n keys (the held read's count is
// the best guess of the next one's).
func newBuilder(n int) *builder {
	return &builder{h: held{kv: make(map[string]string, n), keys: make([]string, 0, n), vals: make([]string, 0, n)}}
}

func (b *builder) add(k, v string) error {
	if _, dup := b.h.kv[k]; dup {
		return fmt.Errorf("%w: %q", errDuplicateKey, cutKey([]byte(k)))
	}
	if n := len(b.h.keys); n > 0 && b.h.keys[n-1] >= k {
		b.disorder = true
	}
	b.h.kv[k] = v
	b.h.keys, b.h.vals = append(b.h.keys, k), append(b.h.vals, v)
	return nil
}

// held returns the read, its keys sorted.
func (b *builder) held() held {
	if b.disorder {
		b.h.keys = slices.Sorted(maps.Keys(b.h.kv))
		b.h.vals = b.h.vals[:len(b.h.keys)]
		for i, k := range b.h.keys {
			b.h.vals[i] = b.h.kv[k]
		}
	}
	return b.h
}

// compared is the listing of h, a read built in full, compared with last
// (nil: nothing to compare with).
func compared(h held, last map[string]string) listing {
	l := listing{count: len(h.kv), full: h}
	if last == nil {
		return l
	}
	for k, v := range h.kv {
		if old, ok := last[k]; !ok || old != v {
			l.changed = append(l.changed, k)
		}
	}
	for k := range last {
		if _, ok := h.kv[k]; !ok {
			l.changed = append(l.changed, k)
			l.removes = true
		}
	}
	if len(l.changed) == 0 {
		return listing{count: len(h.kv), unchanged: true}
	}
	return l
}
