package kvsync

// Tests of decode.go and merge.go: the listing decoder against consul/api's reading of
// the same bodies, the compare-first read, and what each costs.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/hashicorp/consul/api"
)

// listingBody builds a Consul KV listing of n state keys under prefix, as
// Consul 1.13 writes it: 10 servers a backend, plain states and JSON
// objects with a reason, by and at, a backend wildcard in a hundred; in
// key order.
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
	slices.SortFunc(pairs, func(a, b *api.KVPair) int { return strings.Compare(a.Key, b.Key) }) // as Consul lists them
	b, err := json.Marshal(pairs)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// viaConsulAPI is consul/api's reading of a listing's body: encoding/json
// into []*api.KVPair, then the map.
func viaConsulAPI(body []byte, prefix string) (map[string]string, error) {
	var pairs api.KVPairs
	if err := json.NewDecoder(bytes.NewReader(body)).Decode(&pairs); err != nil {
		return nil, err
	}
	kv := map[string]string{}
	for _, p := range pairs {
		// The prefix itself and folder keys (a "/" at the end, no value)
		// are not keys.
		if rel, ok := strings.CutPrefix(p.Key, prefix); ok && rel != "" && (!strings.HasSuffix(rel, "/") || len(p.Value) > 0) {
			kv[rel] = string(p.Value)
		}
	}
	return kv, nil
}

// reader is a listingReader over r with a fresh buffer.
func reader(r io.Reader) *listingReader { return &listingReader{r: r} }

// decode is readListing with nothing to compare with: the map it builds.
func decode(body []byte, prefix string) (map[string]string, error) {
	var value []byte
	l, err := readListing(reader(bytes.NewReader(body)).walk(prefix, &value), nil)
	return l.full.kv, err
}

// checkHeld checks that h's keys and values are want's, in key order.
func checkHeld(t *testing.T, name string, h held, want map[string]string) {
	t.Helper()
	if !slices.IsSorted(h.keys) || len(h.keys) != len(want) || len(h.vals) != len(h.keys) {
		t.Errorf("%s: %d keys (%d values) are not the read's %d keys in order", name, len(h.keys), len(h.vals), len(want))
		return
	}
	for i, k := range h.keys {
		if v, ok := want[k]; !ok || h.vals[i] != v {
			t.Errorf("%s: key %d %q = %q, want %q (present %v)", name, i, k, h.vals[i], v, ok)
		}
	}
}

// heldOf is kv as the Watcher holds an accepted read.
func heldOf(kv map[string]string) held {
	b := newBuilder(len(kv))
	for _, k := range slices.Sorted(maps.Keys(kv)) {
		_ = b.add(k, kv[k]) // sorted map keys: no duplicate
	}
	return b.held()
}

// What consul/api would read as "nothing set" or skip is not Consul's
// listing of the prefix, and is refused: a 200 with no pair (Consul
// answers an empty prefix with a 404), a key outside the prefix or a pair
// without a key (the answer is for another path), a key listed twice.
func TestDecodeListingRefusesWhatConsulNeverSends(t *testing.T) {
	for body, want := range map[string]error{
		`null`:  errEmptyAnswer,
		` [ ] `: errEmptyAnswer,
		`[]`:    errEmptyAnswer,
		`[{"Key":"hastate/dir/","Value":"eA=="},{"Key":"other/x","Value":"eA=="}]`: errOutsidePrefix,
		`[{"Key":"hastate/state/web/b","Value":"eA=="},{}]`:                        errOutsidePrefix,
		`[{"Value":"eA=="}]`: errOutsidePrefix,
		`[{"Key":"hastate/a","Value":"eA=="},{"Key":"hastate/a","Value":"eQ=="}]`:                                     errDuplicateKey,
		`[{"Key":"hastate/a","Value":"eA=="},{"Key":"hastate/a1","Value":"eA=="},{"Key":"hastate/a","Value":"eQ=="}]`: errDuplicateKey,
	} {
		var value []byte
		if _, err := readListing(reader(bytes.NewReader([]byte(body))).walk("hastate/", &value), nil); !errors.Is(err, want) {
			t.Errorf("readListing(%s) = %v, want %v", body, err, want)
		}
		value = nil
		last := heldOf(map[string]string{"a": "x", "b": "y"})
		if _, err := mergeListing(reader(bytes.NewReader([]byte(body))).walk("hastate/", &value), last); !errors.Is(err, want) && !errors.Is(err, errUnordered) {
			t.Errorf("mergeListing(%s) = %v, want %v (or errUnordered, which reads it in full)", body, err, want)
		}
	}
}

func TestDecodeListingMatchesConsulAPI(t *testing.T) {
	for _, body := range []string{
		string(listingBody(t, "hastate/", 300)),
		`[{"Key":"hastate/"},{"Key":"hastate/state/web/","Value":null},{"Key":"hastate/state/web/a","Value":"ZHJhaW4="}]`,
		// A folder key that holds a value is a key.
		`[{"Key":"hastate/dir/","Value":"eA=="}]`,
		// Escapes in keys, fields in any order, nested unknown fields
		// with braces and brackets in strings.
		`[{"Value":"cmVhZHk=","Flags":0,"Key":"hastate/state/w\u00e9b/\"a\"}","Extra":{"x":[1,2,{"y":"}]\\"}]},"N":-1.5e+3,"B":true}]`,
		`[{"Key":"hastate/state/web/a","Value":""}]`,
		// A folder key with an empty value is a folder, as it is to
		// consul/api's []byte{}.
		`[{"Key":"hastate/state/web/","Value":""},{"Key":"hastate/state/web/a","Value":null}]`,
		// Names that differ in case are the fields, as in encoding/json.
		`[{"key":"hastate/state/web/b","VALUE":"bWFpbnQ="}]`,
		// Out of order: read in full, it is the same map.
		`[{"Key":"hastate/state/web/b","Value":"eA=="},{"Key":"hastate/state/web/a","Value":"eQ=="}]`,
	} {
		want, err := viaConsulAPI([]byte(body), "hastate/")
		if err != nil {
			t.Fatal(err)
		}
		for name, r := range map[string]io.Reader{
			"whole":         bytes.NewReader([]byte(body)),
			"a byte a read": iotest.OneByteReader(bytes.NewReader([]byte(body))),
		} {
			var value []byte
			l, err := readListing(reader(r).walk("hastate/", &value), nil)
			if err != nil {
				t.Fatalf("%s: readListing(%.80q): %v", name, body, err)
			}
			if !maps.Equal(l.full.kv, want) {
				t.Errorf("%s: readListing(%.80q) = %v, consul/api %v", name, body, l.full.kv, want)
			}
			checkHeld(t, name, l.full, want)
		}
	}
}

func TestDecodeListingRejectsMalformed(t *testing.T) {
	for _, body := range []string{
		``, `{}`, `[`, `[{]`, `[1]`, `[{"Key":"hastate/a"}`, `[{"Key":"hastate/a",}]`,
		`[{"Key":"hastate/a","Value":"!!"}]`, `[{"Key":"hastate/a","Value":"ZHJhaW4="}] x`,
		`[{"Key":"hastate/a","Flags":01x}]`, `[{"Key":"hastate/a","Flags":}]`, `[{"Key":"hastate/a" "Value":null}]`,
		`[{"Key":"hastate/a"},]`, `[{"Key":"hastate/a","X":{"y":}}]`, "[{\"Key\":\"hastate/\x01\"}]",
		`[{"Key":"hastate/a","X":"}"`, `[{"Key":"hastate/a"}}]`,
	} {
		if kv, err := decode([]byte(body), "hastate/"); err == nil || !errors.Is(err, errListing) {
			t.Errorf("decode(%q) = %v, %v; want an errListing", body, kv, err)
		}
		// Merged with a held read, it fails the same.
		var value []byte
		if l, err := mergeListing(reader(strings.NewReader(body)).walk("hastate/", &value), heldOf(map[string]string{"a": "x"})); err == nil {
			t.Errorf("mergeListing(%q) = %+v, want an error", body, l)
		}
	}
}

// TestListingReadErrorIsNotMalformed: a body cut by the connection fails
// with the read error, not as a malformed listing.
func TestListingReadErrorIsNotMalformed(t *testing.T) {
	body := listingBody(t, "hastate/", 3000)
	cut := io.MultiReader(bytes.NewReader(body[:len(body)/2]), iotest.ErrReader(io.ErrUnexpectedEOF))
	var value []byte
	_, err := readListing(reader(cut).walk("hastate/", &value), nil)
	if !errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, errListing) || !strings.Contains(err.Error(), "read KV listing") {
		t.Errorf("cut body: %v, want the read error", err)
	}
}

// TestListingWindowHoldsOnePair: the reader's window grows to the largest
// pair (a 512 KB value, Consul's limit), not to the listing.
func TestListingWindowHoldsOnePair(t *testing.T) {
	big := strings.Repeat("x", 512<<10)
	pairs := api.KVPairs{{Key: "hastate/config/big", Value: []byte(big)}}
	for i := range 50_000 {
		pairs = append(pairs, &api.KVPair{Key: fmt.Sprintf("hastate/state/web/s%05d", i), Value: []byte("drain")})
	}
	body, err := json.Marshal(pairs)
	if err != nil {
		t.Fatal(err)
	}
	lr := reader(bytes.NewReader(body))
	var value []byte
	l, err := readListing(lr.walk("hastate/", &value), nil)
	if err != nil || len(l.full.kv) != 50_001 || l.full.kv["config/big"] != big {
		t.Fatalf("readListing: %d keys, %v", len(l.full.kv), err)
	}
	if len(body) < 3<<20 || cap(lr.b) > 2<<20 {
		t.Errorf("window %d bytes for a %d-byte listing whose largest pair is %d bytes", cap(lr.b), len(body), len(big)*4/3)
	}
}

func TestMergeListing(t *testing.T) {
	const prefix = "hastate/"
	body := listingBody(t, prefix, 300)
	want, err := viaConsulAPI(body, prefix)
	if err != nil {
		t.Fatal(err)
	}
	var value []byte
	merge := func(last map[string]string) listing {
		t.Helper()
		l, err := mergeListing(reader(iotest.HalfReader(bytes.NewReader(body))).walk(prefix, &value), heldOf(last))
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	if l := merge(maps.Clone(want)); !l.unchanged || l.edits != nil || l.count != len(want) {
		t.Errorf("against what it holds: unchanged=%v, %d keys, %d edits; want unchanged, %d keys, no edit", l.unchanged, l.count, len(l.edits), len(want))
	}
	keys := slices.Sorted(maps.Keys(want))
	first, mid, lastKey := keys[0], keys[len(keys)/2], keys[len(keys)-1]
	spread := func(m map[string]string, n int, edit func(m map[string]string, k string)) []string {
		var ks []string
		for i := range n {
			k := keys[i*len(keys)/n]
			edit(m, k)
			ks = append(ks, k)
		}
		return ks
	}
	for name, c := range map[string]struct {
		edit func(map[string]string) []string // returns the keys that differ
	}{
		"a value differs":       {func(m map[string]string) []string { m[mid] = "x"; return []string{mid} }},
		"the first key differs": {func(m map[string]string) []string { m[first] = "x"; return []string{first} }},
		"a key is added":        {func(m map[string]string) []string { delete(m, lastKey); return []string{lastKey} }},
		"the first is added":    {func(m map[string]string) []string { delete(m, first); return []string{first} }},
		"a key is deleted":      {func(m map[string]string) []string { m["state/web/gone"] = "drain"; return []string{"state/web/gone"} }},
		"deleted at the end":    {func(m map[string]string) []string { m["zzz"] = "drain"; return []string{"zzz"} }},
		"deleted at the start":  {func(m map[string]string) []string { m["a"] = "drain"; return []string{"a"} }},
		"one key is replaced": {func(m map[string]string) []string {
			delete(m, mid)
			m[mid+"x"] = "drain"
			return []string{mid, mid + "x"}
		}},
		"20 added (a new pass)": {func(m map[string]string) []string {
			return spread(m, 20, func(m map[string]string, k string) { delete(m, k) })
		}},
		"20 set, 9 added, 4 deleted (in place)": {func(m map[string]string) []string {
			ks := spread(m, 20, func(m map[string]string, k string) { m[k] = "x" })
			ks = append(ks, spread(m, 9, func(m map[string]string, k string) { delete(m, k) })...)
			for _, k := range []string{"a", "b", mid + "y", "zzz"} {
				m[k] = "drain"
			}
			return append(ks, "a", "b", mid+"y", "zzz")
		}},
		"all deleted and set": {func(m map[string]string) []string { clear(m); m["a"] = "b"; return append([]string{"a"}, keys...) }},
	} {
		last := maps.Clone(want)
		differ := c.edit(last)
		l := merge(last)
		if l.unchanged || l.edits == nil || l.count != len(want) {
			t.Errorf("%s: unchanged=%v, %d keys, %d edits; want the edits of a changed read", name, l.unchanged, l.count, len(l.edits))
			continue
		}
		if got, want := slices.Sorted(slices.Values(l.changed)), slices.Compact(slices.Sorted(slices.Values(differ))); !slices.Equal(got, want) {
			t.Errorf("%s: changed %v, want %v", name, got, want)
		}
		h := heldOf(last)
		h.setMap(l.edits)
		if !maps.Equal(h.kv, want) {
			t.Errorf("%s: the held map with the edits differs from the read", name)
		}
		h.setKeys(l.edits)
		checkHeld(t, name, h, want)
	}
	// Keys out of order cannot be merged.
	unordered := `[{"Key":"hastate/b","Value":"eA=="},{"Key":"hastate/a","Value":"eA=="}]`
	if _, err := mergeListing(reader(strings.NewReader(unordered)).walk(prefix, &value), heldOf(map[string]string{"a": "x"})); !errors.Is(err, errUnordered) {
		t.Errorf("unordered listing: %v, want errUnordered", err)
	}
}

// BenchmarkDecodeListing measures a read of the prefix at 1,000 and 50,000
// keys: consul/api's decoding into []*api.KVPair plus the map (the Watcher
// before listingTransport), and readListing/mergeListing over decode.go's
// walk: with nothing to compare (a new leader's first read), against a
// read one key differs from (an operator's write), and against the read
// the Sink holds (a read that changed nothing: most reads).
func BenchmarkDecodeListing(b *testing.B) {
	window := make([]byte, minListingWindow) // kept from read to read, as the Watcher keeps it
	benchListings(b, true, func(body []byte, prefix string, value *[]byte) walkFunc {
		lr := &listingReader{listingDecoder: listingDecoder{b: window[:0]}, r: bytes.NewReader(body)}
		return lr.walk(prefix, value)
	})
}

// benchListings runs the reads of BenchmarkDecodeListing with the walks
// walker returns (and consul/api's, when consulAPI).
func benchListings(b *testing.B, consulAPI bool, walker func(body []byte, prefix string, value *[]byte) walkFunc) {
	const prefix = "hastate/"
	for _, keys := range []int{1_000, 50_000} {
		body := listingBody(b, prefix, keys)
		last, err := decode(body, prefix)
		if err != nil {
			b.Fatal(err)
		}
		oneSet := maps.Clone(last)
		oneSet["config/ramp"] = `{"duration":"1m"}`
		held, heldOneSet := heldOf(last), heldOf(oneSet)
		var value []byte
		cases := []struct {
			name string
			read func() (int, error)
		}{
			{"readListing-nothing-to-compare", func() (int, error) {
				l, err := readListing(walker(body, prefix, &value), nil)
				return len(l.full.kv), err
			}},
			{"mergeListing-one-key-set", func() (int, error) {
				l, err := mergeListing(walker(body, prefix, &value), heldOneSet)
				if len(l.edits) != 1 {
					return 0, fmt.Errorf("%d edits, want 1", len(l.edits))
				}
				return l.count, err
			}},
			{"mergeListing-unchanged", func() (int, error) {
				l, err := mergeListing(walker(body, prefix, &value), held)
				if !l.unchanged {
					return 0, errors.New("read as changed")
				}
				return l.count, err
			}},
		}
		if consulAPI {
			cases = append(cases[:0:0], append([]struct {
				name string
				read func() (int, error)
			}{{"consul-api", func() (int, error) {
				kv, err := viaConsulAPI(body, prefix)
				return len(kv), err
			}}}, cases...)...)
		}
		for _, c := range cases {
			b.Run(fmt.Sprintf("keys=%d/%s", keys, c.name), func(b *testing.B) {
				b.SetBytes(int64(len(body)))
				b.ReportAllocs()
				for b.Loop() {
					n, err := c.read()
					if err != nil || n != keys+1 {
						b.Fatalf("%d keys, %v", n, err)
					}
				}
			})
		}
	}
}
