package server

import (
	"encoding/json"
	"fmt"
	"github.com/hastate/hastate/api"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hastate/hastate/state"
)

// limitFixture is a handler over a replica that knows 5 servers by key
// (web/s0..s3 and web/x, whose value is invalid) and 2 invalid keys without
// a server part; HAProxy 127.0.0.2 polled `pollers` more servers on this
// replica (web/p0000, web/p0001, ...), and a peer answered 2 polls
// (web/p0000, api/a).
func limitFixture(t *testing.T, pollers int) http.Handler {
	t.Helper()
	m := state.NewMirror()
	set := map[string]string{"state/bad1": "drain", "state/bad2": "drain", "state/web/x": "300%"}
	for i := range 4 {
		set[fmt.Sprintf("state/web/s%d", i)] = "drain"
	}
	m.Apply(state.Change{Set: set})
	snap := m.Snapshot()
	p := newPollers(t, PollersOptions{})
	now := time.Now()
	for i := range pollers {
		p.Record(&net.TCPAddr{IP: net.ParseIP("127.0.0.2")}, fmt.Appendf(nil, "web/p%04d", i), []byte("ready 100%\n"), now)
	}
	return NewHTTPHandler(HTTPOptions{Pollers: p, NodeID: "self", Replica: &fakeReplica{
		snap:  func() *state.Snapshot { return snap },
		ready: func() (bool, string) { return true, "" },
		peers: func() []api.Poll {
			return []api.Poll{
				{HAProxy: "127.0.0.3", Backend: "web", Server: "p0000", LastAsked: now, Replica: "peer"},
				{HAProxy: "127.0.0.3", Backend: "api", Server: "a", LastAsked: now, Replica: "peer"},
			}
		},
	}})
}

// The lists answer at most ?limit rows, first in order, with the total
// and whether they were cut.
func TestHTTPListLimits(t *testing.T) {
	h := limitFixture(t, 4) // 9 servers, 3 invalid keys, 4 local and 6 cluster-wide polls
	for _, tt := range []struct {
		path            string
		rows, total     int
		truncated       bool
		first, invalidN string // first row "backend/server"; invalid keys answered
	}{
		{"/v1/state", 9, 9, false, "web/p0000", "3"},
		{"/v1/state?limit=9", 9, 9, false, "web/p0000", "3"},
		{"/v1/state?limit=2", 2, 9, true, "web/p0000", "2"},
		{"/v1/state?limit=4", 4, 9, true, "web/p0000", "3"},
		{"/v1/pollers", 4, 4, false, "web/p0000", ""},
		{"/v1/pollers?limit=3", 3, 4, true, "web/p0000", ""},
		{"/v1/pollers?scope=cluster", 6, 6, false, "api/a", ""},
		{"/v1/pollers?scope=cluster&limit=5", 5, 6, true, "api/a", ""},
		{"/v1/pollers?scope=cluster&limit=100000", 6, 6, false, "api/a", ""},
	} {
		code, body := get(t, h, tt.path)
		var v struct {
			Servers     []api.ServerState `json:"servers"`
			Pollers     []api.Poll        `json:"pollers"`
			InvalidKeys []api.ServerState `json:"invalid_keys"`
			Total       int               `json:"total"`
			Truncated   bool              `json:"truncated"`
		}
		if err := json.Unmarshal([]byte(body), &v); err != nil || code != http.StatusOK {
			t.Errorf("%s: %d %v %s", tt.path, code, err, body)
			continue
		}
		var rows []string
		for _, r := range v.Servers {
			rows = append(rows, r.Backend+"/"+r.Server)
		}
		for _, r := range v.Pollers {
			rows = append(rows, r.Backend+"/"+r.Server)
		}
		if len(rows) != tt.rows || v.Total != tt.total || v.Truncated != tt.truncated || rows[0] != tt.first {
			t.Errorf("%s: rows %v total %d truncated %v; want %d rows from %s, total %d, truncated %v",
				tt.path, rows, v.Total, v.Truncated, tt.rows, tt.first, tt.total, tt.truncated)
		}
		if tt.invalidN != "" && fmt.Sprint(len(v.InvalidKeys)) != tt.invalidN {
			t.Errorf("%s: %d invalid keys, want %s", tt.path, len(v.InvalidKeys), tt.invalidN)
		}
		if strings.HasPrefix(tt.path, "/v1/state") && !strings.Contains(body, `"invalid_total": 3`) {
			t.Errorf("%s: no invalid_total 3 in %s", tt.path, body)
		}
	}
}

// A bad limit is refused with what to send, on every list.
func TestHTTPBadLimit(t *testing.T) {
	h := limitFixture(t, 1)
	for _, path := range []string{"/v1/state", "/v1/pollers", "/v1/pollers?scope=cluster&", "/"} {
		sep := "?"
		if strings.HasSuffix(path, "&") {
			sep = ""
		}
		for _, bad := range []string{"0", "-1", "abc", "1.5", "100001", ""} {
			q := path + sep + "limit=" + bad
			code, body := get(t, h, q)
			if bad == "" { // an empty limit is the default
				if code != http.StatusOK {
					t.Errorf("%s: %d, want 200", q, code)
				}
				continue
			}
			if code != http.StatusBadRequest || !strings.Contains(body, "?limit=N") || !strings.Contains(body, "1 to 100000") {
				t.Errorf("%s: %d %s; want 400 saying to send ?limit=N from 1 to 100000", q, code, body)
			}
		}
	}
}

// The status page shows api.DefaultLimit servers and says when it is cut.
// It shows the cluster's view: the peer's api/a too.
func TestHTTPPageSaysWhenCut(t *testing.T) {
	h := limitFixture(t, 1200) // 1205 servers here, 1206 in the cluster
	code, body := get(t, h, "/")
	if code != http.StatusOK || pageRows(body) != api.DefaultLimit {
		t.Fatalf("status page: %d with %d rows, want %d servers", code, pageRows(body), api.DefaultLimit)
	}
	if want := `showing 1,000 of 1,206 servers; add <a href="/?limit=1206">?limit=1206</a> to see more (at most 100,000)`; !strings.Contains(body, want) {
		t.Errorf("status page without the note %q", want)
	}
	if _, body := get(t, h, "/?limit=1206"); strings.Contains(body, "showing") || pageRows(body) != 1206 {
		t.Errorf("?limit=1206: %d rows, note %v; want every server and no note", pageRows(body), strings.Contains(body, "showing"))
	}
}

// pageRows counts the server rows of a status page.
func pageRows(body string) int { return strings.Count(body, `<tr class="row `) }

// Past api.MaxLimit servers the note does not offer a larger limit.
func TestHTTPPageNoteAtMaxLimit(t *testing.T) {
	var b strings.Builder
	cut := &pageCut{Shown: api.MaxLimit, Total: 120_000, More: api.MaxLimit, Max: api.MaxLimit}
	if err := writePage(&b, pageData{Cut: cut}); err != nil {
		t.Fatal(err)
	}
	if want := "showing 100,000 of 120,000 servers; no page shows more; read one server at /v1/state/&lt;backend&gt;/&lt;server&gt;"; !strings.Contains(b.String(), want) {
		t.Errorf("note at api.MaxLimit: %s\nwant %q", b.String(), want)
	}
}

func TestThousands(t *testing.T) {
	for n, want := range map[int]string{0: "0", 999: "999", 1000: "1,000", 52000: "52,000", 1234567: "1,234,567"} {
		if got := thousands(n); got != want {
			t.Errorf("thousands(%d) = %q, want %q", n, got, want)
		}
	}
}
