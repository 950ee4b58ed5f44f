package state_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/hastate/hastate/state"
)

func TestParseRequest(t *testing.T) {
	tests := []struct {
		name            string
		req             string
		backend, server string
		err             string // part of the error message; empty: valid
	}{
		{name: "bare", req: "web/a", backend: "web", server: "a"},
		{name: "LF", req: "web/a\n", backend: "web", server: "a"},
		{name: "CRLF", req: "web/a\r\n", backend: "web", server: "a"},
		{name: "runbook example", req: "canary_web/gke-cny-web\n", backend: "canary_web", server: "gke-cny-web"},
		{name: "dots and colons", req: "be.v2/srv:1\n", backend: "be.v2", server: "srv:1"},
		{name: "one byte each", req: "b/s", backend: "b", server: "s"},
		{name: "wildcard server", req: "web/*\n", backend: "web", server: "*"},

		{name: "empty", req: "", err: "empty"},
		{name: "LF only", req: "\n", err: "empty"},
		{name: "CRLF only", req: "\r\n", err: "empty"},
		{name: "no slash", req: "web", err: "want <backend>/<server>"},
		{name: "no slash LF", req: "web-a\n", err: "want <backend>/<server>"},
		{name: "slash only", req: "/", err: "want <backend>/<server>"},
		{name: "slash only LF", req: "/\n", err: "want <backend>/<server>"},
		{name: "empty backend", req: "/a", err: "want <backend>/<server>"},
		{name: "empty backend LF", req: "/a\n", err: "want <backend>/<server>"},
		{name: "empty server", req: "web/", err: "want <backend>/<server>"},
		{name: "empty server CRLF", req: "web/\r\n", err: "want <backend>/<server>"},
		{name: "two slashes", req: "a/b/c", err: "want <backend>/<server>"},
		{name: "double slash", req: "web//a", err: "want <backend>/<server>"},
		{name: "trailing slash", req: "web/a/\n", err: "want <backend>/<server>"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, s, err := state.ParseRequest([]byte(tt.req))
			if tt.err != "" {
				if err == nil {
					t.Fatalf("ParseRequest(%q) = %q, %q; want an error", tt.req, b, s)
				}
				if !errors.Is(err, state.ErrMalformedRequest) {
					t.Errorf("ParseRequest(%q) error %q does not wrap ErrMalformedRequest", tt.req, err)
				}
				if !strings.Contains(err.Error(), tt.err) {
					t.Errorf("ParseRequest(%q) error %q, want it to mention %q", tt.req, err, tt.err)
				}
				if b != nil || s != nil {
					t.Errorf("ParseRequest(%q) returned %q, %q with an error", tt.req, b, s)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseRequest(%q): %v", tt.req, err)
			}
			if string(b) != tt.backend || string(s) != tt.server {
				t.Errorf("ParseRequest(%q) = %q, %q; want %q, %q", tt.req, b, s, tt.backend, tt.server)
			}
		})
	}
}

// TestParseRequestMaxLength pins the length limit: MaxRequest (256) bytes as
// received, terminator included.
func TestParseRequestMaxLength(t *testing.T) {
	if state.MaxRequest != 256 {
		t.Fatalf("MaxRequest = %d, the contract says 256", state.MaxRequest)
	}
	// request builds "b/sss...s" + term, exactly n bytes long in all.
	request := func(n int, term string) string {
		return "b/" + strings.Repeat("s", n-2-len(term)) + term
	}
	tests := []struct {
		name string
		req  string
		ok   bool
	}{
		{name: "256 bare", req: request(256, ""), ok: true},
		{name: "256 with LF", req: request(256, "\n"), ok: true},
		{name: "256 with CRLF", req: request(256, "\r\n"), ok: true},
		{name: "257 bare", req: request(257, "")},
		{name: "257 with LF", req: request(257, "\n")},
		{name: "257 with CRLF", req: request(257, "\r\n")},
		{name: "4096", req: request(4096, "\n")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, s, err := state.ParseRequest([]byte(tt.req))
			if !tt.ok {
				if !errors.Is(err, state.ErrMalformedRequest) {
					t.Fatalf("ParseRequest(%d bytes) = %v, want ErrMalformedRequest", len(tt.req), err)
				}
				if !strings.Contains(err.Error(), "longer than 256 bytes") {
					t.Errorf("ParseRequest(%d bytes) error %q does not name the limit", len(tt.req), err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseRequest(%d bytes): %v", len(tt.req), err)
			}
			want := strings.TrimSuffix(strings.TrimSuffix(tt.req, "\n"), "\r")
			if got := string(b) + "/" + string(s); got != want {
				t.Errorf("ParseRequest(%d bytes) = %q, want %q", len(tt.req), got, want)
			}
		})
	}
}

// TestParseRequestAliasesInput: backend and server are sub-slices of the
// request, which is what lets the agent server pass them to Lookup without
// copying.
func TestParseRequestAliasesInput(t *testing.T) {
	req := []byte("web/a\r\n")
	b, s, err := state.ParseRequest(req)
	if err != nil {
		t.Fatal(err)
	}
	if &b[0] != &req[0] || &s[0] != &req[4] {
		t.Errorf("ParseRequest returned copies, want sub-slices of the request")
	}
}

func TestParseRequestDoesNotAllocate(t *testing.T) {
	for _, req := range [][]byte{
		[]byte("web/a"),
		[]byte("canary_web/gke-cny-web\r\n"),
		[]byte(""),
		[]byte("no-slash\n"),
		[]byte("a/b/c\n"),
		[]byte(strings.Repeat("x", 300)),
	} {
		allocs := testing.AllocsPerRun(100, func() {
			_, _, _ = state.ParseRequest(req)
		})
		if allocs != 0 {
			t.Errorf("ParseRequest(%q) allocates %v times per call, want 0", req, allocs)
		}
	}
}

func TestLookupDoesNotAllocate(t *testing.T) {
	snap := snapshotOf(t, map[string]string{
		"state/web/a":  "drain",
		"state/web/*":  "25%",
		"state/api/x":  "bogus", // withheld
		"state/db/*":   "maint",
		"config/other": "x",
	})
	for _, raw := range []string{
		"web/a\n",    // exact key
		"web/new\n",  // wildcard
		"api/x\r\n",  // withheld
		"api/y\n",    // absent
		"other/a\n",  // absent, unknown backend
		"db/primary", // wildcard
	} {
		req := []byte(raw)
		var line []byte
		allocs := testing.AllocsPerRun(100, func() {
			b, s, err := state.ParseRequest(req)
			if err != nil {
				panic(err)
			}
			line = snap.Lookup(req[:len(b)+1+len(s)], len(b))
		})
		if allocs != 0 {
			t.Errorf("ParseRequest+Lookup(%q) allocates %v times per call, want 0", raw, allocs)
		}
		if line != nil && !strings.HasSuffix(string(line), "\n") {
			t.Errorf("Lookup(%q) = %q, want an LF-terminated line", raw, line)
		}
	}
	var nilSnap *state.Snapshot
	req := []byte("web/a")
	if allocs := testing.AllocsPerRun(100, func() { nilSnap.Lookup(req, 3) }); allocs != 0 {
		t.Errorf("nil Snapshot Lookup allocates %v times per call, want 0", allocs)
	}
}
