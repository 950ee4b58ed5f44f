package kvsync

// This file reads a Consul KV listing (GET /v1/kv/<prefix>?recurse: a JSON
// array of KV pairs, or null) without consul/api's decoding. consul/api
// runs encoding/json into []*api.KVPair (ten fields a pair, every value
// base64-decoded into its own []byte), which at 50,000 keys costs about
// 120–150 ms and 53 MB of garbage per read; reading only Key and Value
// where they stand, one pair at a time through a window, and comparing
// them with what the Sink holds before building anything (merge.go),
// costs a fraction of that (BenchmarkDecodeListing).

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
)

// errListing wraps every error a listing's body gets.
var errListing = errors.New("malformed Consul KV listing")

// Answers that decode but are not Consul's listing of the prefix: nothing
// of them is applied (see walkListing).
var (
	errEmptyAnswer   = fmt.Errorf("%w: a 200 answer with no KV pair, which Consul never sends for a recursive listing (an empty prefix is a 404)", errNotConsul)
	errOutsidePrefix = fmt.Errorf("%w: a key outside the prefix asked", errNotConsul)
	errDuplicateKey  = errors.New("Consul listed a key twice (keys that differ only in invalid UTF-8 bytes read the same through Consul's JSON: rename them with valid UTF-8)")
)

// walkListing calls f with the relative key and the value of every key
// under prefix in a listing's body, in order, until f returns an error.
// Both slices are valid during the call only. The prefix itself and
// folder keys (ending in "/" with no value) are left out: neither is a
// key the Sink hears of. Only Key and Value are read; the other
// fields are checked to be JSON and skipped. The body is read one pair at
// a time: what is held is the largest pair, not the listing.
//
// An answer of 200 with no pair (`null` or `[]`) is errEmptyAnswer: Consul
// answers an empty prefix with a 404, never so, and a caching proxy or
// another service can. A key outside the prefix is errOutsidePrefix:
// Consul lists only keys under what was asked, so the answer is for
// another path.
func walkListing(lr *listingReader, prefix string, value *[]byte, f func(rel, v []byte) error) error {
	lr.space()
	if lr.literal("null") {
		if err := lr.end(); err != nil {
			return err
		}
		return fmt.Errorf("%w: the body is null", errEmptyAnswer)
	}
	if !lr.byte('[') {
		return lr.fail("want an array of KV pairs")
	}
	if lr.space(); lr.byte(']') {
		if err := lr.end(); err != nil {
			return err
		}
		return fmt.Errorf("%w: the body is []", errEmptyAnswer)
	}
	for {
		lr.space()
		// The pair is parsed in the window; one that does not parse may
		// only be cut by the window's end, so it is parsed again with
		// more of the body until the body ends. (Parsing ends at the
		// pair's closing brace: a pair that parses was whole.)
		d := listingDecoder{b: lr.b[lr.i:]}
		key, v, err := d.pair(value)
		if err != nil {
			if lr.more() {
				continue
			}
			if err := lr.readErr(); err != nil {
				return err
			}
			return fmt.Errorf("%w (in the pair at byte %d)", err, lr.off+lr.i)
		}
		rel, ok := bytes.CutPrefix(key, []byte(prefix))
		if !ok {
			return fmt.Errorf("%w: %q (in the pair at byte %d)", errOutsidePrefix, cutKey(key), lr.off+lr.i)
		}
		if len(rel) > 0 && (len(v) > 0 || rel[len(rel)-1] != '/') {
			if err := f(rel, v); err != nil {
				return err
			}
		}
		lr.i += d.i
		lr.space()
		switch {
		case lr.byte(','):
		case lr.byte(']'):
			return lr.end()
		default:
			return lr.fail("want ',' or ']' after a KV pair")
		}
	}
}

// walk is walkListing over lr, as mergeListing and readListing take it.
func (lr *listingReader) walk(prefix string, value *[]byte) walkFunc {
	return func(f func(rel, v []byte) error) error { return walkListing(lr, prefix, value, f) }
}

// listingReader reads a listing's body through a window: its decoder's b
// is what was read (up to the buffer's capacity), i the first byte not yet
// parsed; off counts the bytes dropped before b[0]. Its own space, byte
// and literal are the decoder's, reading more of the body as they need.
type listingReader struct {
	listingDecoder
	r   io.Reader
	off int
	err error // the read error that ended the body (io.EOF at its end)
}

// minListingWindow is the least a listingReader reads at once.
const minListingWindow = 64 << 10

// more reads more of the body into the window, keeping b[i:]. It returns
// false at the end of the body or on a read error (lr.err).
func (lr *listingReader) more() bool {
	if lr.err != nil {
		return false
	}
	if lr.i > 0 {
		n := copy(lr.b, lr.b[lr.i:])
		lr.off += lr.i
		lr.b, lr.i = lr.b[:n], 0
	}
	if cap(lr.b)-len(lr.b) < minListingWindow/2 {
		lr.b = slices.Grow(lr.b, max(cap(lr.b), minListingWindow))
	}
	for {
		m, err := lr.r.Read(lr.b[len(lr.b):cap(lr.b)])
		lr.b = lr.b[:len(lr.b)+m]
		if err != nil {
			lr.err = err
			return m > 0
		}
		if m > 0 {
			return true
		}
	}
}

// ensure makes at least k unparsed bytes available, if the body has them.
func (lr *listingReader) ensure(k int) bool {
	for len(lr.b)-lr.i < k {
		if !lr.more() {
			return false
		}
	}
	return true
}

func (lr *listingReader) space() {
	for {
		lr.listingDecoder.space()
		if lr.i < len(lr.b) || !lr.more() {
			return
		}
	}
}

func (lr *listingReader) byte(c byte) bool { return lr.ensure(1) && lr.listingDecoder.byte(c) }

func (lr *listingReader) literal(s string) bool {
	return lr.ensure(len(s)) && lr.listingDecoder.literal(s)
}

// end checks that nothing but space follows.
func (lr *listingReader) end() error {
	lr.space()
	if lr.ensure(1) {
		return lr.fail("unexpected data after the listing")
	}
	return lr.readErr()
}

// readErr is the error that ended the body early, or nil at its end.
func (lr *listingReader) readErr() error {
	if lr.err != nil && !errors.Is(lr.err, io.EOF) {
		return fmt.Errorf("read KV listing: %w", lr.err)
	}
	return nil
}

func (lr *listingReader) fail(what string) error {
	if err := lr.readErr(); err != nil {
		return err
	}
	return fmt.Errorf("%w at byte %d: %s", errListing, lr.off+lr.i, what)
}

// listingDecoder reads one JSON document in place.
type listingDecoder struct {
	b []byte
	i int
}

func (d *listingDecoder) fail(what string) error {
	return fmt.Errorf("%w at byte %d: %s", errListing, d.i, what)
}

func (d *listingDecoder) space() {
	for d.i < len(d.b) {
		switch d.b[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

func (d *listingDecoder) byte(c byte) bool {
	if d.i < len(d.b) && d.b[d.i] == c {
		d.i++
		return true
	}
	return false
}

func (d *listingDecoder) literal(s string) bool {
	if len(d.b)-d.i >= len(s) && string(d.b[d.i:d.i+len(s)]) == s {
		d.i += len(s)
		return true
	}
	return false
}

// pair reads one KV pair object and returns its key and decoded value
// (into *buf), valid until the next call. A pair without a Key returns a
// nil key, which matches no prefix (consul/api's pair would have an empty
// Key).
func (d *listingDecoder) pair(buf *[]byte) (key, value []byte, err error) {
	d.space()
	if !d.byte('{') {
		return nil, nil, d.fail("want a KV pair object")
	}
	if d.space(); d.byte('}') {
		return nil, nil, nil
	}
	for {
		d.space()
		name, err := d.name()
		if err != nil {
			return nil, nil, err
		}
		d.space()
		if !d.byte(':') {
			return nil, nil, d.fail("want ':' after a field name")
		}
		d.space()
		switch {
		case name == nameKey:
			if key, err = d.str(); err != nil {
				return nil, nil, err
			}
		case name == nameValue && d.literal("null"):
			value = nil
		case name == nameValue:
			raw, err := d.rawStr()
			if err != nil {
				return nil, nil, err
			}
			n := base64.StdEncoding.DecodedLen(len(raw))
			if cap(*buf) < n {
				*buf = make([]byte, n)
			}
			n, err = base64.StdEncoding.Decode((*buf)[:n], raw)
			if err != nil {
				return nil, nil, fmt.Errorf("%w: value of %q: %w", errListing, key, err)
			}
			value = (*buf)[:n]
		default:
			if err := d.skip(); err != nil {
				return nil, nil, err
			}
		}
		d.space()
		switch {
		case d.byte(','):
		case d.byte('}'):
			return key, value, nil
		default:
			return nil, nil, d.fail("want ',' or '}' in a KV pair")
		}
	}
}

// rawStr reads a JSON string without escapes (base64 has none) and returns
// its bytes in place.
func (d *listingDecoder) rawStr() ([]byte, error) {
	if !d.byte('"') {
		return nil, d.fail("want a string")
	}
	start := d.i
	for d.i < len(d.b) {
		switch d.b[d.i] {
		case '"':
			d.i++
			return d.b[start : d.i-1], nil
		case '\\':
			return nil, d.fail("escape in a base64 value")
		}
		d.i++
	}
	return nil, d.fail("unterminated string")
}

// rawStrEscaped passes over a JSON string, escapes allowed, and returns
// its quoted text in place.
func (d *listingDecoder) rawStrEscaped() (quoted []byte, err error) {
	start := d.i
	if !d.byte('"') {
		return nil, d.fail("want a string")
	}
	for d.i < len(d.b) {
		switch c := d.b[d.i]; {
		case c == '"':
			d.i++
			return d.b[start:d.i], nil
		case c == '\\':
			d.i += 2
			continue
		case c < 0x20:
			return nil, d.fail("control character in a string")
		}
		d.i++
	}
	return nil, d.fail("unterminated string")
}

// str reads a JSON string. One without escapes (the usual key) is returned
// in place; one with escapes is decoded by encoding/json.
func (d *listingDecoder) str() ([]byte, error) {
	q, err := d.rawStrEscaped()
	if err != nil {
		return nil, err
	}
	if bytes.IndexByte(q, '\\') < 0 {
		return q[1 : len(q)-1], nil
	}
	var s string
	if err := json.Unmarshal(q, &s); err != nil {
		return nil, fmt.Errorf("%w: %w", errListing, err)
	}
	return []byte(s), nil
}

// The fields of a KV pair that hastate reads.
const (
	nameOther = iota
	nameKey
	nameValue
)

// name reads a field name and tells Key and Value from the others,
// without allocating for the names Consul sends. Like encoding/json (and
// so consul/api), it takes a name that differs only in case as the field.
func (d *listingDecoder) name() (int, error) {
	q, err := d.str()
	if err != nil {
		return 0, err
	}
	switch {
	case bytes.EqualFold(q, []byte("Key")):
		return nameKey, nil
	case bytes.EqualFold(q, []byte("Value")):
		return nameValue, nil
	}
	return nameOther, nil
}

// skip passes over one JSON value of a field hastate does not read: a
// string, number or literal (what Consul sends), or, checked by
// encoding/json, an object or array.
func (d *listingDecoder) skip() error {
	if d.i >= len(d.b) {
		return d.fail("want a value")
	}
	switch c := d.b[d.i]; {
	case c == '"':
		_, err := d.rawStrEscaped()
		return err
	case c == '{' || c == '[':
		var v json.RawMessage
		dec := json.NewDecoder(bytes.NewReader(d.b[d.i:]))
		if err := dec.Decode(&v); err != nil {
			return fmt.Errorf("%w: %w", errListing, err)
		}
		d.i += int(dec.InputOffset())
		return nil
	case d.literal("true"), d.literal("false"), d.literal("null"):
		return nil
	}
	return d.number()
}

// number passes over a JSON number.
func (d *listingDecoder) number() error {
	digits := func() int {
		n := 0
		for d.i < len(d.b) && d.b[d.i] >= '0' && d.b[d.i] <= '9' {
			d.i++
			n++
		}
		return n
	}
	d.byte('-')
	if digits() == 0 {
		return d.fail("want a value")
	}
	if d.byte('.') && digits() == 0 {
		return d.fail("want digits after '.'")
	}
	if d.byte('e') || d.byte('E') {
		_ = d.byte('+') || d.byte('-')
		if digits() == 0 {
			return d.fail("want digits in an exponent")
		}
	}
	return nil
}

// cutKey quotes at most 200 bytes of a key for an error.
func cutKey(k []byte) string {
	if len(k) > 200 {
		return string(k[:200]) + "..."
	}
	return string(k)
}
