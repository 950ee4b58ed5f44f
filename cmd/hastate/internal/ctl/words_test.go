package ctl

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hastate/hastate/api"
)

// Issue 27.10: a selector that matches nothing suggests the near names,
// as a typo'd command does.
func TestNoMatchSuggestsNearNames(t *testing.T) {
	rows := []api.ServerState{
		{Backend: "canary_web", Server: "web-1"}, {Backend: "canary_web", Server: "web-2"},
		{Backend: "canary_api", Server: "api-1"}, {Backend: "main_web", Server: "*"},
	}
	for _, tc := range []struct {
		sel  Selector
		want string // "" none
	}{
		{Selector{"canry_web", "*"}, "did you mean canary_web?"},
		{Selector{"Canary_Web", "*"}, "did you mean canary_web?"},
		{Selector{"canary_wbe", "web-1"}, "did you mean canary_web/web-1?"},
		{Selector{"canary_web", "web1"}, "did you mean canary_web/web-1 or canary_web/web-2?"},
		{Selector{"billing", "*"}, ""},
		{Selector{"canry_*", "*"}, ""},
	} {
		err := NoMatch(tc.sel, rows)
		if !errors.Is(err, ErrNoMatch) {
			t.Fatalf("%s: %v, want ErrNoMatch", tc.sel, err)
		}
		if got := err.Error(); (tc.want == "" && strings.Contains(got, "did you mean")) || !strings.Contains(got, tc.want) {
			t.Errorf("%s: %q, want %q", tc.sel, got, cmpOr(tc.want, "no suggestion"))
		}
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// Issue 27.12: the hint to delete a key no selector can name has the
// prefix when the command knows it.
func TestUnnamableKeyHintHasThePrefix(t *testing.T) {
	_, err := ParseSelectorsIn("gitlab-haproxy-agent/", []string{"web/a/b"})
	if !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), "consul kv delete 'gitlab-haproxy-agent/state/web/a/b'") {
		t.Errorf("ParseSelectorsIn: %v, want a usage error with the whole key", err)
	}
}

func TestAgo(t *testing.T) {
	for d, want := range map[time.Duration]string{40 * time.Second: "40s ago", 90 * time.Second: "2m ago",
		3*time.Hour + 12*time.Minute: "3h12m ago", 53 * time.Hour: "2d5h ago"} {
		if got := Ago(d); got != want {
			t.Errorf("Ago(%s) = %q, want %q", d, got, want)
		}
	}
}

// Issue 27.13: an error of a kind says why, not the kind's name.
func TestErrorfKeepsTheKindOutOfTheWords(t *testing.T) {
	err := Errorf(ErrNotDone, "blocked: 1 of 1 selected server blocks the deploy")
	if !errors.Is(err, ErrNotDone) || strings.HasPrefix(err.Error(), "not done") {
		t.Errorf("%q: want ErrNotDone without the words", err)
	}
}
