package main

import (
	"strings"
	"testing"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/status"
	"github.com/hastate/hastate/state"
)

// Issue 27.11: a state key holds one plain word, so no hint offers JSON:
// not the root --help, not the status footer.
func TestHintsOfferNoJSON(t *testing.T) {
	var help strings.Builder
	if code := run([]string{"--help"}, &help, &help); code != 0 {
		t.Fatalf("--help: exit %d", code)
	}
	_, err := state.ParseValue("drian")
	var out strings.Builder
	if err := (status.Report{Rows: []api.ServerState{{Backend: "w", Server: "a", Kind: api.KindWithheld, Withheld: true, Error: err.Error()}}}).WriteTable(&out); err != nil {
		t.Fatal(err)
	}
	footer := out.String()[strings.Index(out.String(), "valid values:"):]
	for what, s := range map[string]string{"root --help": help.String(), "status footer": footer, "state.ValidForms": state.ValidForms} {
		if strings.Contains(s, "{") || !strings.Contains(s, "ready | drain | maint") {
			t.Errorf("%s offers JSON or not the words:\n%s", what, s)
		}
	}
}

// Issue 27.9: --min-ready -1 is a usage error, before anything is read or
// written.
func TestNegativeMinReadyIsAUsageError(t *testing.T) {
	t.Setenv("HASTATE_ADDR", "127.0.0.1:1")
	t.Setenv("CONSUL_HTTP_ADDR", "127.0.0.1:1")
	var out strings.Builder
	code := run([]string{"drain", "web/a", "--min-ready", "-1"}, &out, &out)
	if code != 2 || !strings.Contains(out.String(), "--min-ready -1") {
		t.Errorf("drain --min-ready -1: exit %d %q; want exit 2 naming --min-ready -1", code, out.String())
	}
}
