package cluster

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/hastate/hastate/cluster/leader"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// TestLogsAreAnAuditTrail: "kv change applied" names each key with its old
// and new state; an invalid value is logged once per key and value (cut to
// 200 bytes, with the reason); a second, different bad ramp policy is
// logged again.
func TestLogsAreAnAuditTrail(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	n := startLeader(t, Options{Logger: zap.New(core)})
	ctx := context.Background()
	apply := func(i uint64, kv map[string]string) {
		t.Helper()
		if err := n.ApplyKV(ctx, i, kv); err != nil {
			t.Fatal(err)
		}
	}
	apply(1, map[string]string{"state/web/a": "ready", "state/web/b": "maint"})
	huge := strings.Repeat("x", 500<<10)
	kv := map[string]string{
		"state/web/a": `{"state":"drain","by":"alice","reason":"zonal maintenance"}`,
		"state/web/c": "drian",
		"state/web/d": huge,
		"state/odd":   "drain",
		"config/ramp": `{"interval":"0"}`,
	}
	apply(2, kv)
	apply(3, kv) // the same content again: nothing new to log

	applied := logs.FilterMessage("kv change applied").All()
	if len(applied) != 2 {
		t.Fatalf("%d 'kv change applied' lines, want 2", len(applied))
	}
	got := fmt.Sprint(applied[1].ContextMap()["changes"])
	for _, want := range []string{
		"key:state/web/a new:drain by alice (zonal maintenance) old:ready",
		"key:state/web/b new:(absent) old:maint",
		"key:state/web/c new:invalid: drian old:(absent)",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("changes %s\ndo not contain %q", got, want)
		}
	}
	if strings.Contains(got, huge[:300]) {
		t.Error("a 500 KB value is logged whole")
	}

	invalid := logs.FilterMessageSnippet("ignoring an invalid KV value").All()
	seen := map[string]int{}
	for _, e := range invalid {
		m := e.ContextMap()
		seen[m["key"].(string)]++
		if v := m["value"].(string); len(v) > leader.MaxLoggedValue+3 {
			t.Errorf("value logged with %d bytes, want at most %d", len(v), leader.MaxLoggedValue)
		}
		if m["reason"] == "" {
			t.Errorf("%v: no reason", m)
		}
	}
	if len(seen) != 3 || seen["state/web/c"] != 1 || seen["state/web/d"] != 1 || seen["state/odd"] != 1 {
		t.Errorf("invalid values logged %v, want state/web/c, state/web/d and state/odd once each", seen)
	}

	kv["config/ramp"] = `{"aggression":-1}`
	apply(4, kv)
	if got := len(logs.FilterMessageSnippet("ignoring invalid ramp policy").All()); got != 2 {
		t.Errorf("%d ramp policy warnings for two different bad values, want 2", got)
	}
}
