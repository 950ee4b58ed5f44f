package kvsync

// Tests of listing.go: the listing decoder against consul/api's reading of
// the same bodies, the compare-first read, and what each costs.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
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
	return pairsListing(pairs, prefix, nil).kv, nil
}

// decode is readListing with nothing to compare with: the map it builds.
func decode(body []byte, prefix string) (map[string]string, error) {
	var value []byte
	l, err := readListing(body, prefix, nil, &value)
	return l.kv, err
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
		// A folder key with an empty value is a folder, as it is to
		// consul/api's []byte{}.
		`[{"Key":"hastate/state/web/","Value":""},{"Key":"hastate/state/web/a","Value":null}]`,
		// Names that differ in case are the fields, as in encoding/json;
		// a pair without a key is skipped.
		`[{"key":"hastate/state/web/b","VALUE":"bWFpbnQ="},{},{"Value":"eA=="}]`,
	} {
		got, err := decode([]byte(body), "hastate/")
		if err != nil {
			t.Fatalf("decode(%.80q): %v", body, err)
		}
		want, err := viaConsulAPI([]byte(body), "hastate/")
		if err != nil {
			t.Fatal(err)
		}
		if !maps.Equal(got, want) {
			t.Errorf("decode(%.80q) = %v, consul/api %v", body, got, want)
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
		if kv, err := decode([]byte(body), "hastate/"); err == nil || !errors.Is(err, errListing) {
			t.Errorf("decode(%q) = %v, %v; want an errListing", body, kv, err)
		}
		// Compared with a map first, it fails the same.
		var value []byte
		if l, err := readListing([]byte(body), "hastate/", map[string]string{"a": "x"}, &value); err == nil {
			t.Errorf("readListing(%q) against a map = %+v, want an error", body, l)
		}
	}
}

func TestReadListingComparesFirst(t *testing.T) {
	const prefix = "hastate/"
	body := listingBody(t, prefix, 300)
	want, err := viaConsulAPI(body, prefix)
	if err != nil {
		t.Fatal(err)
	}
	var value []byte
	read := func(last map[string]string) listing {
		t.Helper()
		l, err := readListing(body, prefix, last, &value)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	if l := read(maps.Clone(want)); !l.unchanged || l.kv != nil || l.keys != len(want) {
		t.Errorf("against what it holds: unchanged=%v, %d keys, map %v; want unchanged, %d keys, no map", l.unchanged, l.keys, l.kv != nil, len(want))
	}
	for name, edit := range map[string]func(map[string]string){
		"a value differs":     func(m map[string]string) { m["config/ramp"] = "x" },
		"a key is missing":    func(m map[string]string) { delete(m, "config/ramp") },
		"a key is extra":      func(m map[string]string) { m["state/web/gone"] = "drain" },
		"one key is replaced": func(m map[string]string) { delete(m, "config/ramp"); m["config/rampx"] = `{"duration":"5m"}` },
		"empty":               func(m map[string]string) { clear(m) },
	} {
		last := maps.Clone(want)
		edit(last)
		if l := read(last); l.unchanged || !maps.Equal(l.kv, want) || l.keys != len(want) {
			t.Errorf("%s: unchanged=%v, %d keys, map equal %v; want the full changed map", name, l.unchanged, l.keys, maps.Equal(l.kv, want))
		}
	}
	if l := read(nil); l.unchanged || !maps.Equal(l.kv, want) {
		t.Errorf("with nothing to compare: unchanged=%v, map equal %v", l.unchanged, maps.Equal(l.kv, want))
	}
}

// BenchmarkDecodeListing compares ways to turn a 50,000-key Consul KV
// listing (the HTTP body; no network) into what the Watcher needs:
// consul/api's decoding into []*api.KVPair plus the map (the Watcher
// before listingTransport), and readListing: with nothing to compare
// (a new leader's first read), against a map one key differs from (an
// operator's write), and against the map the Sink holds (a read that
// changed nothing: most reads).
func BenchmarkDecodeListing(b *testing.B) {
	const prefix = "hastate/"
	body := listingBody(b, prefix, 50_000)
	last, err := decode(body, prefix)
	if err != nil {
		b.Fatal(err)
	}
	oneSet := maps.Clone(last)
	oneSet["config/ramp"] = `{"duration":"1m"}`
	var value []byte
	for _, c := range []struct {
		name string
		read func() (int, error)
	}{
		{"consul-api", func() (int, error) {
			kv, err := viaConsulAPI(body, prefix)
			return len(kv), err
		}},
		{"readListing-nothing-to-compare", func() (int, error) {
			l, err := readListing(body, prefix, nil, &value)
			return len(l.kv), err
		}},
		{"readListing-one-key-set", func() (int, error) {
			l, err := readListing(body, prefix, oneSet, &value)
			return len(l.kv), err
		}},
		{"readListing-unchanged", func() (int, error) {
			l, err := readListing(body, prefix, last, &value)
			if !l.unchanged {
				return 0, errors.New("read as changed")
			}
			return l.keys, err
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				n, err := c.read()
				if err != nil || n != 50_001 {
					b.Fatalf("%d keys, %v", n, err)
				}
			}
		})
	}
}
