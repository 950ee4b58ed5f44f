package browser

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/hastate/hastate/internal/testenv"
)

// polled are the servers the fake HAProxy asks for, as agent-send strings:
// web/b and the api servers have no key of their own and show because
// they are polled.
var polled = []string{"web/a", "web/b", "web/c", "web/m", "web/r", "web/w", "web/x", "api/api-1", "api/api-2"}

// TestStatusPage renders the status page of a running hastate (one
// replica, a real Consul dev agent) in headless Chromium: the drained row
// says drain and looks different from a ready row, a withheld row says it
// told HAProxy nothing, a backend drained whole is flagged as taking no
// traffic, the ramping row's HAProxy cell stays green through its steps,
// the filter box filters,
// nothing fails to load, and stopping Consul brings the red banner, both
// by the page's own refresh and after a reload. Screenshots of each state,
// desktop and phone width, go to artifacts/ (or $BROWSER_ARTIFACTS).
func TestStatusPage(t *testing.T) {
	chromium := chromiumBin(t)
	shots := artifactsDir(t)
	bin := testenv.BuildHastate(t, "../..")

	consul, hastate := testenv.StartShowcase(t, bin, "hs1", map[string]string{
		"hastate/state/web/a": `{"state":"drain","reason":"kernel upgrade","by":"alice"}`,
		"hastate/state/web/m": `{"state":"maint","reason":"disk replacement","by":"bob"}`,
		"hastate/state/web/w": "50%",
		"hastate/state/web/x": "drian",
		"hastate/state/api/*": `{"state":"drain","reason":"canary drain","by":"release-bot"}`,
	}, "--ramp-duration", "10m", "--ramp-interval", "10s")
	agent, web := hastate.Agent, hastate.HTTP

	// An HAProxy that polls every server each second, as agent-inter does.
	stop := make(chan struct{})
	var polling sync.WaitGroup
	polling.Go(func() {
		for {
			for _, s := range polled {
				testenv.AgentCheck(agent, s)
			}
			select {
			case <-stop:
				return
			case <-time.After(time.Second):
			}
		}
	})
	t.Cleanup(func() { close(stop); polling.Wait() })

	b := startBrowser(t, chromium)
	page := "http://" + web + "/"
	b.do(t, "load the page", chromedp.EmulateViewport(1280, 900), chromedp.Navigate(page))
	// web/b shows once the fake HAProxy polled it and the page refreshed.
	b.waitFor(t, 20*time.Second, `document.querySelector('tr[data-server="web/b"]') !== null`, "web/b (only polled) never showed")

	drained, ready := b.row(t, "web/a"), b.row(t, "web/b")
	if drained.Class != "row drain" || drained.Badge != "drain" || !strings.Contains(strings.ToLower(drained.Text), "drain") {
		t.Errorf("web/a row %+v, want the drain class and a badge saying drain", drained)
	}
	if ready.Class != "row ready" || ready.Badge != "ready" {
		t.Errorf("web/b row %+v, want the ready class and a badge saying ready", ready)
	}
	if drained.Background == ready.Background || drained.Border == ready.Border {
		t.Errorf("drained and ready rows look alike: background %s and %s, left border %s and %s",
			drained.Background, ready.Background, drained.Border, ready.Border)
	}
	t.Logf("drained row: background %s, border %s; ready row: background %s, border %s",
		drained.Background, drained.Border, ready.Background, ready.Border)
	for server, class := range map[string]string{"web/m": "row maint", "web/w": "row weight", "web/r": "row ramping", "api/api-1": "row drain"} {
		if r := b.row(t, server); r.Class != class {
			t.Errorf("%s: class %q, want %q", server, r.Class, class)
		}
	}
	if n := b.eval(t, `document.querySelectorAll('.banner').length`); n != "0" {
		t.Errorf("%s banners with Consul up: %s", n, b.eval(t, `document.querySelector('.banner').textContent`))
	}
	if got := b.eval(t, `document.getElementById('invalid').textContent`); !strings.Contains(got, "state/web/x") {
		t.Errorf("the invalid key is not highlighted: %q", got)
	}
	// web/x has no valid value: it is answered nothing, and the HAProxy
	// cell says so in red, not a green "told 1 of 1".
	if got := b.eval(t, `(() => { const c = document.querySelector('tr[data-server="web/x"] .told'); return c.className + ': ' + c.textContent; })()`); got != `"told bad: told nothing: 1 of 1"` {
		t.Errorf("the withheld row's HAProxy cell: %s, want told bad: told nothing: 1 of 1", got)
	}
	// api has no server in rotation (its backend-wide drain): its
	// header is red and says so; the headline names it first.
	if got := b.eval(t, `document.querySelector('tbody[data-backend="api"]').className + ': ' + document.querySelector('tbody[data-backend="api"] tr.group').innerText`); !strings.Contains(got, "backend bad: ") ||
		!strings.Contains(got, "no server in rotation") {
		t.Errorf("the api backend, drained whole: %s; want it classed bad, saying it has no server in rotation", got)
	}
	if got := b.eval(t, `document.getElementById('headline').textContent`); !strings.HasPrefix(strings.Trim(got, `"`), "1 backend with no server in rotation; ") {
		t.Errorf("headline %s, want the backend with no server in rotation named first", got)
	}
	if got := b.eval(t, `getComputedStyle(document.querySelector('tbody[data-backend="api"] tr.group th')).backgroundColor + ' ' + getComputedStyle(document.querySelector('tbody[data-backend="web"] tr.group th')).backgroundColor`); func() bool {
		c := strings.Fields(strings.Trim(got, `"`))
		return len(c) < 2 || strings.Join(c[:len(c)/2], "") == strings.Join(c[len(c)/2:], "")
	}() {
		t.Errorf("the header of a backend with no server in rotation looks like another's: %s", got)
	}
	rampSteps(t, b)

	// The filter box keeps the rows that match every word.
	b.do(t, "filter", chromedp.SendKeys(chromedp.ID("q"), "kernel"))
	if got := b.eval(t, visibleRows); got != `"web/a"` {
		t.Errorf("filter 'kernel': visible rows %s, want web/a only", got)
	}
	b.do(t, "clear the filter", chromedp.Evaluate[chromedp.Void](`(() => { const q = document.getElementById('q'); q.value = ''; q.dispatchEvent(new Event('input')); q.blur(); })()`))
	if got := b.eval(t, `document.querySelectorAll('tr.row:not([hidden])').length`); got != strconv.Itoa(len(polled)+1) {
		t.Errorf("%s visible rows after clearing the filter, want %d", got, len(polled)+1)
	}

	b.shoot(t, shots, "status-desktop.png", 1280, 900)
	b.shoot(t, shots, "status-narrow.png", 390, 844)
	b.noProblems(t, "with Consul up")

	// Issue 27.3 and 27.4: web/c, told ready 100%, gets an invalid value:
	// withheld, HAProxy keeps ready 100%, and it still counts in rotation;
	// an invalid config/ramp is listed with the invalid keys.
	consul.Put(t, "hastate/state/web/c", "300%")
	consul.Put(t, "hastate/config/ramp", `{"interval":"0"}`)
	b.waitFor(t, 15*time.Second, `(() => { const r = document.querySelector('tr[data-server="web/c"] .badge'); return r !== null && r.textContent === 'withheld: HAProxy keeps ready 100%'; })()`,
		"web/c never showed as withheld, keeping ready 100%")
	if got := b.eval(t, `document.getElementById('invalid').textContent`); !strings.Contains(got, "config/ramp") || !strings.Contains(got, "the --ramp-* flags apply") {
		t.Errorf("the invalid config/ramp is not listed with the invalid keys: %q", got)
	}
	if got := b.eval(t, `document.getElementById('headline').textContent`); !strings.Contains(got, "1 withheld: HAProxy keeps the last answer it was told, counted there") {
		t.Errorf("headline %s, want the withheld server counted where HAProxy keeps it", got)
	}
	b.shoot(t, shots, "status-withheld-and-config-desktop.png", 1280, 900)

	// Stop Consul: the banner comes by the page's own refresh, then after a
	// reload; the last state stays on the page.
	consul.Kill()
	killed := time.Now()
	b.waitFor(t, 15*time.Second, `[...document.querySelectorAll('.banner')].some(b => b.textContent.includes('Consul'))`,
		"no Consul banner within 15s of stopping Consul (without reload)")
	t.Logf("the Consul banner showed %s after Consul stopped, by the page's refresh", time.Since(killed).Round(100*time.Millisecond))
	if got := b.eval(t, `document.getElementById('refresh').className`); got != `"refresh"` {
		t.Errorf("the refresh indicator says %s: %s", got, b.eval(t, `document.getElementById('refresh').textContent`))
	}
	b.do(t, "reload", chromedp.Reload())
	b.waitFor(t, 15*time.Second, `[...document.querySelectorAll('.banner')].some(b => b.textContent.includes('Consul'))`,
		"no Consul banner after a reload")
	t.Logf("banner: %s", b.eval(t, `document.querySelector('.banner').innerText`))
	if got := b.eval(t, `document.getElementById('kv').className`); got != `"kv bad"` {
		t.Errorf("Consul line class %s with Consul down, want kv bad", got)
	}
	if r := b.row(t, "web/a"); r.Badge != "drain" {
		t.Errorf("web/a with Consul down: %+v, want the last state (drain)", r)
	}
	b.shoot(t, shots, "status-consul-down-desktop.png", 1280, 900)
	b.shoot(t, shots, "status-consul-down-narrow.png", 390, 844)
	b.noProblems(t, "with Consul down")
}

// rampSteps watches the ramping web/r through ramp steps (one every 10s at
// 10m in steps of 10s) by fetching the page every 100ms: each step changes
// its answer, and for up to a second (the fake HAProxy's interval) HAProxy
// was told the step before. The HAProxy cell must stay green through that,
// and the test must have seen such a moment.
func rampSteps(t *testing.T, b *browser) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 90*time.Second)
	defer cancel()
	type seen struct {
		Classes map[string]int
		Behind  int
		Weights []string
		Samples int
	}
	got, err := chromedp.Run(ctx, chromedp.Evaluate[seen](`(async () => {
		const s = {Classes: {}, Behind: 0, Weights: new Set(), Samples: 0};
		const end = Date.now() + 60000;
		while (Date.now() < end && s.Behind < 1) {
			const html = await (await fetch('/', {cache: 'no-store'})).text();
			const row = new DOMParser().parseFromString(html, 'text/html').querySelector('tr[data-server="web/r"]');
			const told = row.querySelector('.told');
			const key = told.className + ': ' + told.textContent;
			s.Classes[key] = (s.Classes[key] || 0) + 1;
			if (told.title.includes('an earlier one')) s.Behind++;
			s.Weights.add(row.querySelector('.sub').textContent);
			s.Samples++;
			await new Promise(r => setTimeout(r, 100));
		}
		return {Classes: s.Classes, Behind: s.Behind, Weights: [...s.Weights], Samples: s.Samples};
	})()`, chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatalf("watch web/r's ramp: %v", err)
	}
	t.Logf("web/r over %d fetches: answers %v; HAProxy cell %v; %d fetches with the HAProxy a step behind", got.Samples, got.Weights, got.Classes, got.Behind)
	if len(got.Weights) < 2 || got.Behind == 0 {
		t.Fatalf("no ramp step with the HAProxy a step behind was seen: the test proves nothing")
	}
	for k, n := range got.Classes {
		if k != "told ok: on the ramp: 1 of 1" {
			t.Errorf("web/r's HAProxy cell said %q in %d of %d fetches during its ramp, want always \"told ok: on the ramp: 1 of 1\"", k, n, got.Samples)
		}
	}
}

// visibleRows lists the server rows the filter leaves, as JSON.
const visibleRows = `[...document.querySelectorAll('tr.row:not([hidden])')].map(r => r.dataset.server).join(' ')`

// browser is one headless Chromium tab and what went wrong in it: failed
// loads, HTTP errors, console errors, exceptions, browser log errors.
type browser struct {
	ctx context.Context

	mu       sync.Mutex
	urls     map[network.RequestID]string
	problems []string
}

func startBrowser(t *testing.T, chromium string) *browser {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), "chromium.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromium),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		// Without these Chromium reaches for the network, which is closed here.
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("force-color-profile", "srgb"),
		chromedp.Flag("hide-scrollbars", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
		chromedp.CombinedOutput(logFile),
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	b := &browser{urls: map[network.RequestID]string{}}
	ctx, cancel := chromedp.NewContext(allocCtx, chromedp.WithListener(b.listen))
	t.Cleanup(func() {
		cancel()
		cancelAlloc() // waits for Chromium to exit, before its user data dir goes
		logFile.Close()
		if t.Failed() {
			if out, err := os.ReadFile(logPath); err == nil {
				t.Logf("chromium output:\n%s", out)
			}
		}
	})
	b.ctx = ctx
	start := time.Now()
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start %s: %v", chromium, err)
	}
	t.Logf("%s started in %s", chromium, time.Since(start).Round(time.Millisecond))
	return b
}

// listen runs in the tab's loop: it only records.
func (b *browser) listen(ev any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch ev := ev.(type) {
	case *network.EventRequestWillBeSent:
		b.urls[ev.RequestID] = ev.Request.URL
	case *network.EventResponseReceived:
		if ev.Response.Status >= 400 {
			b.problems = append(b.problems, fmt.Sprintf("HTTP %d for %s", ev.Response.Status, ev.Response.URL))
		}
	case *network.EventLoadingFailed:
		if ev.Canceled { // a refresh cut short by the test's own reload
			return
		}
		b.problems = append(b.problems, fmt.Sprintf("loading failed: %s %s: %s %s", ev.Type, b.urls[ev.RequestID], ev.ErrorText, ev.BlockedReason))
	case *runtime.EventExceptionThrown:
		b.problems = append(b.problems, "exception: "+ev.ExceptionDetails.Text+" "+describe(ev.ExceptionDetails.Exception))
	case *runtime.EventConsoleAPICalled:
		if ev.Type == runtime.ConsoleAPICalledTypeError || ev.Type == runtime.ConsoleAPICalledTypeAssert {
			var args []string
			for _, a := range ev.Args {
				args = append(args, describe(a))
			}
			b.problems = append(b.problems, "console."+string(ev.Type)+": "+strings.Join(args, " "))
		}
	case *log.EventEntryAdded:
		if ev.Entry.Level == log.EntryLevelError {
			b.problems = append(b.problems, fmt.Sprintf("browser log (%s): %s %s", ev.Entry.Source, ev.Entry.Text, ev.Entry.URL))
		}
	}
}

func describe(o *runtime.RemoteObject) string {
	if o == nil {
		return ""
	}
	if o.Description != "" {
		return o.Description
	}
	return string(o.Value)
}

// noProblems fails the test for every failed load, HTTP error, console
// error or exception seen so far.
func (b *browser) noProblems(t *testing.T, when string) {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, p := range b.problems {
		t.Errorf("%s: %s", when, p)
	}
	b.problems = nil
}

func (b *browser) do(t *testing.T, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// eval returns the JSON of a JavaScript expression's value.
func (b *browser) eval(t *testing.T, expr string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	raw, err := chromedp.Run(ctx, chromedp.Evaluate[[]byte](expr))
	if err != nil {
		t.Fatalf("%s: %v", expr, err)
	}
	return string(raw)
}

// waitFor waits until the page makes expr true, without reloading it
// (the page refreshes itself).
func (b *browser) waitFor(t *testing.T, d time.Duration, expr, msg string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, d+5*time.Second)
	defer cancel()
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](expr, chromedp.WithPollingTimeout(d), chromedp.WithPollingInterval(200*time.Millisecond))); err != nil {
		t.Fatalf("%s (%v)", msg, err)
	}
}

// row is what a server row shows and how it looks.
type row struct {
	Class, Badge, Text string
	Background, Border string
}

func (b *browser) row(t *testing.T, server string) row {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	r, err := chromedp.Run(ctx, chromedp.Evaluate[row](`(() => {
		const r = document.querySelector('tr[data-server=`+strconv.Quote(server)+`]');
		if (!r) return {Class: 'missing'};
		return {Class: r.className, Badge: r.querySelector('.badge').textContent, Text: r.innerText,
			Background: getComputedStyle(r).backgroundColor + ' ' + getComputedStyle(r).backgroundImage,
			Border: getComputedStyle(r.cells[0]).borderLeftColor};
	})()`))
	if err != nil {
		t.Fatalf("row %s: %v", server, err)
	}
	return r
}

// shoot saves a full-page PNG at a width (the height grows to the page).
func (b *browser) shoot(t *testing.T, dir, name string, width, height int64) {
	t.Helper()
	b.do(t, "viewport "+name, chromedp.EmulateViewport(width, height))
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", path)
	b.do(t, "viewport back", chromedp.EmulateViewport(1280, 900))
}

// chromiumBin is $CHROMIUM_BIN or chromium on PATH (scripts/ensure-chromium.sh
// installs Debian's).
func chromiumBin(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("CHROMIUM_BIN"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("no chromium: run scripts/ensure-chromium.sh (make browser does) or set CHROMIUM_BIN")
	return ""
}

// artifactsDir is where the screenshots go: $BROWSER_ARTIFACTS, else
// artifacts/ next to this test (git-ignored).
func artifactsDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("BROWSER_ARTIFACTS")
	if dir == "" {
		dir = "artifacts"
	}
	dir, err := filepath.Abs(dir)
	if err == nil {
		err = os.MkdirAll(dir, 0o755)
	}
	if err != nil {
		t.Fatal(err)
	}
	return dir
}
