package kvsync

// This file reads a Consul KV listing (GET /v1/kv/<prefix>?recurse: a JSON
// array of KV pairs, or null) without consul/api's decoding. consul/api
// runs encoding/json into []*api.KVPair (ten fields a pair, every value
// base64-decoded into its own []byte), which at 50,000 keys costs about
// 120–150 ms and 53 MB of garbage per read; reading only Key and Value
// where they stand, and comparing them with what the Sink holds before
// building anything, costs a fraction of that (BenchmarkDecodeListing).
//
// consul/api never hands back a listing's body, so the decoding happens
// in its HTTP transport (listingTransport, installed by NewClient): the
// Watcher marks its List call's context with a *capture, the transport
// decodes the 200 answer's body into it and hands consul/api an empty
// array in its place. Everything else (address, TLS, token, namespace,
// 404 as an empty prefix, X-Consul-Index, the ACL-filtered header, status
// errors) stays consul/api's. A List that did not pass through the
// transport (a client built elsewhere, the tests' fakes) is read from
// consul/api's pairs as before.

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/hashicorp/consul/api"
)

// NewClient returns the Consul client for addr (see ClientConfig) with the
// transport that lets a Watcher decode its listings itself.
func NewClient(addr string) (*api.Client, error) {
	cfg := ClientConfig(addr)
	c, err := api.NewClient(cfg)
	if err != nil {
		return nil, err
	}
	// api.NewClient fills cfg.HttpClient (for every address form, unix
	// sockets included) and the client shares that *http.Client.
	cfg.HttpClient.Transport = listingTransport{next: cfg.HttpClient.Transport}
	return c, nil
}

// listingTransport decodes the body of a request whose context carries a
// *capture (see withCapture) into it.
type listingTransport struct{ next http.RoundTripper }

func (t listingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	next := t.next
	if next == nil {
		next = http.DefaultTransport
	}
	c, _ := req.Context().Value(captureKey{}).(*capture)
	if c != nil && req.Header.Get("Accept-Encoding") == "" {
		// Consul gzips an answer when asked to, and Go's transport asks
		// by default: 11 MB of JSON at 50,000 keys cost Consul's CPU
		// more than the listing itself and ours again to inflate, while
		// the bytes cross a data centre's network in milliseconds.
		req = req.Clone(req.Context())
		req.Header.Set("Accept-Encoding", "identity")
	}
	resp, err := next.RoundTrip(req)
	if err != nil || c == nil || resp.StatusCode != http.StatusOK {
		return resp, err
	}
	if err := c.consume(resp); err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(strings.NewReader("[]"))
	resp.ContentLength = 2
	resp.Header.Del("Content-Length")
	return resp, nil
}

type captureKey struct{}

// withCapture marks ctx so that listingTransport decodes the listing
// answered to the request made with it into c.
func withCapture(ctx context.Context, c *capture) context.Context {
	return context.WithValue(ctx, captureKey{}, c)
}

// capture is one listing request's decoding. The Watcher fills the inputs;
// the transport sets done and the result.
type capture struct {
	prefix string
	index  uint64 // the WaitIndex asked
	last   held   // what the Sink holds; its kv is nil when nothing yet
	// unordered: read in full, not merged with last (see errUnordered).
	unordered bool
	body      *[]byte // reused buffer for the body
	value     *[]byte // reused buffer for one base64-decoded value

	done bool // the transport read the answer
	res  listing
}

// consume reads and closes resp's body and decodes it into c. An answer at
// the index asked changed nothing (the wait ended, or a write outside the
// prefix woke the query): its body is read but not decoded.
func (c *capture) consume(resp *http.Response) error {
	defer resp.Body.Close()
	if c.index != 0 && resp.Header.Get("X-Consul-Index") == strconv.FormatUint(c.index, 10) {
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			return fmt.Errorf("read KV listing: %w", err)
		}
		c.done, c.res = true, listing{count: len(c.last.kv), unchanged: true, direct: true}
		return nil
	}
	lr := listingReader{listingDecoder: listingDecoder{b: (*c.body)[:0]}, r: resp.Body}
	var err error
	if c.last.kv == nil || c.unordered {
		c.res, err = readListing(&lr, c.prefix, c.value, c.last.kv)
	} else {
		c.res, err = mergeListing(&lr, c.prefix, c.value, c.last)
	}
	*c.body = lr.b[:0]
	if err != nil {
		return err
	}
	c.done, c.res.direct = true, true
	return nil
}

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
	// direct: read from the body by listingTransport, not from
	// consul/api's pairs.
	direct bool
}

// errUnordered is a listing whose keys are not in order, which
// mergeListing relies on. Consul lists keys sorted; the Watcher reads the
// next listings in full if one ever is not.
var errUnordered = errors.New("Consul listed the keys out of order")

// mergeListing reads a listing against last, both in key order, into the
// edits that make last the read. It costs one pass over the body, no
// lookups, and allocates only what differs.
func mergeListing(lr *listingReader, prefix string, value *[]byte, last held) (listing, error) {
	var (
		n, j  int // keys read; last's keys passed
		prev  []byte
		edits []edit
	)
	err := walkListing(lr, prefix, value, func(rel, v []byte) error {
		if n > 0 && bytes.Compare(prev, rel) >= 0 {
			return errUnordered
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
	for i, e := range edits {
		changed[i] = e.key
	}
	return listing{count: n, edits: edits, changed: changed}, nil
}

// readListing reads a listing in full into a new held read, and compares
// it with last when there is one (the first read of a Watcher has none).
func readListing(lr *listingReader, prefix string, value *[]byte, last map[string]string) (listing, error) {
	b := newBuilder(len(last))
	err := walkListing(lr, prefix, value, func(rel, v []byte) error {
		b.add(string(rel), string(v))
		return nil
	})
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

func (b *builder) add(k, v string) {
	if n := len(b.h.keys); n > 0 && b.h.keys[n-1] >= k {
		b.disorder = true
	}
	b.h.kv[k] = v
	b.h.keys, b.h.vals = append(b.h.keys, k), append(b.h.vals, v)
}

// held returns the read, its keys sorted (a key listed twice counts once,
// with its last value).
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
		}
	}
	if len(l.changed) == 0 {
		return listing{count: len(h.kv), unchanged: true}
	}
	return l
}

// errListing wraps every error a listing's body gets.
var errListing = errors.New("malformed Consul KV listing")

// walkListing calls f with the relative key and the value of every key
// under prefix in a listing's body, in order, until f returns an error.
// Both slices are valid during the call only. The prefix itself and
// folder keys (ending in "/" with no value) are left out, as consul/api's
// reading in pairKey leaves them. Only Key and Value are read; the other
// fields are checked to be JSON and skipped. The body is read one pair at
// a time: what is held is the largest pair, not the listing.
func walkListing(lr *listingReader, prefix string, value *[]byte, f func(rel, v []byte) error) error {
	lr.space()
	if lr.literal("null") {
		return lr.end()
	}
	if !lr.byte('[') {
		return lr.fail("want an array of KV pairs")
	}
	if lr.space(); lr.byte(']') {
		return lr.end()
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
		if rel, ok := bytes.CutPrefix(key, []byte(prefix)); ok && len(rel) > 0 && (len(v) > 0 || rel[len(rel)-1] != '/') {
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

func (d *listingDecoder) end() error {
	d.space()
	if d.i != len(d.b) {
		return d.fail("unexpected data after the listing")
	}
	return nil
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

// pairsListing reads a listing from consul/api's pairs, as readListing
// reads a body: for a List that did not pass through listingTransport.
func pairsListing(pairs api.KVPairs, prefix string, last map[string]string) listing {
	b := newBuilder(len(pairs))
	for _, p := range pairs {
		if rel, ok := pairKey(p, prefix); ok {
			b.add(rel, string(p.Value))
		}
	}
	return compared(b.held(), last)
}

// pairKey returns a pair's key relative to prefix, and false for the
// prefix itself and folder keys.
func pairKey(p *api.KVPair, prefix string) (string, bool) {
	rel, ok := strings.CutPrefix(p.Key, prefix)
	if !ok || rel == "" || (strings.HasSuffix(rel, "/") && len(p.Value) == 0) {
		return "", false
	}
	return rel, true
}
