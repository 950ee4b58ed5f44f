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
	index  uint64            // the WaitIndex asked
	last   map[string]string // what the Sink holds; nil: none yet
	body   *[]byte           // reused buffer for the body
	value  *[]byte           // reused buffer for one base64-decoded value

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
		c.done, c.res = true, listing{keys: len(c.last), unchanged: true, direct: true}
		return nil
	}
	buf := bytes.NewBuffer((*c.body)[:0])
	if resp.ContentLength > 0 {
		buf.Grow(int(resp.ContentLength))
	}
	_, err := buf.ReadFrom(resp.Body)
	*c.body = buf.Bytes()
	if err != nil {
		return fmt.Errorf("read KV listing: %w", err)
	}
	c.res, err = readListing(*c.body, c.prefix, c.last, c.value)
	if err != nil {
		return err
	}
	c.done, c.res.direct = true, true
	return nil
}

// listing is one read of the prefix.
type listing struct {
	keys int // keys under the prefix: not the prefix itself, not a folder
	// unchanged: the read holds exactly what the Sink last accepted (kv
	// is then nil). Only a read compared with a last map is.
	unchanged bool
	kv        map[string]string // values by relative key, when changed
	// changed lists the keys set, added or deleted against the last map
	// the read was compared with (nil when there was none).
	changed []string
	// direct: read from the body by listingTransport, not from
	// consul/api's pairs.
	direct bool
}

// readListing decodes a listing's body into values by key relative to
// prefix. When last is not nil it reads the body against it where it
// stands: a read equal to last builds nothing, and one that only sets keys
// (the usual change) is a copy of last with those keys set, sharing last's
// strings. Only a read that deletes keys, or one with nothing to compare
// with, builds the map from the body. value is scratch space for base64.
// (Consul lists a key once; the counting below relies on it.)
func readListing(body []byte, prefix string, last map[string]string, value *[]byte) (listing, error) {
	if last != nil {
		var (
			keys, found int
			kv          map[string]string // last with the differences; nil while there are none
			changed     []string
		)
		err := walkListing(body, prefix, value, func(rel, v []byte) {
			keys++
			old, ok := last[string(rel)]
			if ok {
				found++
				if old == string(v) {
					return
				}
			}
			if kv == nil {
				kv = maps.Clone(last)
			}
			k := string(rel)
			kv[k] = string(v)
			changed = append(changed, k)
		})
		switch {
		case err != nil:
			return listing{}, err
		case kv == nil && keys == len(last):
			return listing{keys: keys, unchanged: true}, nil
		case found == len(last):
			return listing{keys: keys, kv: kv, changed: changed}, nil
		}
	}
	kv := make(map[string]string, bytes.Count(body, []byte(`"Key"`)))
	err := walkListing(body, prefix, value, func(rel, v []byte) {
		kv[string(rel)] = string(v)
	})
	if err != nil {
		return listing{}, err
	}
	return built(kv, last), nil
}

// built is the listing of a read built in full, kv, compared with last
// (nil: nothing to compare with).
func built(kv, last map[string]string) listing {
	l := listing{keys: len(kv), kv: kv}
	if last == nil {
		return l
	}
	for k, v := range kv {
		if old, ok := last[k]; !ok || old != v {
			l.changed = append(l.changed, k)
		}
	}
	for k := range last {
		if _, ok := kv[k]; !ok {
			l.changed = append(l.changed, k)
		}
	}
	if len(l.changed) == 0 {
		return listing{keys: len(kv), unchanged: true}
	}
	return l
}

// errListing wraps every error a listing's body gets.
var errListing = errors.New("malformed Consul KV listing")

// walkListing calls f with the relative key and the value of every key
// under prefix in a listing's body, in order. Both
// slices are valid during the call only. The prefix itself and folder
// keys (ending in "/" with no value) are left out, as consul/api's reading
// in pairKey leaves them. Only Key and Value are read; the other fields
// are checked to be JSON and skipped.
func walkListing(body []byte, prefix string, value *[]byte, f func(rel, v []byte)) error {
	d := listingDecoder{b: body}
	d.space()
	if d.literal("null") {
		return d.end()
	}
	if !d.byte('[') {
		return d.fail("want an array of KV pairs")
	}
	if d.space(); d.byte(']') {
		return d.end()
	}
	for {
		key, v, err := d.pair(value)
		if err != nil {
			return err
		}
		if rel, ok := bytes.CutPrefix(key, []byte(prefix)); ok && len(rel) > 0 && (len(v) > 0 || rel[len(rel)-1] != '/') {
			f(rel, v)
		}
		d.space()
		switch {
		case d.byte(','):
		case d.byte(']'):
			return d.end()
		default:
			return d.fail("want ',' or ']' after a KV pair")
		}
	}
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
	kv := make(map[string]string, len(pairs))
	for _, p := range pairs {
		if rel, ok := pairKey(p, prefix); ok {
			kv[rel] = string(p.Value)
		}
	}
	return built(kv, last)
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
