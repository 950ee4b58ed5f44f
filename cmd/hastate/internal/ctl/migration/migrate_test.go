package migration

import (
	"context"
	"strings"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/write"
	"github.com/hastate/hastate/internal/testenv"
	"github.com/hastate/hastate/state"
)

// migrate-kv rewrites JSON state keys as word + meta, leaves what it must
// not touch, and never overwrites a concurrent write: the batch that lost
// the race is read again.
func TestMigrateRewritesWithCAS(t *testing.T) {
	srv := testenv.StartConsul(t, testenv.ConsulOptions{})
	kv := srv.Client(t).KV()
	const prefix = "gitlab-haproxy-agent/"
	w, err := write.NewWriter(srv.Addr(), prefix)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	until := now.Add(2 * time.Hour).UTC().Format(time.RFC3339)
	put := func(k, v string) {
		t.Helper()
		if _, err := kv.Put(&consul.KVPair{Key: prefix + k, Value: []byte(v)}, nil); err != nil {
			t.Fatal(err)
		}
	}
	get := func(k string) string {
		t.Helper()
		p, _, err := kv.Get(prefix+k, nil)
		if err != nil {
			t.Fatal(err)
		}
		if p == nil {
			return "<absent>"
		}
		return string(p.Value)
	}
	put("state/web/a", `{"state":"drain","reason":"contract","by":"root","at":"2026-11-30T10:00:00Z","until":"`+until+`","ramp":"2m"}`)
	put("state/web/b", `{"state":"30%","by":"root"}`)
	put("state/web/*", `{"state":"Maint"}`)
	put("state/web/c", "drain")                   // already a word
	put("state/web/d", `{"state":"drain","x":1}`) // invalid (unknown field)
	put("state/web/e", `{"state":"drain","until":"`+now.Add(-time.Hour).UTC().Format(time.RFC3339)+`"}`)
	put("config/ramp", `{"duration":"1m"}`)

	if _, err := MigrateKV(context.Background(), w, state.LevelBase, MigrateOptions{Now: now}); err == nil || !strings.Contains(err.Error(), "finish the rolling upgrade") {
		t.Fatalf("migrate at level 1: %v, want a refusal", err)
	}
	dry, err := MigrateKV(context.Background(), w, state.LevelMeta, MigrateOptions{Now: now, DryRun: true})
	if err != nil || len(dry.Rewritten) != 3 || get("state/web/b") != `{"state":"30%","by":"root"}` {
		t.Fatalf("dry run: %+v %v; web/b = %s", dry, err, get("state/web/b"))
	}
	// An operator writes web/b while the first batch is on its way.
	raced := false
	res, err := MigrateKV(context.Background(), w, state.LevelMeta, MigrateOptions{Now: now, Batch: 2, beforeWrite: func() {
		if !raced {
			raced = true
			put("state/web/b", `{"state":"40%","by":"alice"}`)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Retried == 0 {
		t.Errorf("result %+v: the concurrent write was not noticed", res)
	}
	for k, want := range map[string]string{
		"state/web/a": "drain", "state/web/b": "40%", "state/web/*": "maint", "state/web/c": "drain",
		"state/web/d": `{"state":"drain","x":1}`, "meta/web/c": "<absent>", "config/ramp": `{"duration":"1m"}`,
	} {
		if got := get(k); got != want {
			t.Errorf("%s = %s, want %s", k, got, want)
		}
	}
	if !strings.HasPrefix(get("state/web/e"), "{") {
		t.Errorf("an expired key was rewritten: %s", get("state/web/e"))
	}
	for k, want := range map[string]state.Value{
		"meta/web/a": {Reason: "contract", By: "root", Ramp: 2 * time.Minute, RampSet: true},
		"meta/web/b": {By: "alice"},
	} {
		m, err := state.ParseMeta(get(k))
		if err != nil || m.Reason != want.Reason || m.By != want.By || m.Ramp != want.Ramp || m.RampSet != want.RampSet {
			t.Errorf("%s = %s: %+v %v", k, get(k), m, err)
		}
	}
	if m, _ := state.ParseMeta(get("meta/web/a")); m.Until.Format(time.RFC3339) != until || m.At.IsZero() {
		t.Errorf("meta/web/a lost until or at: %s", get("meta/web/a"))
	}
	left := strings.Join(res.Left, "\n")
	if !strings.Contains(left, "state/web/d: its value is invalid") || !strings.Contains(left, "state/web/e: its until") {
		t.Errorf("left: %s", left)
	}
	// Run again: nothing left to rewrite.
	again, err := MigrateKV(context.Background(), w, state.LevelMeta, MigrateOptions{Now: now})
	if err != nil || len(again.Rewritten) != 0 {
		t.Errorf("second run: %+v %v", again, err)
	}
}

// Issue 27.13: counts agree with what they count.
func TestMigrateReportCounts(t *testing.T) {
	var out strings.Builder
	MigrateResult{Rewritten: []string{"state/web/a"}}.Print(&out, false)
	if !strings.Contains(out.String(), "1 JSON state key rewritten") {
		t.Errorf("migrate-kv: %q", out.String())
	}
}
