package server

import (
	"bytes"
	"html/template"
	"math/rand/v2"
	"os"
	"reflect"
	"testing"
)

// TestPageRowsAreTheTemplates: writeRows writes the bytes that the
// status page's template wrote for its table before issue 46
// (testdata/page-rows.tmpl, the same html/template escaping), for random
// backends whose rows have every field set at random: strings with every
// character html/template escapes, missing and present ramps, empty and
// full cells. A field the template would show that appendPageRow forgets,
// or an escape it gets wrong, fails here.
func TestPageRowsAreTheTemplates(t *testing.T) {
	text, err := os.ReadFile("testdata/page-rows.tmpl")
	if err != nil {
		t.Fatal(err)
	}
	oracle := template.Must(template.New("rows").Parse(string(text)))
	r := rand.New(rand.NewPCG(46, 3))
	for round := range 200 {
		backends := make([]pageBackend, r.IntN(4))
		for i := range backends {
			randomValue(r, reflect.ValueOf(&backends[i]).Elem())
		}
		var want bytes.Buffer
		if err := oracle.Execute(&want, struct{ Backends []pageBackend }{backends}); err != nil {
			t.Fatal(err)
		}
		var rows bytes.Buffer
		writeRows(&rows, backends)
		got := rows.Bytes()
		if !bytes.Equal(got, want.Bytes()) {
			i := 0
			for i < min(len(got), want.Len()) && got[i] == want.Bytes()[i] {
				i++
			}
			t.Fatalf("round %d: rows differ at byte %d:\n got  %q\n want %q", round, i,
				got[max(i-150, 0):min(i+80, len(got))], want.Bytes()[max(i-150, 0):min(i+80, want.Len())])
		}
	}
}
