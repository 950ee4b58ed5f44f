package migration

import (
	"bufio"
	"context"
	"errors"
	"io"
	"maps"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/internal/ctltest"
)

// TestUnlikeKeys: the keys the per-node agent serves differently from
// hastate, which `migration start` refuses and `migration status` lists.
func TestUnlikeKeys(t *testing.T) {
	kv := map[string]string{
		"state/web/a":      "drain",
		"state/web/b":      " 50% ",
		"state/web/*":      "ready",             // the same as no key, for both
		"state/api/*":      "drain",             // the agent ignores it
		"state/api/c":      `{"state":"drain"}`, // JSON: the agent answers nothing
		"state/api/d":      "DRAIN",             // hastate reads it, the agent does not
		"state/api/e":      "maint",
		"meta/api/e":       `{"state":"maint","until":"2026-12-02T03:00:00Z"}`,
		"state/api/f":      "drain",
		"meta/api/f":       `{"state":"maint","until":"2026-12-02T03:00:00Z"}`, // describes another state: ignored by hastate too
		"state/api/g":      "ready",
		"meta/api/g":       `{"state":"ready","ramp":"10m"}`,
		"config/migration": `{"started":"2026-12-02T01:00:00Z"}`,
		"config/ramp":      `{"duration":"5m"}`,
	}
	got := strings.Join(unlikeKeys(kv), "\n")
	for _, want := range []string{`api/* = "drain": a backend-wide key`, `api/c = "{\"state\":\"drain\"}": not one of the per-node agent's four words`,
		`api/d = "DRAIN": not one of`, `api/e = "maint" expires at 2026-12-02T03:00:00Z`, `api/g = "ready" undrains with its own ramp (10m0s`} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %q in:\n%s", want, got)
		}
	}
	if n := len(unlikeKeys(kv)); n != 5 {
		t.Errorf("%d keys, want 5:\n%s", n, got)
	}
}

// TestSameAnswer: what compare counts as the same answer.
func TestSameAnswer(t *testing.T) {
	for _, tt := range []struct {
		row  api.ServerState
		line string
		want bool
	}{
		{api.ServerState{Answer: "drain", Kind: api.KindDrain}, "drain", true},
		{api.ServerState{Answer: "drain", Kind: api.KindDrain}, "ready 100%", false},
		{api.ServerState{Answer: "drain", Kind: api.KindDrain}, "", false},
		{api.ServerState{Answer: "ready 100%", Kind: api.KindReady}, "ready", false}, // "ready" alone leaves the weight as it was
		{api.ServerState{Answer: "ready 40%", Kind: api.KindRamping}, "ready 100%", true},
		{api.ServerState{Answer: "ready 40%", Kind: api.KindRamping}, "ready 50%", true},
		{api.ServerState{Answer: "ready 40%", Kind: api.KindRamping}, "ready 0%", false},
		{api.ServerState{Answer: "ready 40%", Kind: api.KindRamping}, "drain", false},
		{api.ServerState{Withheld: true, Kind: api.KindWithheld}, "", true},
		{api.ServerState{Withheld: true, Kind: api.KindWithheld}, "ready 100%", false},
		{api.ServerState{Answer: "ready 25%", Kind: api.KindWeight}, "ready 25%", true},
	} {
		if got := sameAnswer(tt.row, tt.line); got != tt.want {
			t.Errorf("sameAnswer(%s %q, %q) = %v", tt.row.Kind, tt.row.Answer, tt.line, got)
		}
	}
}

// TestCompare: compare asks the agent about every known server (never a
// backend-wide key) and names each difference; a server it cannot ask
// in time cannot be confirmed.
func TestCompare(t *testing.T) {
	agent := func(t *testing.T, answers map[string]string) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					req, err := bufio.NewReader(c).ReadString('\n')
					if err != nil {
						return
					}
					switch line, ok := answers[strings.TrimSuffix(req, "\n")]; {
					case line == "hang":
						_, _ = io.Copy(io.Discard, c) // answers nothing until the client gives up
					case ok && line != "":
						_, _ = c.Write([]byte(line + "\n"))
					case !ok:
						_, _ = c.Write([]byte("ready 100%\n"))
					}
				}()
			}
		}()
		return ln.Addr().String()
	}
	f := ctltest.Fleet()
	same := map[string]string{"canary_api/api-1": "drain", "canary_web/web-2": "ready 50%", "main_web/m-3": "maint"}
	g := fakeGate(t, f, nil)
	res, err := Compare(context.Background(), CompareOptions{Agent: agent(t, same), Gate: g})
	if err != nil || len(res.Differ) != 0 || len(res.Unconfirmed) != 0 || res.Checked != 10 {
		t.Fatalf("the same agent: %+v, %v; want 10 servers, no difference", res, err)
	}
	odd := maps.Clone(same)
	odd["canary_api/api-1"] = "ready 100%" // an agent that ignores canary_api/*
	odd["main_web/m-1"] = ""               // answers nothing
	odd["main_web/m-2"] = "hang"
	res, err = Compare(context.Background(), CompareOptions{Agent: agent(t, odd), Gate: g, CheckTimeout: 200 * time.Millisecond})
	if err != nil || len(res.Differ) != 2 || len(res.Unconfirmed) != 1 {
		t.Fatalf("an agent that differs: %+v, %v", res, err)
	}
	if !strings.Contains(res.Differ[0], `canary_api/api-1: the agent answers "ready 100%", hastate "drain" (from the backend-wide key canary_api/*, which the per-node agent ignores)`) ||
		!strings.Contains(res.Differ[1], "main_web/m-1: the agent answers nothing (HAProxy keeps its state)") ||
		!strings.Contains(res.Unconfirmed[0], "main_web/m-2: agent at") {
		t.Errorf("differ %q, unconfirmed %q", res.Differ, res.Unconfirmed)
	}
	g.Selectors = []ctl.Selector{{Backend: "canary_wbe", Server: "*"}}
	if _, err := Compare(context.Background(), CompareOptions{Agent: agent(t, same), Gate: g}); !errors.Is(err, ctl.ErrNoMatch) {
		t.Errorf("a selector that matches nothing: %v, want ErrNoMatch", err)
	}
}
