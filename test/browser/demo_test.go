package browser

import (
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/hastate/hastate/internal/testenv"
)

// TestDemoStatusPage shows the status page of `make demo` itself
// (scripts/demo.sh, on a loopback block of its own): three HAProxy nodes
// poll every server, each told by all three, then Consul stops
// (`scripts/demo.sh consul stop`) and the page keeps the last state under
// its red banner. Screenshots: demo-three-haproxy-*.png and
// demo-consul-down-*.png in artifacts/.
func TestDemoStatusPage(t *testing.T) {
	chromium := chromiumBin(t)
	shots := artifactsDir(t)
	d := testenv.NewDemo(t, "../..", testenv.BuildHastate(t, "../.."))
	out := d.StartPlain(t)
	if !strings.Contains(out, "three HAProxy nodes on ") {
		t.Fatalf("the demo runs without its three HAProxy nodes (is HAProxy installed? scripts/ensure-haproxy.sh):\n%s", out)
	}
	run := func(want int, args ...string) {
		t.Helper()
		if out, code := d.Hastate(t, args...); code != want {
			t.Fatalf("hastate %s: exit %d, want %d:\n%s", strings.Join(args, " "), code, want, out)
		}
	}
	// Something of each kind: web-2 ramps back (the demo's drain cleared),
	// web-1 drained for a while, api-2 in maint; api-1 stays at 50%.
	run(0, "clear", "canary_web/web-2")
	run(0, "drain", "canary_web/web-1", "--reason", "kernel upgrade", "--for", "30m")
	run(0, "maint", "canary_api/api-2", "--reason", "disk swap")
	run(0, "wait", "canary_*/*")

	b := startBrowser(t, chromium)
	page := "http://" + d.Addr(1, 9778) + "/"
	b.do(t, "load the demo's page", chromedp.EmulateViewport(1280, 900), chromedp.Navigate(page))
	// Every row: its three HAProxy nodes were told.
	b.waitFor(t, 20*time.Second, `(() => { const c = [...document.querySelectorAll('tr.row .told')]; return c.length === 4 && c.every(e => e.textContent.includes('3 of 3')); })()`,
		"the demo's page does not show every server told by 3 of 3 HAProxy nodes")
	headline := b.eval(t, `document.getElementById('headline').textContent`)
	if !strings.Contains(headline, "2 of 4 servers in rotation (of which 1 ramping, 1 at a set weight); out: 1 drain, 1 maint") {
		t.Errorf("headline %s, want 2 of 4 in rotation, out: 1 drain, 1 maint", headline)
	}
	t.Logf("headline: %s", headline)
	b.shoot(t, shots, "demo-three-haproxy-desktop.png", 1280, 900)
	b.shoot(t, shots, "demo-three-haproxy-narrow.png", 390, 844)
	b.noProblems(t, "the demo with Consul up")

	if out, code := d.Script(t, "consul", "stop"); code != 0 {
		t.Fatalf("scripts/demo.sh consul stop: exit %d:\n%s", code, out)
	}
	b.waitFor(t, 15*time.Second, `[...document.querySelectorAll('.banner')].some(b => b.textContent.includes('Consul'))`,
		"no Consul banner within 15s of scripts/demo.sh consul stop")
	t.Logf("banner: %s", b.eval(t, `document.querySelector('.banner').innerText`))
	if r := b.row(t, "canary_web/web-1"); r.Badge != "drain" {
		t.Errorf("canary_web/web-1 with Consul down: %+v, want the last state (drain)", r)
	}
	if r := b.row(t, "canary_api/api-2"); r.Badge != "maint" {
		t.Errorf("canary_api/api-2 with Consul down: %+v, want the last state (maint)", r)
	}
	b.shoot(t, shots, "demo-consul-down-desktop.png", 1280, 900)
	b.shoot(t, shots, "demo-consul-down-narrow.png", 390, 844)
	b.noProblems(t, "the demo with Consul down")
	if out, code := d.Script(t, "consul", "start"); code != 0 {
		t.Fatalf("scripts/demo.sh consul start: exit %d:\n%s", code, out)
	}
	d.Interrupt(t, 90*time.Second)
	if left := d.Processes(); len(left) > 0 {
		t.Errorf("processes left after the demo stopped:\n%s", strings.Join(left, "\n"))
	}
}
