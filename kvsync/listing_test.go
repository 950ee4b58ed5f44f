package kvsync

// This file measures how a Consul KV listing is best decoded. decodeListing
// (below) reads the HTTP body straight into the map, and is about four times
// faster than consul/api's decoding with a sixth of the garbage on 50,000
// keys (BenchmarkDecodeListing). It is not used by the Watcher yet:
// consul/api's KV.List never hands back the raw body (and its Raw().Query
// runs encoding/json over it first, which is the cost), so adopting it means
// the Watcher making the blocking HTTP request itself from the client's
// configuration (address, TLS, token, dc/ns/partition, 404 as an empty
// prefix, X-Consul-Index, the ACL-filtered header, StatusError for the
// hints). It lives here, tested against consul/api's results, until then.

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/hashicorp/consul/api"
)

// listingBody builds a Consul KV listing of n state keys under prefix, as
// Consul 1.13 writes it: 10 servers a backend, plain states and JSON
// objects with a reason, by and at, a backend wildcard in a hundred.
func listingBody(tb testing.TB, prefix string, n int) []byte {
	tb.Helper()
	rng := rand.New(rand.NewPCG(1, 2))
	var pairs []*api.KVPair
	for i := range n {
		key := fmt.Sprintf("%sstate/gke-zone-%d-backend-%04d/gke-node-%04d-%02d", prefix, i%3, i/10, i/10, i%10)
		if i%100 == 0 {
			key = fmt.Sprintf("%sstate/gke-zone-%d-backend-%04d/*", prefix, i%3, i/10)
		}
		var v string
		switch rng.IntN(4) {
		case 0:
			v = "drain"
		case 1:
			v = fmt.Sprintf("%d%%", rng.IntN(101))
		default:
			v = fmt.Sprintf(`{"state":"drain","reason":"zonal maintenance %d","by":"alice","at":"2026-11-30T12:00:00Z"}`, i)
		}
		idx := uint64(1000 + i)
		pairs = append(pairs, &api.KVPair{Key: key, Value: []byte(v), CreateIndex: idx, ModifyIndex: idx + 7})
	}
	pairs = append(pairs, &api.KVPair{Key: prefix + "config/ramp", Value: []byte(`{"duration":"5m"}`), CreateIndex: 9, ModifyIndex: 9})
	b, err := json.Marshal(pairs)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// viaConsulAPI is what the Watcher does with a listing's body: consul/api's
// KV.List decodes it into []*api.KVPair, then the map.
func viaConsulAPI(body []byte, prefix string) (map[string]string, error) {
	var pairs api.KVPairs
	if err := json.NewDecoder(bytes.NewReader(body)).Decode(&pairs); err != nil {
		return nil, err
	}
	return listing{prefix: prefix, pairs: pairs}.kv(), nil
}

func TestDecodeListingMatchesConsulAPI(t *testing.T) {
	for _, body := range []string{
		string(listingBody(t, "hastate/", 300)),
		`null`, ` [ ] `, `[]`,
		`[{"Key":"hastate/"},{"Key":"hastate/state/web/","Value":null},{"Key":"hastate/state/web/a","Value":"ZHJhaW4="}]`,
		// A folder key that holds a value is a key; a key outside the
		// prefix is not.
		`[{"Key":"hastate/dir/","Value":"eA=="},{"Key":"other/x","Value":"eA=="}]`,
		// Escapes in keys, fields in any order, nested unknown fields.
		`[{"Value":"cmVhZHk=","Flags":0,"Key":"hastate/state/w\u00e9b/\"a\"","Extra":{"x":[1,2,{"y":"}"}]},"N":-1.5e+3,"B":true}]`,
		`[{"Key":"hastate/state/web/a","Value":""}]`,
		// Names that differ in case are the fields, as in encoding/json;
		// a pair without a key is skipped.
		`[{"key":"hastate/state/web/b","VALUE":"bWFpbnQ="},{},{"Value":"eA=="}]`,
	} {
		got, err := decodeListing([]byte(body), "hastate/")
		if err != nil {
			t.Fatalf("decodeListing(%.80q): %v", body, err)
		}
		want, err := viaConsulAPI([]byte(body), "hastate/")
		if err != nil {
			t.Fatal(err)
		}
		if !maps.Equal(got, want) {
			t.Errorf("decodeListing(%.80q) = %v, consul/api %v", body, got, want)
		}
	}
}

func TestDecodeListingRejectsMalformed(t *testing.T) {
	for _, body := range []string{
		``, `{}`, `[`, `[{]`, `[1]`, `[{"Key":"hastate/a"}`, `[{"Key":"hastate/a",}]`,
		`[{"Key":"hastate/a","Value":"!!"}]`, `[{"Key":"hastate/a","Value":"ZHJhaW4="}] x`,
		`[{"Key":"hastate/a","Flags":01x}]`, `[{"Key":"hastate/a","Flags":}]`, `[{"Key":"hastate/a" "Value":null}]`,
		`[{"Key":"hastate/a"},]`, `[{"Key":"hastate/a","X":{"y":}}]`, "[{\"Key\":\"hastate/\x01\"}]",
	} {
		if kv, err := decodeListing([]byte(body), "hastate/"); err == nil {
			t.Errorf("decodeListing(%q) = %v, want an error", body, kv)
		}
	}
}

// BenchmarkDecodeListing compares ways to turn a 50,000-key Consul KV
// listing (the HTTP body; no network) into the map the Sink gets:
// consul/api's decoding into []*api.KVPair plus the map (what the Watcher
// does), the same body through consul/api's Raw().Query into a
// json.Unmarshaler that runs decodeListing, and decodeListing alone.
func BenchmarkDecodeListing(b *testing.B) {
	const prefix = "hastate/"
	body := listingBody(b, prefix, 50_000)
	for _, c := range []struct {
		name   string
		decode func([]byte, string) (map[string]string, error)
	}{
		{"consul-api", viaConsulAPI},
		{"raw-query", func(body []byte, prefix string) (map[string]string, error) {
			// consul/api's Raw().Query into a json.Unmarshaler: the
			// decoder scans and buffers the body, then decodeListing.
			l := rawListing{prefix: prefix}
			err := json.NewDecoder(bytes.NewReader(body)).Decode(&l)
			return l.kv, err
		}},
		{"decodeListing", decodeListing},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				kv, err := c.decode(body, prefix)
				if err != nil || len(kv) != 50_001 {
					b.Fatalf("%d keys, %v", len(kv), err)
				}
			}
		})
	}
}

type rawListing struct {
	prefix string
	kv     map[string]string
}

func (l *rawListing) UnmarshalJSON(b []byte) (err error) {
	l.kv, err = decodeListing(b, l.prefix)
	return err
}

// decodeListing decodes the body of a Consul KV listing (GET
// /v1/kv/<prefix>?recurse: a JSON array of KV pairs, or null) straight into
// values by key relative to prefix, without the []*api.KVPair consul/api
// builds first: only "Key" and "Value" are read, and a base64 value is
// decoded once, into the string the map keeps. The prefix itself and
// folder keys ("x/" without a value) are left out, as Run expects.
func decodeListing(body []byte, prefix string) (map[string]string, error) {
	d := listingDecoder{b: body}
	d.space()
	if d.literal("null") {
		return map[string]string{}, d.end()
	}
	if !d.byte('[') {
		return nil, d.fail("want an array of KV pairs")
	}
	kv := make(map[string]string, d.countPairs())
	var buf []byte
	if d.space(); d.byte(']') {
		return kv, d.end()
	}
	for {
		key, value, hasValue, err := d.pair(&buf)
		if err != nil {
			return nil, err
		}
		if rel, ok := strings.CutPrefix(key, prefix); ok && rel != "" && (hasValue || !strings.HasSuffix(rel, "/")) {
			kv[rel] = value
		}
		d.space()
		switch {
		case d.byte(','):
		case d.byte(']'):
			return kv, d.end()
		default:
			return nil, d.fail("want ',' or ']' after a KV pair")
		}
	}
}

// listingDecoder reads one JSON document in place.
type listingDecoder struct {
	b []byte
	i int
}

var errListing = errors.New("malformed KV listing")

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

// countPairs estimates the number of pairs, to size the map once.
func (d *listingDecoder) countPairs() int {
	return bytes.Count(d.b[d.i:], []byte(`"Key"`))
}

// pair reads one KV pair object. buf is scratch space for base64.
func (d *listingDecoder) pair(buf *[]byte) (key, value string, hasValue bool, err error) {
	d.space()
	if !d.byte('{') {
		return "", "", false, d.fail("want a KV pair object")
	}
	// A pair without a Key is skipped, as consul/api's empty Key would be.
	if d.space(); d.byte('}') {
		return "", "", false, nil
	}
	for {
		d.space()
		name, err := d.name()
		if err != nil {
			return "", "", false, err
		}
		d.space()
		if !d.byte(':') {
			return "", "", false, d.fail("want ':' after a field name")
		}
		d.space()
		switch {
		case name == nameKey:
			if key, err = d.str(); err != nil {
				return "", "", false, err
			}
		case name == nameValue && d.literal("null"):
		case name == nameValue:
			raw, err := d.rawStr()
			if err != nil {
				return "", "", false, err
			}
			n := base64.StdEncoding.DecodedLen(len(raw))
			if cap(*buf) < n {
				*buf = make([]byte, n)
			}
			n, err = base64.StdEncoding.Decode((*buf)[:n], raw)
			if err != nil {
				return "", "", false, fmt.Errorf("%w: value of %q: %w", errListing, key, err)
			}
			value, hasValue = string((*buf)[:n]), true
		default:
			if err := d.skip(); err != nil {
				return "", "", false, err
			}
		}
		d.space()
		switch {
		case d.byte(','):
		case d.byte('}'):
			return key, value, hasValue, nil
		default:
			return "", "", false, d.fail("want ',' or '}' in a KV pair")
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
// its quoted text in place and whether it has escapes.
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

// str reads a JSON string. One without escapes (the usual key) is copied
// once; one with escapes is decoded by encoding/json.
func (d *listingDecoder) str() (string, error) {
	q, err := d.rawStrEscaped()
	if err != nil {
		return "", err
	}
	if bytes.IndexByte(q, '\\') < 0 {
		return string(q[1 : len(q)-1]), nil
	}
	var s string
	if err := json.Unmarshal(q, &s); err != nil {
		return "", fmt.Errorf("%w: %w", errListing, err)
	}
	return s, nil
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
	q, err := d.rawStrEscaped()
	if err != nil {
		return 0, err
	}
	n := q[1 : len(q)-1]
	if bytes.IndexByte(q, '\\') >= 0 {
		var s string
		if err := json.Unmarshal(q, &s); err != nil {
			return 0, fmt.Errorf("%w: %w", errListing, err)
		}
		n = []byte(s)
	}
	switch {
	case bytes.EqualFold(n, []byte("Key")):
		return nameKey, nil
	case bytes.EqualFold(n, []byte("Value")):
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

// BenchmarkUnchangedRead is what a read that changes nothing costs after
// consul/api decoded it, at 50,000 keys: building the map and comparing it
// (what Run did) against comparing the pairs where they stand.
func BenchmarkUnchangedRead(b *testing.B) {
	const prefix = "hastate/"
	var pairs api.KVPairs
	if err := json.Unmarshal(listingBody(b, prefix, 50_000), &pairs); err != nil {
		b.Fatal(err)
	}
	l := listing{prefix: prefix, pairs: pairs}
	for _, p := range pairs {
		if _, ok := l.rel(p); ok {
			l.keys++
		}
	}
	last := l.kv()
	b.Run("map-then-equal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if !maps.Equal(l.kv(), last) {
				b.Fatal("differs")
			}
		}
	})
	b.Run("pairs-equal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if !l.equal(last) {
				b.Fatal("differs")
			}
		}
	})
}
