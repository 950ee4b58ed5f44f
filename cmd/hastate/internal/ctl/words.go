package ctl

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// kindError is an error of a kind (errors.Is finds ErrNotDone, say) whose
// text does not start with the kind's name: a precheck that blocks says
// why, not "not done:".
type kindError struct {
	kind error
	msg  string
}

func (e *kindError) Error() string { return e.msg }
func (e *kindError) Unwrap() error { return e.kind }

// Errorf is fmt.Errorf for an error of kind (its exit code) whose message
// is format alone.
func Errorf(kind error, format string, a ...any) error {
	return &kindError{kind: kind, msg: fmt.Sprintf(format, a...)}
}

// didYouMean is "; did you mean X?" for the names among known that are
// close to name (an edit distance of at most 2, or the same but for case),
// nearest first; "" when none is. name with glob characters has none.
func didYouMean(name string, known []string) string {
	if Globbed(name) {
		return ""
	}
	type near struct {
		name string
		d    int
	}
	var ns []near
	for _, k := range known {
		if k == name {
			return ""
		}
		if d := distance(strings.ToLower(name), strings.ToLower(k)); d <= 2 {
			ns = append(ns, near{k, d})
		}
	}
	if len(ns) == 0 {
		return ""
	}
	slices.SortStableFunc(ns, func(a, b near) int { return a.d - b.d })
	var names []string
	for _, n := range ns[:min(len(ns), 3)] {
		names = append(names, n.name)
	}
	return "; did you mean " + strings.Join(names, " or ") + "?"
}

// distance is the Levenshtein distance of a and b (bytes).
func distance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

func SelList(sels []Selector) string {
	var s []string
	for _, x := range sels {
		s = append(s, x.String())
	}
	return strings.Join(s, " ")
}

func Plural(n int, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}

func OrNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

// RoundAge renders an age for a message: 0.4s, 12s, 3m10s.
func RoundAge(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < 10*time.Second:
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// SampleAge renders the age of the newest sample; "(none)" when there
// is none (negative).
func SampleAge(d time.Duration) string {
	if d < 0 {
		return "(none)"
	}
	return d.Round(100 * time.Millisecond).String()
}

// PluralN is "1 server", "2 servers".
func PluralN(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

// Ago renders a duration for a status table: "42s ago", "3h12m ago",
// "2d5h ago".
func Ago(d time.Duration) string {
	switch {
	case d < time.Minute:
		return d.Round(time.Second).String() + " ago"
	case d < 24*time.Hour:
		return strings.TrimSuffix(d.Round(time.Minute).String(), "0s") + " ago"
	}
	return fmt.Sprintf("%dd%dh ago", int(d.Hours())/24, int(d.Hours())%24)
}
