package ctl

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/hastate/hastate/internal/testenv"
	"github.com/hastate/hastate/state"
)

func TestParseTargets(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string // joined targets, or the error substring after "ERR:"
	}{
		{[]string{"web/a", "web/*", "web/a"}, "web/a web/*"},
		{nil, "ERR:at least one"},
		{[]string{"web"}, "ERR:not <backend>/<server>"},
		{[]string{"web/"}, "ERR:not <backend>/<server>"},
		{[]string{"/a"}, "ERR:not <backend>/<server>"},
		{[]string{"a/b/c"}, "ERR:not <backend>/<server>"},
		{[]string{"a/b c"}, "ERR:not <backend>/<server>"},
	} {
		got, err := ParseTargets(tt.args)
		if strings.HasPrefix(tt.want, "ERR:") {
			if !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), tt.want[4:]) {
				t.Errorf("ParseTargets(%q) err = %v, want usage error with %q", tt.args, err, tt.want[4:])
			}
			continue
		}
		var s []string
		for _, x := range got {
			s = append(s, x.String())
		}
		if err != nil || strings.Join(s, " ") != tt.want {
			t.Errorf("ParseTargets(%q) = %v, %v", tt.args, s, err)
		}
	}
	many := make([]string, MaxTxnKeys+1)
	for i := range many {
		many[i] = fmt.Sprintf("b/s%d", i)
	}
	if _, err := ParseTargets(many); err == nil || !strings.Contains(err.Error(), "split") {
		t.Errorf("%d targets: %v, want a usage error telling to split", len(many), err)
	}
}

func TestValue(t *testing.T) {
	v, err := Value("drain", "zonal maintenance", "alice", "10m")
	if err != nil {
		t.Fatal(err)
	}
	p, err := state.ParseValue(v)
	if err != nil || p.Admin != state.Drain || p.Reason != "zonal maintenance" || p.By != "alice" || !p.RampSet {
		t.Fatalf("Value round trip: %q -> %+v, %v", v, p, err)
	}
	for _, bad := range [][2]string{{"300%", ""}, {"drian", ""}, {"drain", "ten minutes"}} {
		_, err := Value(bad[0], "", "", bad[1])
		if !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), "valid forms") {
			t.Errorf("Value(%q, ramp %q) = %v, want usage error showing the valid forms", bad[0], bad[1], err)
		}
	}
}

func TestWriterTransactions(t *testing.T) {
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	cl := consul.Client(t)
	w, err := NewWriter(consul.Addr(), "gitlab-haproxy-agent/")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	targets, _ := ParseTargets([]string{"web/a", "web/*"})
	if err := w.Set(ctx, targets, `{"state":"drain"}`); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"gitlab-haproxy-agent/state/web/a", "gitlab-haproxy-agent/state/web/*"} {
		p, _, err := cl.KV().Get(k, nil)
		if err != nil || p == nil || string(p.Value) != `{"state":"drain"}` {
			t.Fatalf("%s = %v, %v", k, p, err)
		}
	}
	if err := w.Clear(ctx, targets[:1]); err != nil {
		t.Fatal(err)
	}
	if p, _, _ := cl.KV().Get("gitlab-haproxy-agent/state/web/a", nil); p != nil {
		t.Fatal("clear left the key")
	}

	// Consul down: a clear error that says nothing was written and what to check.
	consul.Kill()
	err = w.Set(ctx, targets, "drain")
	if err == nil || !strings.Contains(err.Error(), "nothing was written") || !strings.Contains(err.Error(), "CONSUL_HTTP_ADDR") ||
		!strings.Contains(err.Error(), consul.Addr()) {
		t.Fatalf("write with Consul down: %v", err)
	}
}

func TestMatch(t *testing.T) {
	r := Row{Backend: "canary_web", Server: "gke-1"}
	for sel, want := range map[string]bool{"": true, "canary_*/*": true, "canary_web": true, "canary_web/gke-2": false, "*/gke-?": true, "main_*/*": false} {
		if got, err := Match(sel, r); err != nil || got != want {
			t.Errorf("Match(%q) = %v, %v; want %v", sel, got, err, want)
		}
	}
	if _, err := Match("[", r); !errors.Is(err, ErrUsage) {
		t.Errorf("bad glob: %v", err)
	}
}
