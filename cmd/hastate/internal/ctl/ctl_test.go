package ctl

import (
	"errors"
	"strings"
	"testing"
)

func TestParseSelectors(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string // joined selectors, or the error substring after "ERR:"
	}{
		{[]string{"web/a", "web/*", "web/a"}, "web/a web/*"},
		{[]string{"web"}, "web/*"},
		{[]string{"canary_web/web 3"}, "canary_web/web 3"},
		{[]string{"a/b\tc"}, "ERR:consul kv delete '<kv-prefix>state/a/b\tc'"},
		{[]string{"canary_*/*", "*/gke-cny-web", "*/*-us-east1-b"}, "canary_*/* */gke-cny-web */*-us-east1-b"},
		{nil, "ERR:at least one"},
		{[]string{"web/"}, "ERR:not <backend>/<server>"},
		{[]string{"/a"}, "ERR:not <backend>/<server>"},
		{[]string{"a/b/c"}, "ERR:more than one '/'; if it is a key in KV, no agent request can name it: remove it with `consul kv delete '<kv-prefix>state/a/b/c'`"},
		{[]string{"web/[a"}, "ERR:bad glob"},
	} {
		got, err := ParseSelectors(tt.args)
		if strings.HasPrefix(tt.want, "ERR:") {
			if !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), tt.want[4:]) {
				t.Errorf("ParseSelectors(%q) err = %v, want usage error with %q", tt.args, err, tt.want[4:])
			}
			continue
		}
		var s []string
		for _, x := range got {
			s = append(s, x.String())
		}
		if err != nil || strings.Join(s, " ") != tt.want {
			t.Errorf("ParseSelectors(%q) = %v, %v", tt.args, s, err)
		}
	}
}
