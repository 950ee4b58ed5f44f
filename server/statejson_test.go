package server

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http/httptest"
	"reflect"
	"testing"
	"time"

	"github.com/hastate/hastate/api"
)

// TestStateViewJSONIsWriteJSONs: writeStateView writes the bytes
// writeJSON (encoding/json, indented) writes, for views of 0, 1 and 600
// random rows (across the yields) whose every field is set at random,
// strings that need escaping, nil and set pointers and times in other
// zones included. A field added to api.ServerState or api.RampProgress
// and not to api.AppendRowJSON fails here (randomValue fills every field by
// reflection and refuses a kind it does not know).
func TestStateViewJSONIsWriteJSONs(t *testing.T) {
	r := rand.New(rand.NewPCG(46, 1))
	for _, n := range []int{0, 1, 2, 600} {
		for round := range 5 {
			v := api.StateView{Scope: pick(r, jsonStrings), HoldsState: r.IntN(2) == 0, Total: n, Truncated: round%2 == 0,
				Selectors: []string{"web/*"}, Next: pick(r, jsonStrings),
				InvalidKeys: []api.ServerState{randomRow(r)}, Replicas: []api.ReplicaAnswer{{ID: "n2", Answered: true}}}
			for range n {
				v.Servers = append(v.Servers, randomRow(r))
			}
			want, got := httptest.NewRecorder(), httptest.NewRecorder()
			writeJSON(want, 200, v)
			writeStateView(got, v)
			sameAnswer(t, fmt.Sprintf("%d rows, round %d", n, round), got, want)
		}
	}
}

// sameAnswer fails t unless got is want byte for byte (status, content
// type, body), saying where the bodies differ.
func sameAnswer(t *testing.T, what string, got, want *httptest.ResponseRecorder) {
	t.Helper()
	if a, b := got.Body.Bytes(), want.Body.Bytes(); !bytes.Equal(a, b) {
		i := 0
		for i < min(len(a), len(b)) && a[i] == b[i] {
			i++
		}
		t.Fatalf("%s: bodies differ at byte %d:\n got  %q\n want %q", what, i,
			a[max(i-120, 0):min(i+80, len(a))], b[max(i-120, 0):min(i+80, len(b))])
	}
	if got.Code != want.Code || got.Header().Get("Content-Type") != want.Header().Get("Content-Type") {
		t.Fatalf("%s: answer %d %q, want %d %q", what, got.Code, got.Header().Get("Content-Type"), want.Code, want.Header().Get("Content-Type"))
	}
}

// jsonStrings are the strings randomValue picks from: empty (omitempty),
// plain, and every kind encoding/json escapes.
var jsonStrings = []string{"", "", "web", "ready 50%", "state/web/a", `say "hi"`, `back\slash`, "<b>&amp;</b>",
	"line\nbreak\ttab\r", "\x00\x1f control \b\f\x7f", `{"state":"drain","reason":"a <b>"}`, "naïve café", "\u2028\u2029", "bad \xff\xfe utf-8", "\n  \"servers\": []", "日本", "a+b'c"}

func pick(r *rand.Rand, s []string) string { return s[r.IntN(len(s))] }

func randomRow(r *rand.Rand) api.ServerState {
	var s api.ServerState
	randomValue(r, reflect.ValueOf(&s).Elem())
	return s
}

// randomValue sets v, and every field of a struct, at random.
func randomValue(r *rand.Rand, v reflect.Value) {
	switch v.Interface().(type) {
	case time.Time:
		zones := []*time.Location{time.UTC, time.FixedZone("", -7*3600), time.FixedZone("X", 5*3600+1800), time.Local}
		t := time.Unix(r.Int64N(4e9), r.Int64N(1e9)*int64(r.IntN(2))).In(zones[r.IntN(len(zones))])
		if r.IntN(8) == 0 {
			t = time.Time{} // "0001-01-01T00:00:00Z"
		}
		v.Set(reflect.ValueOf(t))
		return
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(pick(r, jsonStrings))
	case reflect.Bool:
		v.SetBool(r.IntN(2) == 0)
	case reflect.Int:
		v.SetInt(int64(r.IntN(2001) - 1000))
	case reflect.Uint64:
		v.SetUint([]uint64{0, 1, 12345, math.MaxUint32, math.MaxUint64}[r.IntN(5)])
	case reflect.Slice:
		n := r.IntN(4)
		sl := reflect.MakeSlice(v.Type(), n, n)
		for i := range n {
			randomValue(r, sl.Index(i))
		}
		v.Set(sl)
	case reflect.Pointer:
		if r.IntN(2) == 0 {
			return
		}
		p := reflect.New(v.Type().Elem())
		randomValue(r, p.Elem())
		v.Set(p)
	case reflect.Struct:
		for i := range v.NumField() {
			randomValue(r, v.Field(i))
		}
	default:
		panic(fmt.Sprintf("randomValue: a %s field: teach api.AppendRowJSON (api.AppendPollJSON) and this test its encoding", v.Type()))
	}
}

// BenchmarkStateViewJSON: writeStateView against writeJSON, 10,000 rows
// (one in ten drained by a key, the others ready without one).
func BenchmarkStateViewJSON(b *testing.B) {
	since := time.Date(2026, 12, 7, 9, 30, 0, 0, time.UTC)
	v := api.StateView{Scope: "cluster"}
	for i := range 10000 {
		row := api.ServerState{Backend: fmt.Sprintf("be%03d", i/100), Server: fmt.Sprintf("srv-%04d", i), Source: "absent",
			Valid: true, Answer: "ready 100%", Kind: api.KindReady, Weight: 100, Polled: 100, Told: 100}
		if i%10 == 0 {
			row.Key, row.Source = "hastate/state/"+row.Backend+"/"+row.Server, "hastate/state/"+row.Backend+"/"+row.Server
			row.Value, row.Desired, row.Reason, row.By = `{"state":"drain","reason":"kernel upgrade"}`, "drain", "kernel upgrade", "alice"
			row.Answer, row.Kind, row.Weight, row.Since = "drain", api.KindDrain, 0, &since
		}
		v.Servers = append(v.Servers, row)
	}
	for _, c := range []struct {
		name  string
		write func(*httptest.ResponseRecorder)
	}{
		{"encoding-json", func(w *httptest.ResponseRecorder) { writeJSON(w, 200, v) }},
		{"rows", func(w *httptest.ResponseRecorder) { writeStateView(w, v) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				c.write(httptest.NewRecorder())
			}
		})
	}
}
