package server

import (
	"encoding/json"
	"flag"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/state"
)

var pagePreview = flag.String("page-preview", "", "write the showcase status page to this file (to look at it in a browser)")

// pageShowcase is a replica that holds one server in every state:
// web/a drain (with reason and by), web/b maint, web/c 50%, web/d ready
// (only polled), web/e drain until an hour from now, web/f an expired
// maint (ready again), web/r ramping since 2 minutes of 10; api/* a
// backend-wide drain followed by api/y, api/x an invalid value with no last
// valid one (withheld), and state/bad a key without a server. cluster and
// kv set what the replica says of its cluster and Consul.
func pageShowcase(t *testing.T, now time.Time, cluster api.ClusterInfo, kv api.KVStatus, down ...string) http.Handler {
	t.Helper()
	m := state.NewMirror()
	p := state.RampPolicy{Start: 10, Duration: 10 * time.Minute, Interval: 10 * time.Second, Aggression: 1}
	t0 := now.Add(-2*time.Hour - 5*time.Minute)
	m.ApplyAt(state.Change{Set: map[string]string{
		"state/web/a": `{"state":"drain","reason":"zonal maintenance <us-east1-b>","by":"<b>alice</b>"}`,
		"state/web/b": "maint",
		"meta/web/b":  `{"state":"drain","reason":"an earlier drain"}`, // the key was changed outside hastate since
		"state/web/c": "50%",
		"state/web/r": "drain",
		"state/web/e": `{"state":"drain","until":"` + now.Add(time.Hour).UTC().Format(time.RFC3339) + `"}`,
		"state/web/f": `{"state":"maint","until":"` + now.Add(-time.Minute).UTC().Format(time.RFC3339) + `"}`,
		"state/api/*": `{"state":"drain","reason":"canary","by":"bob"}`,
		"state/api/x": "300%",
		"state/bad":   "drain",
	}}, t0, p)
	m.Expire([]string{"state/web/f"}, now.Add(-30*time.Second), p)
	m.ApplyAt(state.Change{Delete: []string{"state/web/r"}}, now.Add(-2*time.Minute), p)
	snap := m.Snapshot()
	pollers := newPollers(t, PollersOptions{})
	ha := &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}
	for req, answer := range map[string]string{"web/a": "drain", "web/c": "ready 100%", "web/d": "ready 100%", "api/y": "drain"} {
		pollers.Record(ha, []byte(req), []byte(answer+"\n"), now)
	}
	pollers.Record(ha, []byte("api/x"), nil, now) // withheld: told nothing (hs2 told it ready 100% before)
	return NewHTTPHandler(HTTPOptions{Pollers: pollers, NodeID: "hs1", now: func() time.Time { return now }, Replica: &fakeReplica{
		snap:  func() *state.Snapshot { return snap },
		ready: func() (bool, string) { return true, "holds state and caught up with a leader" },
		peers: func() []api.Poll {
			return []api.Poll{
				{HAProxy: "127.0.0.3", Backend: "web", Server: "a", Answer: "drain", LastAsked: now, Replica: "hs2"},
				{HAProxy: "127.0.0.3", Backend: "web", Server: "c", Answer: "ready 50%", LastAsked: now, Replica: "hs2"},
				{HAProxy: "127.0.0.2", Backend: "api", Server: "x", Answer: "ready 100%", LastAsked: now.Add(-2 * time.Second), Count: 5, Replica: "hs2"},
			}
		},
		down:    down,
		cluster: func() api.ClusterInfo { return cluster },
		kv:      func() api.KVStatus { return kv },
	}})
}

func healthyCluster() api.ClusterInfo {
	return api.ClusterInfo{NodeID: "hs1", State: "follower", LeaderID: "hs2", Members: []api.MemberInfo{
		{ID: "hs1", Address: "127.0.0.1:9779", Suffrage: "Voter", Status: &api.PeerStatus{State: "follower", LastContact: "12ms", ConsulReachable: true}},
		{ID: "hs2", Address: "127.0.0.1:9780", Suffrage: "Voter", Leader: true, Status: &api.PeerStatus{State: "leader", ConsulReachable: true}},
		{ID: "hs3", Address: "127.0.0.1:9781", Suffrage: "Voter", Status: &api.PeerStatus{State: "follower", LastContact: "40ms", ConsulReachable: true}},
	}}
}

func healthyKV() api.KVStatus {
	return api.KVStatus{KVView: api.KVView{LeaderID: "hs2", Known: true, Reachable: true, Synced: true, SyncAgeSeconds: 0.4, SyncedIndex: 42}}
}

var rowRE = regexp.MustCompile(`(?s)<tr class="row (\w+)" data-server="([^"]+)".*?</tr>`)

// pageRowsOf returns each server row of a status page by backend/server:
// its class and its HTML.
func pageRowsOf(body string) map[string][2]string {
	rows := map[string][2]string{}
	for _, m := range rowRE.FindAllStringSubmatch(body, -1) {
		rows[m[2]] = [2]string{m[1], m[0]}
	}
	return rows
}

// Every server has a row classed by its state, saying the state, with its
// weight or ramp, since, expiry, reason, by and how many HAProxy nodes were
// told its answer.
func TestPageRowsByState(t *testing.T) {
	now := time.Now().Truncate(time.Second) // until is written in whole seconds
	h := pageShowcase(t, now, healthyCluster(), healthyKV())
	code, body := get(t, h, "/")
	if code != http.StatusOK {
		t.Fatalf("status page: %d\n%s", code, body)
	}
	if *pagePreview != "" {
		if err := os.WriteFile(*pagePreview, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	rows := pageRowsOf(body)
	for server, want := range map[string]struct {
		class string
		has   []string
	}{
		"web/a": {"drain", []string{`<span class="badge">drain</span>`, "zonal maintenance &lt;us-east1-b&gt;", "&lt;b&gt;alice&lt;/b&gt;", ">2h 5m ago</span>", `<span class="told ok"`, "told 2 of 2"}},
		"web/b": {"maint", []string{`<span class="badge">maint</span>`, "not polled", "set outside hastate"}},
		"web/c": {"weight", []string{`<span class="badge">weight</span>`, `style="width:50%"`, "50%", `<span class="told warn"`, "told 1 of 2"}},
		"web/d": {"ready", []string{`<span class="badge">ready</span>`, `style="width:100%"`, "told 1 of 1"}},
		"web/e": {"drain", []string{">in 1h</span>"}},
		"web/f": {"ready", []string{`<span class="tag" title="state/web/f expired: treated as absent; hastate clear --expired removes it">expired</span>`, `<span class="past" title="state/web/f expired`}},
		"web/r": {"ramping", []string{`<span class="badge">ramping</span>`, `style="width:10%"`, `<span class="bar ramp"`, `style="width:20%"`, "→ 100% in 8m"}},
		"api/*": {"drain", []string{"backend-wide key", "canary", "bob"}},
		"api/y": {"drain", []string{"told 1 of 1"}},
		"api/x": {"withheld", []string{`<span class="badge">withheld: HAProxy keeps ready 100%</span>`, `style="width:100%"`, "answers nothing", `<span class="tag">invalid</span>`, "256", `<span class="told bad"`, "told nothing: 1 of 1"}},
	} {
		row, ok := rows[server]
		if !ok {
			t.Errorf("%s: no row", server)
			continue
		}
		if row[0] != want.class {
			t.Errorf("%s: class %q, want %q", server, row[0], want.class)
		}
		for _, s := range want.has {
			if !strings.Contains(row[1], s) {
				t.Errorf("%s: row without %q:\n%s", server, s, row[1])
			}
		}
	}
	// Issue 35: an expired key is no problem ("only not ready" hides it);
	// a drained row is one.
	if strings.Contains(rows["web/f"][1], "data-problem") || !strings.Contains(rows["web/a"][1], "data-problem") {
		t.Errorf("data-problem: expired web/f %v, drained web/a %v; want only web/a",
			strings.Contains(rows["web/f"][1], "data-problem"), strings.Contains(rows["web/a"][1], "data-problem"))
	}
	if len(rows) != 10 {
		t.Errorf("%d rows, want 10", len(rows))
	}
	// The since cell carries the absolute time.
	if since := now.Add(-2*time.Hour - 5*time.Minute).UTC().Format("2006-01-02 15:04:05 UTC"); !strings.Contains(rows["web/a"][1], `title="`+since+`"`) {
		t.Errorf("web/a: since without its absolute time %s", since)
	}
}

// Each backend says how many of its servers are in rotation and counts
// the others by state; the headline counts the whole fleet.
func TestPageSummaries(t *testing.T) {
	_, body := get(t, pageShowcase(t, time.Now(), healthyCluster(), healthyKV()), "/")
	for _, want := range []string{
		`<span class="bname">web</span><span class="cnt ready">4 of 7 in rotation</span><span class="cnt ramping">of which 1 ramping</span><span class="cnt weight">1 at a set weight</span><span class="cnt drain">out: 2 drain</span><span class="cnt maint">1 maint</span></th>`,
		// api's withheld server is counted by what HAProxy keeps (issue 27.3): ready 100%, in rotation.
		`<tbody class="backend warn" data-backend="api">`,
		`<span class="bname">api</span><span class="cnt ready">1 of 2 in rotation</span><span class="cnt drain">out: 1 drain</span><span class="cnt withheld">1 withheld: HAProxy keeps the last answer it was told, counted there</span></th>`,
		`<tbody class="backend warn" data-backend="web">`,
		// The headline is status's rotation line (issue 35): 5 in rotation,
		// 3 drain and 1 maint add up to the 9 servers.
		`<p class="headline warn" id="headline">5 of 9 servers in rotation (of which 1 ramping, 1 at a set weight); out: 3 drain, 1 maint; 1 withheld: HAProxy keeps the last answer it was told, counted there; 2 invalid keys</p>`,
		`<title>hastate: 5 of 9 servers in rotation `,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("status page without %s", want)
		}
	}
}

// The header names the replica that served the page, the leader, each
// member with its state and last contact, and Consul's sync; with all
// well there is no banner.
func TestPageHeaderHealthy(t *testing.T) {
	_, body := get(t, pageShowcase(t, time.Now(), healthyCluster(), healthyKV()), "/")
	for _, want := range []string{
		`served by <b id="served">hs1</b> (follower)`,
		`leader <b>hs2</b>`,
		`<b>hs1</b> <span class="self">(this)</span> follower · contact 12ms ago · Consul ok`,
		`<li class="m ok" title="127.0.0.1:9780 (Voter)"><b>hs2</b> leader · Consul ok</li>`,
		`<span class="kv ok" id="kv">Consul: reachable · synced 400ms ago · index 42</span>`,
		`<section class="invalid" id="invalid"><h2>2 invalid keys: fix the value in Consul</h2>`,
		`<code>state/bad</code> = <code>drain</code>`,
		`<code>state/api/x</code> = <code>300%</code>`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("status page without %s", want)
		}
	}
	if strings.Contains(body, `class="banner"`) {
		t.Errorf("a healthy cluster has a banner")
	}
}

// A stale Consul sync, a replica that did not answer, a lost leader, a
// member that does not answer: a red banner for each, and the headline
// turns red.
func TestPageBanners(t *testing.T) {
	ci := healthyCluster()
	ci.LeaderID, ci.LeaderlessSeconds = "", 12
	ci.Members[2].Status = nil
	kv := api.KVStatus{KVView: api.KVView{Known: true, Synced: true, SyncAgeSeconds: 42, Warning: "Consul not synced for 42s"},
		Watch: &api.WatchStatus{LastError: "dial tcp 127.0.0.1:8500: connection refused"}}
	_, body := get(t, pageShowcase(t, time.Now(), ci, kv, "hs3"), "/")
	for _, want := range []string{
		`<div class="banner" role="alert">Consul not synced for 42s<div class="detail">last error: dial tcp 127.0.0.1:8500: connection refused</div></div>`,
		`<div class="banner" role="alert">replica hs3 did not answer: servers and HAProxy nodes only it saw are missing from this page<div class="detail">connection refused</div></div>`,
		`<div class="banner" role="alert">no raft leader: replica hs1 serves its last state; no KV change and no ramp step is applied</div>`,
		`leader <span class="bad-text">no leader for 12s</span>`,
		`<li class="m bad" title="127.0.0.1:9781 (Voter)"><b>hs3</b> no answer</li>`,
		`<span class="kv bad" id="kv">Consul: NOT reachable · synced 42s ago</span>`,
		`<p class="headline bad"`,
		`<title>(!) hastate: `,
		`%23dc2626`, // the red tab icon
	} {
		if !strings.Contains(body, want) {
			t.Errorf("status page without %s", want)
		}
	}
}

// The page loads nothing from anywhere: no src, no stylesheet link, an
// icon from a data: URL, and a policy that allows only its own nonce'd
// script, inline styles and fetching itself.
func TestPageSelfContained(t *testing.T) {
	rec := httptest.NewRecorder()
	pageShowcase(t, time.Now(), healthyCluster(), healthyKV()).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	body := rec.Body.String()
	csp := rec.Header().Get("Content-Security-Policy")
	nonce := regexp.MustCompile(`<script nonce="([^"]+)">`).FindStringSubmatch(body)
	if len(nonce) != 2 || !strings.Contains(csp, "script-src 'nonce-"+nonce[1]+"'") || !strings.HasPrefix(csp, "default-src 'none'") {
		t.Errorf("CSP %q does not allow exactly the page's script (%v)", csp, nonce)
	}
	if strings.Count(body, "<script") != 1 {
		t.Errorf("%d scripts, want the one inline", strings.Count(body, "<script"))
	}
	for _, bad := range []string{" src=", `rel="stylesheet"`, "@import", "url(", "http://", "https://"} {
		if strings.Contains(strings.ReplaceAll(body, "http://www.w3.org/2000/svg", ""), bad) {
			t.Errorf("status page holds %q: it must load nothing", bad)
		}
	}
	if !strings.Contains(body, `<link rel="icon" href="data:image/svg`) {
		t.Errorf("no data: icon (the browser would ask for /favicon.ico)")
	}
	if rec.Header().Get("Cache-Control") != "no-store" {
		t.Errorf("Cache-Control %q", rec.Header().Get("Cache-Control"))
	}
}

// During a ramp, every step changes the answer and each HAProxy hears the
// new one at its next check: an HAProxy told the step before is following
// the ramp, and the row says so in the same words and colour at every
// step. One told anything else is behind.
func TestPageToldDuringARamp(t *testing.T) {
	now := time.Now()
	m := state.NewMirror()
	p := state.RampPolicy{Start: 10, Duration: 10 * time.Minute, Interval: 10 * time.Second, Aggression: 1}
	m.ApplyAt(state.Change{Set: map[string]string{"state/web/r": "drain", "state/web/a": "drain"}}, now.Add(-time.Hour), p)
	m.ApplyAt(state.Change{Delete: []string{"state/web/r"}}, now.Add(-2*time.Minute), p)
	m.ApplySteps(state.NextSteps(m.Ramps(), now))
	snap := m.Snapshot()
	cur := strings.TrimSuffix(string(snap.Lookup([]byte("web/r"), 3)), "\n")
	if w, ok := readyWeight(cur); !ok || w <= 10 {
		t.Fatalf("web/r answers %q two minutes into its ramp, want above the start: the test proves nothing", cur)
	}
	page := func(told ...string) string {
		pollers := newPollers(t, PollersOptions{})
		for i, answer := range told {
			pollers.Record(&net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(2+i))}, []byte("web/r"), []byte(answer+"\n"), now)
		}
		pollers.Record(&net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}, []byte("web/a"), []byte("drain\n"), now)
		h := NewHTTPHandler(HTTPOptions{Pollers: pollers, NodeID: "hs1", now: func() time.Time { return now }, Replica: &fakeReplica{
			snap:  func() *state.Snapshot { return snap },
			ready: func() (bool, string) { return true, "" },
			peers: func() []api.Poll { return nil },
		}})
		_, body := get(t, h, "/")
		return pageRowsOf(body)["web/r"][1]
	}
	for _, c := range []struct {
		told []string
		want string
	}{
		{[]string{cur, cur}, `<span class="told ok" title="HAProxy nodes that asked within the last minute, all told the current step of the ramp">on the ramp: 2 of 2</span>`},
		{[]string{cur, "ready 10%"}, `<span class="told ok" title="HAProxy nodes that asked within the last minute: told the current step of the ramp, or (1 of them) an earlier one; each hears the next step at its next check">on the ramp: 2 of 2</span>`},
		{[]string{"ready 10%"}, `<span class="told ok"`},
		{[]string{cur, "ready 10%", "drain"}, `<span class="told warn" title="HAProxy nodes that asked within the last minute, and how many were last told the current answer">told 1 of 3</span>`},
		{[]string{"maint"}, `told 0 of 1`},
	} {
		if row := page(c.told...); !strings.Contains(row, c.want) {
			t.Errorf("web/r at %q, HAProxy nodes told %q: row without %s:\n%s", cur, c.told, c.want, row)
		}
	}
}

func TestShortDurations(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0: "0s", 1400 * time.Millisecond: "1s", 59 * time.Second: "59s", time.Minute: "1m", 3*time.Minute + 20*time.Second: "3m 20s",
		2*time.Hour + 5*time.Minute: "2h 5m", 2 * time.Hour: "2h", 47 * time.Hour: "47h", 76 * time.Hour: "3d 4h",
	} {
		if got := short(d); got != want {
			t.Errorf("short(%s) = %q, want %q", d, got, want)
		}
	}
	now := time.Now()
	if got := relative(now, now.Add(-2*time.Hour)); got != "2h ago" {
		t.Errorf("relative 2h before: %q", got)
	}
	if got := relative(now, now.Add(90*time.Second)); got != "in 1m 30s" {
		t.Errorf("relative 90s after: %q", got)
	}
}

// Issue 15.3: a server at 0% is out of rotation (HAProxy shows it as
// DRAIN): the headline and the backend's line do not count it as ready.
func TestPageCountsZeroPercentAsOut(t *testing.T) {
	m := state.NewMirror()
	m.Apply(state.Change{Set: map[string]string{"state/w/a": "0%", "state/w/b": "0%", "state/w/c": "50%"}})
	snap := m.Snapshot()
	h := NewHTTPHandler(HTTPOptions{NodeID: "hs1", Replica: &fakeReplica{
		snap:  func() *state.Snapshot { return snap },
		ready: func() (bool, string) { return true, "" },
		peers: func() []api.Poll { return nil },
	}})
	_, body := get(t, h, "/")
	for _, want := range []string{
		`id="headline">1 of 3 servers in rotation (of which 1 at a set weight); out: 2 at 0% (HAProxy shows DRAIN)</p>`,
		`<span class="cnt ready">1 of 3 in rotation</span>`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("status page without %s:\n%s", want, regexp.MustCompile(`(?s)<p class="headline.*?</p>|<span class="cnt ready">.*?</th>`).FindAllString(body, -1))
		}
	}
}

// A withheld server is answered nothing, so HAProxy keeps the last answer
// it was told: /v1/state says which (over every replica's polls), with its
// weight, not 0 (issue 27.3).
func TestWithheldRowSaysWhatHAProxyKeeps(t *testing.T) {
	_, body := get(t, pageShowcase(t, time.Now(), healthyCluster(), healthyKV()), "/v1/state?scope=cluster")
	var v api.StateView
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	var row api.ServerState
	for _, r := range v.Servers {
		if r.Backend+"/"+r.Server == "api/x" {
			row = r
		}
	}
	if !row.Withheld || row.Keeps != "ready 100%" || row.Weight != 100 || !row.InRotation() {
		t.Errorf("api/x: withheld %v keeps %q weight %d in rotation %v; want withheld, keeps ready 100%% at weight 100, in rotation:\n%s",
			row.Withheld, row.Keeps, row.Weight, row.InRotation(), body)
	}
}

// A member that cannot mirror Consul (another cluster, another prefix) is
// named in a banner with what differs, and marked in the member list.
func TestPageNamesAReplicaThatCannotMirror(t *testing.T) {
	ci := healthyCluster()
	ci.Members[2].Status.Mirror = &api.MirrorVerdict{Reason: api.MirrorOtherCluster, Detail: "cluster ID b, recorded a"}
	_, body := get(t, pageShowcase(t, time.Now(), ci, api.KVStatus{KVView: api.KVView{Known: true, Reachable: true, Synced: true}}, ""), "/")
	for _, want := range []string{
		`<div class="banner" role="alert">replica hs3 cannot mirror Consul (other_cluster): as leader it applies nothing and hands leadership to a replica that can<div class="detail">cluster ID b, recorded a</div></div>`,
		`<b>hs3</b> follower`,
		`cannot mirror: other_cluster`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("status page without %s", want)
		}
	}
}
