package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestEveryCommandHasHelpWithExample(t *testing.T) {
	for _, c := range newRoot(nil, nil).Commands() {
		if c.Name() == "help" || c.Name() == "completion" {
			continue
		}
		var out bytes.Buffer
		code := run([]string{c.Name(), "--help"}, &out, &out)
		if code != 0 || !strings.Contains(out.String(), "Examples:") || !strings.Contains(out.String(), "hastate "+c.Name()) {
			t.Errorf("hastate %s --help (exit %d) lacks an example:\n%s", c.Name(), code, out.String())
		}
	}
}

func TestInvalidInputIsRefusedWithTheValidForms(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"weight", "300%", "web/a"}, "valid forms"},
		{[]string{"weight", "web/a"}, "want a weight"},
		{[]string{"drain"}, "at least one"},
		{[]string{"drain", "web"}, "<backend>/<server>"},
		{[]string{"drain", "web/a", "--ramp", "soon"}, "ramp"},
		{[]string{"serve", "--peers", "x"}, "id=host:port"},
		{[]string{"serve", "--log-format", "xml"}, "json or console"},
		{[]string{"serve", "--pollers-max", "0"}, "--pollers-max 0: want a positive number"},
		{[]string{"status", "-o", "yaml"}, "table or json"},
	} {
		var out bytes.Buffer
		code := run(tt.args, &out, &out)
		if code != 2 || !strings.Contains(out.String(), tt.want) {
			t.Errorf("hastate %s: exit %d, output %q; want exit 2 mentioning %q", strings.Join(tt.args, " "), code, out.String(), tt.want)
		}
	}
}

func TestEnvOverridesFlagDefaults(t *testing.T) {
	t.Setenv("HASTATE_LOG_FORMAT", "xml")
	var out bytes.Buffer
	if code := run([]string{"serve"}, &out, &out); code != 2 || !strings.Contains(out.String(), "xml") {
		t.Fatalf("HASTATE_LOG_FORMAT not read: exit %d %q", code, out.String())
	}
	t.Setenv("HASTATE_LOG_FORMAT", "json")
	t.Setenv("HASTATE_POLLERS_MAX", "-3")
	out.Reset()
	if code := run([]string{"serve"}, &out, &out); code != 2 || !strings.Contains(out.String(), "--pollers-max -3") {
		t.Fatalf("HASTATE_POLLERS_MAX not read: exit %d %q", code, out.String())
	}
}
