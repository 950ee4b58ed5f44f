package ctl

import (
	"errors"
	"strings"
	"testing"

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
		err := noMatch(tc.sel, rows)
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
	var out strings.Builder
	rep := StatusReport{Prefix: "hastate/", InvalidKeys: []api.ServerState{{Key: "state/web/a/b", Source: "state/web/a/b", Error: "invalid key"}}}
	if err := rep.WriteTable(&out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "consul kv delete 'hastate/state/web/a/b'") {
		t.Errorf("status lists a nested key without its delete command:\n%s", out.String())
	}
}

// Issue 27.13: counts agree with what they count.
func TestWriteReportCounts(t *testing.T) {
	var out strings.Builder
	p := Plan{Command: "drain", Written: true, Ops: []Op{{Key: "hastate/state/web/a", Value: `{"state":"drain","by":"alice"}`}}}
	p.Report(&out)
	if first := strings.SplitN(out.String(), "\n", 2)[0]; first != "drain: 1 key (2 operations: with its meta key) written in one Consul transaction:" {
		t.Errorf("header %q", first)
	}
	out.Reset()
	p.Ops = append(p.Ops, Op{Delete: true, Key: "hastate/state/web/b"})
	p.Report(&out)
	if first := strings.SplitN(out.String(), "\n", 2)[0]; first != "drain: 2 keys (4 operations: state keys with their meta keys) written in one Consul transaction:" {
		t.Errorf("header %q", first)
	}
	out.Reset()
	MigrateResult{Rewritten: []string{"state/web/a"}}.Print(&out, false)
	if !strings.Contains(out.String(), "1 JSON state key rewritten") {
		t.Errorf("migrate-kv: %q", out.String())
	}
	err := Errorf(ErrNotDone, "blocked: 1 of 1 selected server blocks the deploy")
	if !errors.Is(err, ErrNotDone) || strings.HasPrefix(err.Error(), "not done") {
		t.Errorf("%q: want ErrNotDone without the words", err)
	}
}
