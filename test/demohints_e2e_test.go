package test

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hastate/hastate/internal/testenv"
)

// demoHint is one command line the demo prints (commands.txt, or the
// outage help of `scripts/demo.sh consul stop`) and the exit code its
// comment states ("exit N"; none stated: 0).
type demoHint struct {
	line, cmd, comment string
	exit               int
}

// exitInHint finds the exit code a hint's comment states.
var exitInHint = regexp.MustCompile(`\bexit (\d)\b`)

// demoHints reads the command lines of a command list printed by the
// demo: lines indented by two spaces or more, a command then an optional
// "# comment". Addresses to open in a browser (http://...) and the export
// line are not commands; the export line is returned on its own (the
// outage help has none: then withExport is false).
func demoHints(t *testing.T, text string, withExport bool) (export string, hints []demoHint) {
	t.Helper()
	comment := regexp.MustCompile(`\s+#\s`)
	for _, l := range strings.Split(text, "\n") {
		if !strings.HasPrefix(l, "  ") {
			continue
		}
		cmd, note := strings.TrimSpace(l), ""
		if loc := comment.FindStringIndex(cmd); loc != nil {
			cmd, note = strings.TrimSpace(cmd[:loc[0]]), strings.TrimSpace(cmd[loc[1]:])
		}
		switch {
		case strings.HasPrefix(cmd, "export "):
			export = cmd
			continue
		case strings.HasPrefix(cmd, "http://"), strings.HasPrefix(cmd, "While "):
			continue
		}
		h := demoHint{line: strings.TrimSpace(l), cmd: cmd, comment: note}
		if m := exitInHint.FindStringSubmatch(note); m != nil {
			h.exit, _ = strconv.Atoi(m[1])
		}
		hints = append(hints, h)
	}
	if (withExport && export == "") || len(hints) == 0 {
		t.Fatalf("no export line or no commands in the demo's command list:\n%s", text)
	}
	return export, hints
}

// TestE2EDemoHints runs, in order and in a shell of its own with the
// export line the demo prints, every command of the demo's commands.txt,
// and every command of the outage help `scripts/demo.sh consul stop`
// prints, and checks the exit code each hint states (0 where it states
// none). Issue 45: the hint "exit 4: cannot confirm" after a replica is
// killed had been wrong since issue 34 (the replicas that are up decide).
// It also checks the demo's noise: no bash "Killed" job line when a
// replica is killed, and the seeded keys' meta names no lifted guard.
func TestE2EDemoHints(t *testing.T) {
	d := testenv.NewDemo(t, "..", hastateBin)
	d.Extra = []string{"HAPROXY_BIN=" + haproxyBin(t), "PROMETHEUS_BIN=" + prometheusBin(t)}
	d.Start(t)
	txt, err := os.ReadFile(filepath.Join(d.Dir, "commands.txt"))
	if err != nil {
		t.Fatal(err)
	}
	export, hints := demoHints(t, string(txt), true)
	// The seeded keys were written with every guard holding.
	for _, k := range []string{"canary_web/web-2", "canary_api/api-1"} {
		resp, err := http.Get("http://" + d.Addr(1, 8500) + "/v1/kv/hastate/meta/" + k + "?raw")
		if err != nil {
			t.Fatal(err)
		}
		meta, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || strings.Contains(string(meta), "lifted") {
			t.Errorf("the demo's seeded meta key of %s: HTTP %d %s; want one that names no lifted guard", k, resp.StatusCode, meta)
		}
	}
	check := func(h demoHint) string {
		t.Helper()
		out, code := d.Shell(t, export+"\n"+h.cmd)
		// verify during the demo's ramp may find a row pending (the
		// answer changed after HAProxy's newest sample): it exits 4 and
		// says to run it again after the next scrape, as an operator would.
		pending := func() bool {
			return code == 4 && h.exit == 0 && strings.HasPrefix(h.cmd, "hastate verify") &&
				strings.Contains(out, "run verify again after the next scrape")
		}
		if pending() {
			t.Logf("verify found a pending row (the ramp moved); again until it is not, as it says:\n%s", lastLines(out, 2))
			testenv.Eventually(t, 15*time.Second, func() error {
				out, code = d.Shell(t, export+"\n"+h.cmd)
				return testenv.Expect(!pending(), "verify still finds a row pending:\n%s", lastLines(out, 2))
			})
		}
		if code != h.exit {
			t.Errorf("the demo hints\n  %s\nbut it exits %d, not %d:\n%s", h.line, code, h.exit, out)
		} else {
			t.Logf("exit %d as hinted: %s", code, h.line)
		}
		return out
	}
	// A second demo started beside it finds the addresses in use without
	// speaking to the agent ports: no replica counts a malformed check.
	before := demoAgentErrors(t, d)
	if out, code := d.Script(t); code != 1 || !strings.Contains(out, "already in use") {
		t.Fatalf("a second demo beside the running one: exit %d:\n%s", code, out)
	}
	if after := demoAgentErrors(t, d); after != before {
		t.Errorf("a second demo made the replicas count %v malformed or timed-out agent checks", after-before)
	}
	ran := 0
	for _, h := range hints {
		out := check(h)
		ran++
		if strings.Contains(h.cmd, "demo.sh consul stop") {
			_, outage := demoHints(t, out, false)
			for _, o := range outage {
				if strings.Contains(o.cmd, "consul start") {
					continue // the next line of commands.txt
				}
				check(o)
				ran++
			}
		}
		if strings.HasPrefix(h.cmd, "kill -9") {
			testenv.Eventually(t, 10*time.Second, func() error {
				return testenv.Expect(strings.Contains(d.Output(), "demo: hastate-0 exited"), "the demo does not say hastate-0 exited:\n%s", lastLines(d.Output(), 5))
			})
			if strings.Contains(d.Output(), "Killed") {
				t.Errorf("the demo prints bash's job line for the killed replica:\n%s", lastLines(d.Output(), 5))
			}
		}
	}
	t.Logf("%d hinted commands run", ran)
}

// demoAgentErrors sums, over the demo's three replicas, the agent checks
// counted malformed or timed out.
func demoAgentErrors(t *testing.T, d *testenv.Demo) float64 {
	t.Helper()
	sum := 0.0
	for i := 2; i <= 4; i++ {
		resp, err := http.Get("http://" + d.Addr(i, 9778) + "/-/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, `hastate_agent_checks_total{result="malformed"}`) || strings.HasPrefix(l, `hastate_agent_checks_total{result="timeout"}`) {
				f := strings.Fields(l)
				v, _ := strconv.ParseFloat(f[len(f)-1], 64)
				sum += v
			}
		}
	}
	return sum
}
