package main

import (
	"bytes"
	"strings"
	"testing"
)

// The Prometheus flags are checked before anything is read or written.
func TestPrometheusFlagsAreUsageErrors(t *testing.T) {
	for _, tt := range []struct {
		env  string // HASTATE_PROMETHEUS_URL
		args []string
		want string
	}{
		{"", []string{"verify", "web/a"}, "set --prometheus or HASTATE_PROMETHEUS_URL"},
		{"", []string{"wait", "web/a", "--idle"}, "set --prometheus or HASTATE_PROMETHEUS_URL"},
		{"ftp://prom", []string{"verify", "web/a"}, `--prometheus "ftp://prom": want http://host:port`},
		{"prom:9090", []string{"verify", "web/a", "--proxy-label", "back-end"}, `--proxy-label "back-end"`},
		{"prom:9090", []string{"wait", "web/a", "--idle", "--max-sample-age", "-1s"}, "--max-sample-age -1s"},
		{"prom:9090", []string{"maint", "web/a", "--drain-first", "--instance-label", "proxy"}, "both name label"},
		{"prom:9090", []string{"verify"}, "at least one"},
	} {
		t.Setenv("HASTATE_PROMETHEUS_URL", tt.env)
		// Nothing listens here: a command that got past its flags would
		// fail to reach it (exit 1), not exit 2.
		t.Setenv("HASTATE_ADDR", "127.0.0.1:1")
		t.Setenv("CONSUL_HTTP_ADDR", "127.0.0.1:1")
		var out bytes.Buffer
		code := run(tt.args, &out, &out)
		if code != 2 || !strings.Contains(out.String(), tt.want) {
			t.Errorf("HASTATE_PROMETHEUS_URL=%s hastate %s: exit %d, output %q; want exit 2 mentioning %q", tt.env, strings.Join(tt.args, " "), code, out.String(), tt.want)
		}
	}
}
