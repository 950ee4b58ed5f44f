package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"testing"
	"testing/iotest"
	"time"
)

// wireStrings are the strings a random row's fields take: empty
// (omitempty), plain, and each kind of escape and of non-ASCII
// encoding/json reads specially.
var wireStrings = []string{"", "", "", "ready 100%", "fs001", "state/fs001/a", "drain", "maint", `say "hi"`, `back\slash`,
	"<b>&amp;</b>", "tab\tnew\nline", "\x01\x1f", "café", "\u2028", "bad \xff utf-8", "\n  \"servers\": [", "日本"}

// fillRandom sets every field of v (a struct, a pointer to one, a string,
// a bool, an int, a time) at random; it refuses a kind it does not know,
// so that a field added to ServerState is read by this test.
func fillRandom(rng *rand.Rand, v reflect.Value) {
	if _, ok := v.Interface().(time.Time); ok {
		zone := []*time.Location{time.UTC, time.Local, time.FixedZone("", 3600), time.FixedZone("", -9000)}[rng.IntN(4)]
		v.Set(reflect.ValueOf(time.Unix(rng.Int64N(4e9), rng.Int64N(1e9)*int64(rng.IntN(2))).In(zone)))
		return
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(wireStrings[rng.IntN(len(wireStrings))])
	case reflect.Bool:
		v.SetBool(rng.IntN(2) == 1)
	case reflect.Int:
		v.SetInt(rng.Int64N(3001) - 1000)
	case reflect.Pointer:
		if rng.IntN(2) == 0 {
			v.SetZero()
			return
		}
		v.Set(reflect.New(v.Type().Elem()))
		fillRandom(rng, v.Elem())
	case reflect.Struct:
		for i := range v.NumField() {
			fillRandom(rng, v.Field(i))
		}
	default:
		panic(fmt.Sprintf("fillRandom: a %s field: teach readStateView and this test to read it", v.Type()))
	}
}

// jsonView is what StateOf returned before readStateView: encoding/json's
// Decoder into a StateView (ServerState.UnmarshalJSON for each row).
func jsonView(body []byte) (StateView, error) {
	var v StateView
	err := json.NewDecoder(bytes.NewReader(body)).Decode(&v)
	return v, err
}

// split cuts b where readChunks would, in chunks of 200 bytes to 20 kB.
func split(rng *rand.Rand, b []byte) [][]byte {
	first := 200 + rng.IntN(20_000)
	chunks, err := readChunks(bytes.NewReader(b), first, first)
	if err != nil {
		panic(err)
	}
	return chunks
}

// A replica's /v1/state is read by hand (readStateView takes it) into
// what encoding/json reads from it, on random rows (every field, escapes,
// invalid UTF-8, times in four zones, rows without kind); and every body
// cut or changed at random reads as encoding/json reads it, or fails
// where it fails.
func TestReadStateViewIsEncodingJSONs(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 46))
	for round := range 12 {
		v := StateView{Scope: wireStrings[rng.IntN(len(wireStrings))], HoldsState: rng.IntN(2) == 0, Total: 7, Next: "fs/x",
			InvalidKeys: []ServerState{{Key: "state/a/b/c", Source: "state/a/b/c", Error: "invalid key"}},
			Replicas:    []ReplicaAnswer{{ID: "n1", Answered: true}, {ID: "n2", Error: "dial tcp 127.0.0.1:1: refused"}}}
		for range 1 + rng.IntN(80) {
			var row ServerState
			fillRandom(rng, reflect.ValueOf(&row).Elem())
			if rng.IntN(10) == 0 {
				row.Kind = "" // an older replica's row
			}
			v.Servers = append(v.Servers, row)
		}
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetIndent("", "  ")
		if err := enc.Encode(v); err != nil {
			t.Fatal(err)
		}
		body := b.Bytes()
		want, err := jsonView(body)
		if err != nil {
			t.Fatal(err)
		}
		// In chunks that hold a row or more (a row is read from one
		// chunk), and in chunks that do not (rows across chunks, left
		// to encoding/json).
		first := 2048 + rng.IntN(4096)
		chunks, err := readChunks(bytes.NewReader(body), first, first*(1+rng.IntN(3)))
		if err != nil || !bytes.Equal(bytes.Join(chunks, nil), body) {
			t.Fatalf("round %d (seed %d): readChunks reads %d chunks (%v), not the body", round, seed, len(chunks), err)
		}
		got, ok := readStateView(chunks)
		if !ok {
			t.Fatalf("round %d (seed %d): readStateView leaves a replica's answer in %d chunks to encoding/json:\n%.2000s", round, seed, len(chunks), body)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("round %d (seed %d): readStateView reads\n%+v\nencoding/json\n%+v", round, seed, got, want)
		}
		small, err := readChunks(iotest.HalfReader(bytes.NewReader(body)), 1+rng.IntN(300), 1+rng.IntN(600))
		if err != nil || !bytes.Equal(bytes.Join(small, nil), body) {
			t.Fatalf("round %d (seed %d): readChunks reads %d small chunks (%v), not the body", round, seed, len(small), err)
		}
		if got, err := decodeState(small); err != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("round %d (seed %d): in %d small chunks, decodeState reads\n%+v (%v)\nencoding/json\n%+v", round, seed, len(small), got, err, want)
		}
		// A second servers replaces the first, as encoding/json reads it.
		twice := append(bytes.TrimSuffix(bytes.Clone(body), []byte("\n}\n")), ",\n  \"servers\": []\n}\n"...)
		if got, err := decodeState([][]byte{twice}); err != nil || len(got.Servers) != 0 {
			t.Fatalf("round %d (seed %d): a body with a second, empty servers reads %d rows (%v), encoding/json none", round, seed, len(got.Servers), err)
		}
		for range 30 {
			bad := bytes.Clone(body)
			switch i := rng.IntN(len(bad)); rng.IntN(4) {
			case 0:
				bad = bad[:i]
			case 1:
				const junk = "{}[],:\"\\ \n09-aetx"
				bad[i] = junk[rng.IntN(len(junk))]
			case 2:
				bad = append(bad[:i:i], bad[i+1:]...)
			default:
				bad = append(bad[:i:i], append([]byte(`,"servers": [], "polled": 1`), bad[i:]...)...)
			}
			want, werr := jsonView(bad)
			got, gerr := decodeState(split(rng, bad))
			if (werr == nil) != (gerr == nil) || (werr != nil && werr.Error() != gerr.Error()) {
				t.Fatalf("round %d (seed %d): a changed body fails with %v, encoding/json with %v:\n%s", round, seed, gerr, werr, bad)
			}
			if werr == nil && !reflect.DeepEqual(got, want) {
				t.Fatalf("round %d (seed %d): a changed body reads\n%+v\nencoding/json\n%+v\n%s", round, seed, got, want, bad)
			}
		}
	}
}

// A body cut after its view (the connection lost before the length it
// announced) reads as json.Decoder read it: the view, not the error; cut
// inside the view, it fails as it did.
func TestStateOfReadsAViewCutAfterItsEnd(t *testing.T) {
	v := StateView{Scope: "cluster", HoldsState: true, Total: 1, Servers: []ServerState{{Backend: "w", Server: "a", Source: "absent", Valid: true,
		Answer: "ready 100%", Kind: KindReady, Weight: 100}}}
	body, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		body []byte
		ok   bool
	}{{"after the view", body, true}, {"inside the view", body[:len(body)/2], false}} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", strconv.Itoa(len(body)+100))
			_, _ = w.Write(c.body)
		}))
		cl, err := NewClient(srv.URL, nil)
		if err != nil {
			t.Fatal(err)
		}
		got, err := cl.StateOf(context.Background(), Query{}, true)
		srv.Close()
		if c.ok && (err != nil || !reflect.DeepEqual(got.Servers, v.Servers)) {
			t.Errorf("%s: %v, %+v; want the view", c.name, err, got.Servers)
		}
		if !c.ok && !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("%s: %v, want an unexpected EOF", c.name, err)
		}
	}
}

// plainView is a view of n servers as most of a fleet's are: known by
// their polls alone, in backends of 100, one in ten with a key of its
// own and the same reason.
func plainView(n int) StateView {
	v := StateView{Scope: "cluster", HoldsState: true, Total: n, Replicas: []ReplicaAnswer{{ID: "n1", Answered: true}}}
	for i := range n {
		r := ServerState{Backend: fmt.Sprintf("fs%03d", i/100), Server: fmt.Sprintf("srv%05d", i), Source: "absent", Valid: true,
			Answer: "ready 100%", Kind: KindReady, Weight: 100, Polled: 100, Told: 100}
		if i%10 == 0 {
			r.Key, r.Value, r.Desired, r.Answer, r.Kind, r.Weight = "state/"+r.Backend+"/"+r.Server, "drain", "drain", "drain", KindDrain, 0
			r.Source, r.Reason, r.By = r.Key, `deploy "1.2"`, "ops@host"
		}
		v.Servers = append(v.Servers, r)
	}
	return v
}

// The rows are allocated once, in a list as long as they are (give or
// take the view's other braces), and a row's string that is the one
// before it is not allocated again: of 1,000 rows, one string each (its
// server's name) and one more for a key of its own (its key).
func TestReadStateViewAllocatesOnce(t *testing.T) {
	const n = 1000
	body, err := json.MarshalIndent(plainView(n), "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	chunks, err := readChunks(bytes.NewReader(body), firstChunk, maxChunk)
	if err != nil {
		t.Fatal(err)
	}
	v, ok := readStateView(chunks)
	if !ok || len(v.Servers) != n {
		t.Fatalf("readStateView reads %d rows (%v), want %d", len(v.Servers), ok, n)
	}
	if c := cap(v.Servers); c > n+5 {
		t.Errorf("the list of %d rows has room for %d: not allocated once", n, c)
	}
	allocs := testing.AllocsPerRun(5, func() { readStateView(chunks) })
	if want := float64(n + n/10 + 100); allocs > want {
		t.Errorf("readStateView of %d rows allocates %.0f times, want at most %.0f", n, allocs, want)
	}
	t.Logf("%.0f allocations", allocs)
}

// A row's string that is one of the two before it is that string only
// when its JSON text is the same: rows whose fields repeat, alternate,
// come back after two others, differ by a byte or an escape, or are
// written with \u escapes for the same value (as encoding/json reads
// them, and another writer may write them), a source that is its key
// and one that is not, in chunks that cut rows apart or do not; read
// as encoding/json reads them.
func TestReadStateViewInternsNoWrongString(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 47))
	pool := []string{"a", "b", "ab", "ba", "a ", `a"`, `a\`, "é", "e\u0301", "\u2028", "state/a/b", "state/a/c", "absent", "ready 100%", "ready 10%"}
	pick := func(prev ...string) string {
		if i := rng.IntN(len(pool) + len(prev)); i >= len(pool) {
			return prev[i-len(pool)]
		}
		return pool[rng.IntN(len(pool))]
	}
	for round := range 10 {
		v := StateView{Scope: "cluster", HoldsState: true, Total: 300}
		var prev, prev2 ServerState
		for range 300 {
			r := ServerState{Valid: true, Kind: KindReady, Weight: 100}
			for _, f := range []struct {
				s          *string
				p, p2      string
				empty, opt bool
			}{
				{&r.Backend, prev.Backend, prev2.Backend, false, false},
				{&r.Server, prev.Server, prev2.Server, false, false},
				{&r.Key, prev.Key, prev2.Key, true, true},
				{&r.Value, prev.Value, prev2.Value, true, true},
				{&r.Reason, prev.Reason, prev2.Reason, true, true},
				{&r.Answer, prev.Answer, prev2.Answer, false, false},
				{&r.Keeps, prev.Keeps, prev2.Keeps, true, true},
			} {
				if *f.s = pick(f.p, f.p2); f.opt && rng.IntN(3) == 0 {
					*f.s = ""
				}
			}
			r.Source = pick(prev.Source, prev2.Source, r.Key, r.Key)
			v.Servers = append(v.Servers, r)
			prev, prev2 = r, prev
		}
		body, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		// The same values in other texts, here and there.
		for _, c := range [][2]string{{`": "a"`, `": "\u0061"`}, {`": "ab"`, `": "a\u0062"`}, {`": "absent"`, `": "abs\u0065nt"`}} {
			parts := bytes.Split(body, []byte(c[0]))
			out := parts[0]
			for _, p := range parts[1:] {
				out = append(append(out, c[rng.IntN(2)]...), p...)
			}
			body = out
		}
		want, err := jsonView(body)
		if err != nil {
			t.Fatal(err)
		}
		first := 2048 + rng.IntN(8192)
		chunks, err := readChunks(bytes.NewReader(body), first, first)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := readStateView(chunks)
		if !ok || !reflect.DeepEqual(got, want) {
			for i := range min(len(got.Servers), len(want.Servers)) {
				if !reflect.DeepEqual(got.Servers[i], want.Servers[i]) {
					t.Fatalf("round %d (seed %d): row %d reads\n%+v\nencoding/json\n%+v", round, seed, i, got.Servers[i], want.Servers[i])
				}
			}
			t.Fatalf("round %d (seed %d): readStateView reads %d rows (%v), encoding/json %d", round, seed, len(got.Servers), ok, len(want.Servers))
		}
	}
}

// readChunks reads what io.ReadAll reads, and stops at the error it
// stops at: a body of a row or more, cut or failing at random, read in
// pieces of random sizes.
func TestReadChunksIsReadAlls(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 48))
	body, err := json.MarshalIndent(plainView(300), "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	failed := errors.New("connection reset")
	for round := range 50 {
		b := body[:rng.IntN(len(body)+1)]
		readers := map[string]func() io.Reader{
			"whole":     func() io.Reader { return bytes.NewReader(b) },
			"halves":    func() io.Reader { return iotest.HalfReader(bytes.NewReader(b)) },
			"data, EOF": func() io.Reader { return iotest.DataErrReader(bytes.NewReader(b)) },
			"failing":   func() io.Reader { return io.MultiReader(bytes.NewReader(b), iotest.ErrReader(failed)) },
		}
		first := 1 + rng.IntN(20_000)
		for name, r := range readers {
			want, werr := io.ReadAll(r())
			chunks, err := readChunks(r(), first, first*(1+rng.IntN(4)))
			if got := bytes.Join(chunks, nil); !bytes.Equal(got, want) || !errors.Is(err, werr) || (err == nil) != (werr == nil) {
				t.Fatalf("round %d (seed %d), %s, %d bytes in chunks of %d: readChunks reads %d bytes (%v), io.ReadAll %d (%v)", round, seed, name, len(b), first, len(got), err, len(want), werr)
			}
			for i, c := range chunks {
				if len(c) == 0 || (i < len(chunks)-1 && bytes.Contains(c, []byte(rowEnd)) && !bytes.HasSuffix(c, []byte(rowEnd))) {
					t.Fatalf("round %d (seed %d), %s: chunk %d of %d (%d bytes) is empty or not cut after its last row", round, seed, name, i, len(chunks), len(c))
				}
			}
		}
	}
}
