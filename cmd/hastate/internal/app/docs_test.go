package app

import (
	"fmt"
	"os"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/hastate/hastate/state"
)

// Issue 45: the docs disagreed with each other and with the code: the
// Consul retry back-off "capped at 5 s" (README) and "at most 30 s" (the
// runbook), feature level 2 (README) against 3 (serve --help,
// /v1/cluster). Every figure of the back-off cap and of this release's
// feature level in the README and the runbook is the code's.
func TestDocsSayTheCode(t *testing.T) {
	read := func(f string) string {
		b, err := os.ReadFile("../../../../" + f)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	readme, runbook := read("README.md"), read("docs/runbook.md")
	backoff := regexp.MustCompile(`(?:backoff|back-off)[^.]{0,40}?(?:capped at|at most) (\d+) ?s\b`)
	found := 0
	for f, s := range map[string]string{"README.md": readme, "docs/runbook.md": runbook} {
		for _, m := range backoff.FindAllStringSubmatch(s, -1) {
			found++
			if n, _ := strconv.Atoi(m[1]); time.Duration(n)*time.Second != KVBackoffMax {
				t.Errorf("%s says %q: the leader's Consul back-off is capped at %s (KVBackoffMax)", f, m[0], KVBackoffMax)
			}
		}
	}
	if found < 2 {
		t.Errorf("found %d statements of the Consul back-off cap in README.md and docs/runbook.md, want the README's and the runbook's", found)
	}
	level := regexp.MustCompile("`--feature-level` \\| `0` \\(this release's, (\\d)\\)")
	m := level.FindStringSubmatch(readme)
	if m == nil || m[1] != fmt.Sprint(state.MaxLevel) {
		t.Errorf("README's --feature-level row says this release's level is %v; it is %d (state.MaxLevel)", m, state.MaxLevel)
	}
}
