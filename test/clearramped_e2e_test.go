package test

import (
	"strings"
	"testing"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/internal/testenv"
)

// Issue 45: `ready --ramp` leaves a key holding ready that backend-wide
// drains do not reach, with a note to clear it later by hand. `clear
// --ramped` deletes such keys once their ramp is done (with their meta
// keys), leaves one whose ramp still runs and one that keeps its server
// out of a backend-wide key, and says why for each.
func TestE2EClearRamped(t *testing.T) {
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	h := StartHastate(t, HastateOptions{ConsulAddr: consul.Addr()})
	for _, s := range []string{"canary_web/web-1", "canary_web/web-2", "canary_api/api-1"} {
		consul.Put(t, stateKey(s), "drain")
	}
	consul.Put(t, stateKey("canary_api/*"), "drain")
	consul.Put(t, stateKey("canary_api/api-1"), "ready") // keeps api-1 out of canary_api/*
	waitRow(t, h, "canary_web", "web-2", func(r api.ServerState) bool { return r.Kind == api.KindDrain })

	run := func(want int, args ...string) string {
		t.Helper()
		out, code := polishRun(t, h, consul.Addr(), args...)
		if code != want {
			t.Fatalf("hastate %s: exit %d, want %d:\n%s", strings.Join(args, " "), code, want, out)
		}
		return out
	}
	out := run(0, "ready", "canary_web/web-1", "--ramp", "2s", "--force")
	if !strings.Contains(out, "`hastate clear --ramped` deletes it once it has ramped") {
		t.Errorf("ready --ramp does not point to clear --ramped:\n%s", out)
	}
	run(0, "ready", "canary_web/web-2", "--ramp", "10m", "--force")
	waitRow(t, h, "canary_web", "web-2", func(r api.ServerState) bool { return r.Kind == api.KindRamping })
	waitRow(t, h, "canary_web", "web-1", func(r api.ServerState) bool { return r.Kind == api.KindReady })

	out = run(0, "clear", "--ramped", "--dry-run")
	for _, want := range []string{
		"clear --ramped: 1 ramped ready key (with their meta keys) would be deleted",
		"  delete " + stateKey("canary_web/web-1") + " (ready, its ramp done)",
		"left " + stateKey("canary_web/web-2") + " (its ramp is at",
		"left " + stateKey("canary_api/api-1") + " (it keeps canary_api/api-1 out of state/canary_api/*, which holds drain",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("clear --ramped --dry-run lacks %q:\n%s", want, out)
		}
	}
	run(0, "clear", "--ramped")
	kv := consul.Client(t).KV()
	for k, want := range map[string]bool{"state/canary_web/web-1": false, "meta/canary_web/web-1": false,
		"state/canary_web/web-2": true, "meta/canary_web/web-2": true, "state/canary_api/api-1": true} {
		p, _, err := kv.Get(kvPrefix+k, nil)
		if err != nil {
			t.Fatal(err)
		}
		if (p != nil) != want {
			t.Errorf("after clear --ramped, %s present: %v, want %v", k, p != nil, want)
		}
	}
}
