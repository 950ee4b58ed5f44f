package main

import (
	"strings"
	"testing"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/internal/ctl"
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
	if err := (ctl.StatusReport{Rows: []api.ServerState{{Backend: "w", Server: "a", Kind: api.KindWithheld, Withheld: true, Error: err.Error()}}}).WriteTable(&out); err != nil {
		t.Fatal(err)
	}
	footer := out.String()[strings.Index(out.String(), "valid values:"):]
	for what, s := range map[string]string{"root --help": help.String(), "status footer": footer, "state.ValidForms": state.ValidForms} {
		if strings.Contains(s, "{") || !strings.Contains(s, "ready | drain | maint") {
			t.Errorf("%s offers JSON or not the words:\n%s", what, s)
		}
	}
}
