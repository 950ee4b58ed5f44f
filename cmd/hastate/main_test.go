package main

import (
	"bytes"
	"encoding/json"
	"os"
	"regexp"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/hastate/hastate/internal/version"
	"github.com/spf13/pflag"
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
		{[]string{"weight", "300%", "web/a"}, "weight 300% is above 256%"},
		{[]string{"weight", "-5%", "web/a"}, "weight -5% is below 0%"},
		{[]string{"weight", "web/a"}, "want a weight"},
		{[]string{"weight", "--bogus", "5%", "web/a"}, "unknown flag: --bogus"},
		{[]string{"drain", "web/a", "--for", "soon"}, "invalid argument"},
		// Issue 35: --for 0 is refused, naming the way to write without expiry.
		{[]string{"drain", "web/a", "--for", "0"}, "leave --for out to write a state that stays until it is cleared"},
		{[]string{"weight", "50%", "web/a", "--for", "0s"}, "--for 0 is no duration"},
		{[]string{"maint", "web/a", "--drain-first", "--for", "0"}, "--for 0 is no duration"},
		{[]string{"drain", "web/a", "--for", "-1h"}, "want a positive duration"},
		{[]string{"precheck"}, "at least one"},
		{[]string{"probe", "a/b", "c/d"}, "one <backend>/<server>"},
		{[]string{"drain"}, "at least one"},
		{[]string{"drain", "web/a/b"}, "more than one '/'"},
		{[]string{"stauts"}, `unknown command "stauts"; did you mean status?`},
		{[]string{"precheck", "--bogus", "web/a"}, "unknown flag: --bogus"},
		{[]string{"drain", "web/a", "--ramp", "soon"}, "ramp"},
		{[]string{"serve", "--peers", "x"}, "id=host:port"},
		{[]string{"serve", "--log-format", "xml"}, "json or console"},
		{[]string{"serve", "--pollers-max", "-1"}, "--pollers-max -1 is negative"},
		{[]string{"serve", "--ramp-duration", "48h"}, "ramp flags: invalid ramp policy: duration 48h0m0s"},
		{[]string{"status", "-o", "yaml"}, "table or json"},
		// Issue 45: one rule for units, and a clear message.
		{[]string{"drain", "web/a", "--for", "90"}, "--for 90 has no unit: write 90s, 90m or 90h"},
		{[]string{"drain", "web/a", "--ramp", "90"}, "--ramp 90 has no unit: write 90s, 90m or 90h"},
		{[]string{"weight", "25", "web/a"}, "weight 25 has no unit: write 25%"},
		{[]string{"status", "--timeout", "5"}, "--timeout 5 has no unit: write 5s, 5m or 5h"},
		{[]string{"maint", "web/a", "--drain-first", "--idle-timeout", "60"}, "--idle-timeout 60 has no unit"},
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

func TestVersion(t *testing.T) {
	var sub, flag bytes.Buffer
	if code := run([]string{"version"}, &sub, &sub); code != 0 {
		t.Fatalf("hastate version: exit %d %q", code, sub.String())
	}
	if code := run([]string{"--version"}, &flag, &flag); code != 0 || flag.String() != sub.String() {
		t.Fatalf("hastate --version: exit %d %q, want what hastate version prints: %q", code, flag.String(), sub.String())
	}
	for _, want := range []string{"hastate ", "revision: ", "go version: " + runtime.Version()} {
		if !strings.Contains(sub.String(), want) {
			t.Errorf("hastate version printed %q, want %q in it", sub.String(), want)
		}
	}
}

// The first log line of serve says which build it is, even when serve
// then fails.
func TestServeLogsVersionFirst(t *testing.T) {
	var out bytes.Buffer
	run([]string{"serve", "--peers", "x"}, &out, &out)
	first, _, _ := strings.Cut(out.String(), "\n")
	var line map[string]any
	if err := json.Unmarshal([]byte(first), &line); err != nil {
		t.Fatalf("first line %q is not a JSON log line: %v", first, err)
	}
	b := version.Get()
	if line["msg"] != "hastate starting" || line["version"] != b.Version || line["revision"] != b.Revision || line["goversion"] != b.GoVersion {
		t.Fatalf("first log line %q lacks version %s, revision %s, goversion %s", first, b.Version, b.Revision, b.GoVersion)
	}
}

// Issue 15.10: every subcommand's help starts with a one-line summary and
// has examples of its own, with globs quoted; no flag's usage has
// backticks (pflag turns them into the value's placeholder name), and a
// flag is listed only where it applies.
func TestHelpSaysWhatEachCommandDoes(t *testing.T) {
	unquotedGlob := regexp.MustCompile(`(^|\s)[^\s'"]*[*?]`)
	for _, c := range newRoot(nil, nil).Commands() {
		if c.Name() == "help" || c.Name() == "completion" {
			continue
		}
		var out bytes.Buffer
		run([]string{c.Name(), "--help"}, &out, &out)
		first, _, _ := strings.Cut(out.String(), "\n")
		if first == "" || strings.HasPrefix(first, "Usage:") || !strings.HasPrefix(strings.TrimSuffix(first, "."), strings.TrimSuffix(c.Short, ".")) {
			t.Errorf("hastate %s --help starts with %q, want its one-line summary %q", c.Name(), first, c.Short)
		}
		continued := false
		for _, line := range strings.Split(c.Example, "\n") {
			cmdline, _, _ := strings.Cut(line, "#")
			cont := continued
			continued = strings.HasSuffix(strings.TrimSpace(cmdline), "\\")
			if strings.TrimSpace(cmdline) == "" || cont {
				continue
			}
			if !strings.Contains(cmdline, "hastate "+c.Name()) && !strings.Contains(cmdline, "hastate --"+c.Name()) {
				t.Errorf("hastate %s: example %q is not one of its own", c.Name(), line)
			}
			if unquotedGlob.MatchString(cmdline) {
				t.Errorf("hastate %s: example %q leaves a glob to the shell", c.Name(), line)
			}
		}
		c.Flags().VisitAll(func(f *pflag.Flag) {
			if strings.Contains(f.Usage, "`") {
				t.Errorf("hastate %s --%s: usage %q has backticks", c.Name(), f.Name, f.Usage)
			}
		})
	}
	for cmd, absent := range map[string]string{"ready": "--min-ready", "clear": "--min-ready", "status": "--min-ready"} {
		var out bytes.Buffer
		run([]string{cmd, "--help"}, &out, &out)
		if strings.Contains(out.String(), absent) {
			t.Errorf("hastate %s --help lists %s, which does not apply", cmd, absent)
		}
	}
	var out bytes.Buffer
	run([]string{"ready", "--help"}, &out, &out)
	if strings.Contains(out.String(), "hastate drain") || strings.Contains(out.String(), "zonal maintenance") {
		t.Errorf("ready --help shows drain's examples:\n%s", out.String())
	}
}

// Issue 18.3: HASTATE_ADDR is bound once, by bindEnv, to the replica's
// --addr; probe's --addr (the agent port) reads HASTATE_PROBE_ADDR instead.
func TestEnvAddressesBoundOnce(t *testing.T) {
	dead := "127.0.0.1:1"
	t.Setenv("HASTATE_ADDR", dead)
	var out bytes.Buffer
	if code := run([]string{"status", "--timeout", "2s"}, &out, &out); code != 4 || !strings.Contains(out.String(), dead) {
		t.Errorf("status with HASTATE_ADDR=%s: exit %d %q; want it to ask %s", dead, code, out.String(), dead)
	}
	out.Reset()
	if code := run([]string{"probe", "web/a", "--timeout", "2s"}, &out, &out); strings.Contains(out.String(), dead) {
		t.Errorf("probe with HASTATE_ADDR set: exit %d %q; want the agent port (127.0.0.1:9777), not the HTTP address", code, out.String())
	}
	t.Setenv("HASTATE_PROBE_ADDR", "127.0.0.1:2")
	out.Reset()
	if code := run([]string{"probe", "web/a", "--timeout", "2s"}, &out, &out); code != 1 || !strings.Contains(out.String(), "127.0.0.1:2") {
		t.Errorf("probe with HASTATE_PROBE_ADDR: exit %d %q", code, out.String())
	}
}

// An operator command collects at operatorGCPercent unless GOGC is set,
// which the runtime already read and run leaves alone.
func TestOperatorCommandsGCPercent(t *testing.T) {
	was := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(was) })
	gogc, set := os.LookupEnv("GOGC")
	t.Cleanup(func() {
		if set {
			os.Setenv("GOGC", gogc)
		}
	})
	os.Unsetenv("GOGC")
	var out bytes.Buffer
	if code := run([]string{"version"}, &out, &out); code != 0 {
		t.Fatalf("hastate version: exit %d: %s", code, out.String())
	}
	if got := debug.SetGCPercent(100); got != operatorGCPercent {
		t.Errorf("without GOGC, hastate version ran at GOGC %d, want %d", got, operatorGCPercent)
	}
	t.Setenv("GOGC", "123")
	debug.SetGCPercent(123) // as the runtime did at start
	if code := run([]string{"version"}, &out, &out); code != 0 {
		t.Fatalf("hastate version: exit %d: %s", code, out.String())
	}
	if got := debug.SetGCPercent(100); got != 123 {
		t.Errorf("with GOGC=123, hastate version ran at GOGC %d, want the environment's 123", got)
	}
}
