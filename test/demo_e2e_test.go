package test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hastate/hastate/internal/testenv"
	promapi "github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
)

// demoServers are the example servers scripts/demo.sh configures.
var demoServers = []string{"canary_web/web-1", "canary_web/web-2", "canary_api/api-1", "canary_api/api-2"}

// TestE2EDemo runs `make demo`'s script as a user would (issue 35): in a
// terminal, under `| tee`, stopped with Ctrl-C. It makes a drain, stops
// the demo and starts it again (the drain is still served, every answer
// the same), stops Consul with `scripts/demo.sh consul stop` (answers
// unchanged, writes refused naming Consul, the demo keeps running),
// starts it again, runs verify and wait --idle against the demo's
// Prometheus, and finally checks that no process of the demo is left.
// Everything listens on a loopback block of its own (127.a.b.x).
func TestE2EDemo(t *testing.T) {
	d := testenv.NewDemo(t, "..", hastateBin)
	d.Extra = []string{"HAPROXY_BIN=" + haproxyBin(t), "PROMETHEUS_BIN=" + prometheusBin(t)}
	hastate := func(want int, args ...string) string {
		t.Helper()
		out, code := d.Hastate(t, args...)
		if code != want {
			t.Fatalf("hastate %s: exit %d, want %d:\n%s", strings.Join(args, " "), code, want, out)
		}
		return out
	}
	lbAgent := d.Addr(1, 9777)
	answers := func() map[string]string {
		t.Helper()
		m := map[string]string{}
		for _, s := range demoServers {
			m[s] = strings.TrimSpace(hastate(0, "probe", s, "--addr", lbAgent))
		}
		return m
	}

	// 1. A fresh demo; a drain.
	start := time.Now()
	out := d.Start(t)
	t.Logf("the demo ran %s after it started (net %s, dir %s)", time.Since(start).Round(100*time.Millisecond), d.Net, d.Dir)
	for _, want := range []string{"demo: a fresh demo", "HASTATE_PROMETHEUS_URL=http://" + d.Addr(1, 9090), "hastate verify",
		"http://" + d.Addr(2, 9778) + "/-/metrics", "scripts/demo.sh consul stop", "three HAProxy nodes on " + d.Net + ".11, " + d.Net + ".12, " + d.Net + ".13"} {
		if !strings.Contains(out, want) {
			t.Fatalf("the demo's first screen lacks %q:\n%s", want, out)
		}
	}
	hastate(0, "drain", "canary_api/api-2", "--reason", "demo test")
	out = hastate(0, "wait", "canary_api/api-2")
	t.Logf("wait after the drain: %s", lastLine(out))
	// Every HAProxy node was told, each from its own address.
	status := hastate(0, "status", "canary_api/api-2")
	if !strings.Contains(status, "3/3") {
		t.Fatalf("status after wait: not told to 3 of 3 HAProxy nodes:\n%s", status)
	}
	before := answers()
	if before["canary_api/api-2"] != "drain" || before["canary_web/web-2"] != "drain" || before["canary_api/api-1"] != "ready 50%" {
		t.Fatalf("answers after the drain: %v", before)
	}

	// 2. Ctrl-C in the terminal, under tee: the stopping lines still show.
	term, tee := d.Interrupt(t, 90*time.Second)
	for _, want := range []string{"demo: stopping...", "demo: stopped (data and logs kept in"} {
		if !strings.Contains(term, want) {
			t.Fatalf("after Ctrl-C the terminal does not show %q (tee kept %d bytes):\n%s", want, len(tee), lastLines(term, 8))
		}
	}
	if left := d.Processes(); len(left) > 0 {
		t.Fatalf("processes left after Ctrl-C:\n%s", strings.Join(left, "\n"))
	}

	// Again: it resumes, and the drain is served from the first answer on.
	start = time.Now()
	out = d.StartPlain(t)
	t.Logf("the resumed demo ran %s after it started", time.Since(start).Round(100*time.Millisecond))
	if !strings.Contains(out, "demo: resuming the demo of ") || strings.Contains(out, "a fresh demo") {
		t.Fatalf("the second start does not say it resumed:\n%s", out)
	}
	if after := answers(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("answers after the restart %v, before %v", after, before)
	}
	hastate(0, "wait", "canary_api/api-2")

	// 3. Consul stops: the demo keeps running and says what to look at;
	// the answers stay; a write is refused naming Consul.
	out, code := d.Script(t, "consul", "stop")
	if code != 0 || !strings.Contains(out, "While Consul is down") || !strings.Contains(out, "HastateKVSyncStale") {
		t.Fatalf("scripts/demo.sh consul stop: exit %d:\n%s", code, out)
	}
	stopped := time.Now()
	testenv.Eventually(t, 10*time.Second, func() error {
		return testenv.Expect(strings.Contains(d.Output(), "demo: Consul stopped (scripts/demo.sh consul stop); the demo keeps running"),
			"the demo does not say Consul stopped:\n%s", lastLines(d.Output(), 5))
	})
	out = hastate(4, "drain", "canary_api/api-1", "--reason", "during the outage")
	if !strings.Contains(out, "consul at "+d.Addr(1, 8500)) || !strings.Contains(out, "nothing was written") {
		t.Fatalf("a write with Consul down does not name Consul and say nothing was written:\n%s", out)
	}
	testenv.Eventually(t, 20*time.Second, func() error {
		out, _ := d.Hastate(t, "status")
		return testenv.Expect(strings.Contains(out, "Consul not synced"), "status does not say Consul is not synced:\n%s", out)
	})
	t.Logf("status says Consul is not synced %s after it stopped", time.Since(stopped).Round(100*time.Millisecond))
	for range 3 {
		if during := answers(); fmt.Sprint(during) != fmt.Sprint(before) {
			t.Fatalf("answers with Consul down %v, before %v", during, before)
		}
	}
	if !d.Running() {
		t.Fatalf("the demo ended with Consul down:\n%s", d.Output())
	}

	// 4. Consul again, with its data: the refused write wrote nothing.
	out, code = d.Script(t, "consul", "start")
	if code != 0 || !strings.Contains(out, "Consul started again") {
		t.Fatalf("scripts/demo.sh consul start: exit %d:\n%s", code, out)
	}
	testenv.Eventually(t, 30*time.Second, func() error {
		out, _ := d.Hastate(t, "status")
		return testenv.Expect(!strings.Contains(out, "Consul not synced") && strings.Contains(out, "ready 50%"), "after Consul started again:\n%s", out)
	})

	// 5. verify and wait --idle through the demo's Prometheus, which
	// scrapes three HAProxy exporters and each replica on its own.
	prom := promClient(t, "http://"+d.Addr(1, 9090))
	testenv.Eventually(t, 30*time.Second, func() error {
		h, r := promCount(prom, `up{job="haproxy"} == 1`), promCount(prom, `up{job="hastate"} == 1`)
		return testenv.Expect(h == 3 && r == 3, "Prometheus scrapes %d of 3 HAProxy exporters and %d of 3 replicas", h, r)
	})
	hastate(0, "weight", "25%", "canary_api/api-2", "--reason", "demo test")
	out = hastate(0, "wait", "canary_api/api-2", "--idle", "--timeout", "30s")
	if !strings.Contains(out, "idle") {
		t.Fatalf("wait --idle:\n%s", out)
	}
	t.Logf("wait --idle: %s", lastLine(out))
	// verify right after a write: it waits for samples newer than the
	// change, and every HAProxy agrees (issue 35: it said "not applied yet",
	// exit 1, the code of a real disagreement).
	// It may still not tell (exit 4) if an HAProxy's agent check comes
	// later than one scrape interval after the write (a starved machine);
	// a disagreement (exit 1) it must never claim.
	hastate(0, "weight", "75%", "canary_api/api-2", "--reason", "demo test")
	vstart := time.Now()
	vout, code := d.Hastate(t, "verify", "canary_*/*")
	t.Logf("verify right after a write: exit %d in %s", code, time.Since(vstart).Round(10*time.Millisecond))
	switch code {
	case 0:
	case 4:
		t.Logf("verify could not tell within one scrape interval of the write:\n%s", vout)
		vout = hastate(0, "verify", "canary_*/*")
	default:
		t.Fatalf("verify right after a write: exit %d, want 0 (or 4 while it cannot confirm), never a disagreement:\n%s", code, vout)
	}
	if !strings.Contains(vout, "4 servers on 3 HAProxy instances") {
		t.Fatalf("verify did not compare 4 servers on 3 HAProxy instances:\n%s", vout)
	}
	t.Logf("verify: %s", lastLine(vout))
	for i := 2; i <= 4; i++ {
		resp, err := http.Get("http://" + d.Addr(i, 9778) + "/-/metrics")
		if err != nil {
			t.Fatalf("replica metrics at %s: %v", d.Addr(i, 9778), err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("replica metrics at %s: %s", d.Addr(i, 9778), resp.Status)
		}
	}

	// 6. Ctrl-C (SIGINT to its process group): nothing of it is left.
	term, _ = d.Interrupt(t, 90*time.Second)
	if !strings.Contains(term, "demo: stopped") {
		t.Fatalf("the demo did not say it stopped:\n%s", lastLines(term, 8))
	}
	if left := d.Processes(); len(left) > 0 {
		t.Fatalf("processes left after the demo stopped:\n%s", strings.Join(left, "\n"))
	}
	// The logs of both runs were kept; a reset (make demo-reset's first
	// step) removes the data, and says so.
	if b, err := os.ReadFile(filepath.Join(d.Dir, "consul.log")); err != nil || strings.Count(string(b), "==> demo ") < 3 {
		t.Errorf("consul.log does not hold the three starts of Consul (two demos and consul start): %v", err)
	}
	out, code = d.Script(t, "reset")
	if _, err := os.Stat(d.Dir); code != 0 || !strings.Contains(out, "demo: removed "+d.Dir) || !os.IsNotExist(err) {
		t.Fatalf("scripts/demo.sh reset: exit %d, %v:\n%s", code, err, out)
	}
}

func promClient(t *testing.T, url string) promv1.API {
	t.Helper()
	c, err := promapi.NewClient(promapi.Config{Address: url})
	if err != nil {
		t.Fatal(err)
	}
	return promv1.NewAPI(c)
}

// promCount is the number of series a query returns (0 on error).
func promCount(api promv1.API, q string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v, _, _, err := api.Query(ctx, q, time.Time{})
	if err != nil {
		return 0
	}
	vec, _ := v.(model.Vector)
	return len(vec)
}

// lastLines is the last n lines of s.
func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\r\n"), "\n")
	return strings.Join(l[max(0, len(l)-n):], "\n")
}
