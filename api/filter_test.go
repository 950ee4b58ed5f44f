package api

import (
	"slices"
	"testing"
)

// Prefixes are the ranges of a sorted index of "backend/server" that hold
// everything a filter selects, none inside another.
func TestFilterPrefixes(t *testing.T) {
	for _, tc := range []struct {
		sels []string
		want []string
	}{
		{nil, []string{""}},
		{[]string{"web/a"}, []string{"web/a"}},
		{[]string{"web"}, []string{"web/"}},
		{[]string{"canary_*/*"}, []string{"canary_"}},
		{[]string{"*/gke-cny-web"}, []string{""}},
		{[]string{"web/a*", "api/x", "web/b"}, []string{"api/x", "web/a", "web/b"}},
		{[]string{"web/a", "web/*"}, []string{"web/"}},
		{[]string{"w?b/a", "web/a"}, []string{"w"}},
		{[]string{`web/a\*`}, []string{"web/a"}},
	} {
		f, err := ParseFilter(tc.sels)
		if err != nil {
			t.Fatal(err)
		}
		if got := f.Prefixes(); !slices.Equal(got, tc.want) {
			t.Errorf("%q: Prefixes %q, want %q", tc.sels, got, tc.want)
		}
	}
}
