package write

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hastate/hastate/internal/testenv"
	"github.com/hastate/hastate/state"
)

func TestWriterTransactions(t *testing.T) {
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	cl := consul.Client(t)
	w, err := NewWriter(consul.Addr(), "gitlab-haproxy-agent/")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	drain, err := Value("drain", ValueOptions{Reason: "contract", By: "alice", Ramp: "2m", For: time.Hour, Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	set := Plan{Ops: []Op{{Key: "gitlab-haproxy-agent/state/web/a", Value: drain}, {Key: "gitlab-haproxy-agent/state/web/*", Value: drain}}}
	if err := w.Apply(ctx, set); err != nil {
		t.Fatal(err)
	}
	// The runbook's contract: the state key holds the word; the meta key
	// beside it holds what hastate adds.
	for _, o := range set.Ops {
		p, _, err := cl.KV().Get(o.Key, nil)
		if err != nil || p == nil || string(p.Value) != "drain" {
			t.Fatalf("%s = %v, %v, want the word drain", o.Key, p, err)
		}
		mk, _ := state.MetaKeyOf(o.Key)
		p, _, err = cl.KV().Get(mk, nil)
		if err != nil || p == nil {
			t.Fatalf("meta key %s: %v, %v", mk, p, err)
		}
		m, err := state.ParseMeta(string(p.Value))
		if err != nil || m.String() != "drain" || m.Reason != "contract" || m.By != "alice" || m.Until.IsZero() || m.At.IsZero() || !m.RampSet || m.Ramp != 2*time.Minute {
			t.Fatalf("meta key %s = %s (%+v, %v)", mk, p.Value, m, err)
		}
	}
	// Issue 22.2: the transaction is conditional on what the plan read.
	a, _, err := cl.KV().Get("gitlab-haproxy-agent/state/web/a", nil)
	if err != nil || a == nil {
		t.Fatal(a, err)
	}
	read := KVKey{Key: a.Key, Present: true, Value: "drain", Index: a.ModifyIndex}
	absent := KVKey{Key: "gitlab-haproxy-agent/state/web/b"}
	stale := Plan{Ops: []Op{{Delete: true, Key: a.Key}}, Deps: []KVKey{{Key: a.Key, Present: true, Index: a.ModifyIndex - 1}, absent}}
	var conflict *ConflictError
	if err := w.Apply(ctx, stale); !errors.As(err, &conflict) || !errors.Is(err, ErrConflict) || len(conflict.Keys) != 1 || conflict.Keys[0] != a.Key {
		t.Fatalf("delete at a stale index: %v, want a ConflictError on %s", err, a.Key)
	}
	// A set is conditional the same way: on the index read, and, for a
	// key read as absent, on its absence (KVCAS with index 0).
	for _, dep := range []KVKey{{Key: a.Key, Present: true, Value: "drain", Index: a.ModifyIndex - 1}, {Key: a.Key}} {
		set := Plan{Ops: []Op{{Key: a.Key, Value: "maint"}}, Deps: []KVKey{dep}}
		if err := w.Apply(ctx, set); !errors.As(err, &conflict) || len(conflict.Keys) != 1 || conflict.Keys[0] != a.Key {
			t.Fatalf("set %s read as %s: %v, want a ConflictError on it", a.Key, dep, err)
		}
		if p, _, _ := cl.KV().Get(a.Key, nil); p == nil || string(p.Value) != "drain" || p.ModifyIndex != a.ModifyIndex {
			t.Fatalf("a set read as %s overwrote %s: %+v", dep, a.Key, p)
		}
	}
	created := Plan{Ops: []Op{{Key: absent.Key, Value: "drain"}}, Deps: []KVKey{absent, {Key: "gitlab-haproxy-agent/state/web/*", Present: true, Index: 1}}}
	if err := w.Apply(ctx, created); !errors.As(err, &conflict) || conflict.Keys[0] != "gitlab-haproxy-agent/state/web/*" {
		t.Fatalf("a check of a key that changed: %v", err)
	}
	if p, _, _ := cl.KV().Get(absent.Key, nil); p != nil {
		t.Fatalf("a rolled-back transaction wrote %s", absent.Key)
	}
	clear := Plan{Ops: []Op{{Delete: true, Key: a.Key}}, Deps: []KVKey{read, absent}}
	if err := w.Apply(ctx, clear); err != nil {
		t.Fatal(err)
	}
	// Consul down: a clear error that says nothing was written and what to check.
	consul.Kill()
	err = w.Apply(ctx, set)
	if err == nil || !strings.Contains(err.Error(), "nothing was written") || !strings.Contains(err.Error(), "CONSUL_HTTP_ADDR") ||
		!strings.Contains(err.Error(), consul.Addr()) {
		t.Fatalf("write with Consul down: %v", err)
	}
}
