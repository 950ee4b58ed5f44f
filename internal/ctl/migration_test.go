package ctl

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hastate/hastate/api"
)

// TestPlanWriteDuringMigration: while a migration from the per-node agent
// is marked, every write is one the per-node agent serves the same way.
func TestPlanWriteDuringMigration(t *testing.T) {
	for _, tt := range []struct {
		name, cmd, value string
		args             []string
		o                WriteOptions
		want, note       string // keys ("-": delete) or "ERR:" and the error text; a note
	}{
		{name: "a canary drain expands to per-server keys", cmd: "drain", args: []string{"canary_*/*"}, o: WriteOptions{Override: true},
			want: "canary_api/api-1 canary_web/web-1 canary_web/web-2", note: "canary_*/* expanded to the per-server keys of canary_web (the per-node agent ignores backend-wide keys): web-1, web-2"},
		{name: "a server whose own key escapes the drain is refused", cmd: "drain", args: []string{"canary_web"},
			want: "ERR:canary_web/* (expanded to per-server keys: a migration from the per-node agent is marked) would not change servers with their own key: web-2 keeps 50%"},
		{name: "keep-own leaves it", cmd: "drain", args: []string{"canary_web"}, o: WriteOptions{KeepOwn: true},
			want: "canary_web/web-1", note: "servers with their own key left as they are: web-2 keeps 50%"},
		{name: "a backend drain is not refused by min-ready", cmd: "maint", args: []string{"main_web"}, want: "main_web/gke-cny-web main_web/m-1 main_web/m-2 main_web/m-3"},
		{name: "ready of a backend deletes every key it has", cmd: "ready", args: []string{"canary_*/*"}, want: "-canary_api/* -canary_web/web-2",
			note: "canary_*/* deletes every key of canary_api"},
		{name: "clear of a backend too", cmd: "clear", args: []string{"main_web"}, want: "-main_web/m-3"},
		{name: "ready of a backend leaves a server's own maint", cmd: "ready", args: []string{"main_web"}, want: "",
			note: "main_web: servers with their own key left as they are: m-3 keeps maint (--override makes it ready too)"},
		{name: "ready of a backend with --override readies it too", cmd: "ready", args: []string{"main_web"}, o: WriteOptions{Override: true}, want: "-main_web/m-3"},
		{name: "a zonal drain is per server as always", cmd: "drain", args: []string{"*/*-us-east1-b"}, want: "main_api/x-us-east1-b"},
		{name: "--for is refused", cmd: "drain", value: `{"state":"drain","until":"2026-12-02T03:00:00Z"}`, args: []string{"canary_web/web-1"},
			want: "ERR:--for would expire the state only on the HAProxy nodes that ask hastate"},
		{name: "--ramp is refused", cmd: "ready", value: `{"state":"ready","ramp":"10m"}`, args: []string{"canary_web/web-2"},
			want: "ERR:--ramp would ramp the weight only on the HAProxy nodes that ask hastate"},
		{name: "--reason is fine (the meta key changes no answer)", cmd: "drain", value: `{"state":"drain","reason":"r"}`, args: []string{"canary_web/web-1"},
			want: "canary_web/web-1"},
		{name: "the typo guard accepts a server with a key in Consul", cmd: "drain", args: []string{"main_web/m-3"}, want: "main_web/m-3"},
		{name: "the typo guard still refuses a typo", cmd: "drain", args: []string{"main_web/m-4"},
			want: "ERR:no server matches 'main_web/m-4': no HAProxy that asks hastate has polled main_web/m-4"},
		{name: "a backend no moved HAProxy polls is refused", cmd: "drain", args: []string{"new_web"},
			want: "ERR:no HAProxy that asks hastate polls any of them: hastate knows only those with a key (n-1)"},
		{name: "ready under a backend-wide key writes ready", cmd: "ready", args: []string{"canary_api/api-1"}, want: "canary_api/api-1"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			sels, err := ParseSelectors(tt.args)
			if err != nil {
				t.Fatal(err)
			}
			o := tt.o
			o.Command, o.Prefix, o.MinReady, o.Migration, o.MigrationKey = tt.cmd, "hastate/", 1, true, "hastate/config/migration"
			o.Value = tt.value
			if o.Value == "" {
				o.Value = `{"state":"` + tt.cmd + `"}`
			}
			f := fleet()
			f.Servers = append(f.Servers, api.ServerState{Backend: "new_web", Server: "n-1", Key: "state/new_web/n-1", Source: "state/new_web/n-1", Desired: "drain", Kind: api.KindDrain, Answer: "drain"})
			p, err := planAll(t, f, kvOf(f, nil), sels, o)
			if want, ok := strings.CutPrefix(tt.want, "ERR:"); ok {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Fatalf("err = %v, want %q", err, want)
				}
				return
			}
			if err != nil || planKeys(p) != tt.want {
				t.Fatalf("plan %q, %v; want %q", planKeys(p), err, tt.want)
			}
			if tt.note != "" && !strings.Contains(strings.Join(p.Notes, "\n"), tt.note) {
				t.Errorf("notes %q, want %q", p.Notes, tt.note)
			}
			for _, op := range p.Ops {
				if strings.HasSuffix(op.Key, "/*") && !op.Delete {
					t.Errorf("a backend-wide key written during a migration: %s", op.Key)
				}
			}
		})
	}
}

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
	f := fleet()
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
	g.Selectors = []Selector{{"canary_wbe", "*"}}
	if _, err := Compare(context.Background(), CompareOptions{Agent: agent(t, same), Gate: g}); !errors.Is(err, ErrNoMatch) {
		t.Errorf("a selector that matches nothing: %v, want ErrNoMatch", err)
	}
}

// TestMarkerIsADependency: every write's transaction checks the migration
// marker as it was read, and counts that check against Consul's limit.
func TestMarkerIsADependency(t *testing.T) {
	f := fleet()
	sels, _ := ParseSelectors([]string{"canary_web/web-1"})
	absent := KVKey{Key: "hastate/config/migration"}
	p, err := planAll(t, f, kvOf(f, nil), sels, WriteOptions{Command: "drain", Value: "drain", Prefix: "hastate/", MinReady: 1, Marker: &absent})
	if err != nil || !slices.Contains(p.Deps, absent) {
		t.Fatalf("deps %v, %v: want the absent marker among them", p.Deps, err)
	}
	var big []string
	for i := range MaxTxnKeys / 2 { // each key and its meta key fill the transaction
		s := fmt.Sprintf("s%02d", i)
		f.Servers = append(f.Servers, api.ServerState{Backend: "big", Server: s, Polled: 1, Answer: "ready 100%", Kind: api.KindReady, Weight: 100})
		big = append(big, "big/"+s)
	}
	sels, _ = ParseSelectors(big)
	o := WriteOptions{Command: "weight 50%", Value: "50%", Prefix: "hastate/", MinReady: 1}
	if _, err := planAll(t, f, kvOf(f, nil), sels, o); err != nil {
		t.Fatalf("%d keys, %d operations: %v", len(big), MaxTxnKeys, err)
	}
	o.Marker = &absent
	if _, err := planAll(t, f, kvOf(f, nil), sels, o); err == nil || !strings.Contains(err.Error(), "more than one Consul transaction holds") {
		t.Fatalf("with the marker's check: %v", err)
	}
}
