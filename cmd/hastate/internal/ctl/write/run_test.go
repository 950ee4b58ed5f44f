package write

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/fleet"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/internal/ctltest"
	"github.com/hastate/hastate/internal/testenv"
)

// Issue 15.9: with Consul unreachable a write says nothing was written and
// does not suggest --force, which cannot help; the "replica unreachable"
// hint does not send the operator to the raft address.
func TestHintsThatDoNotMislead(t *testing.T) {
	dead := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	wr, err := NewWriter(dead, "hastate/")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = Write(ctx, Request{Options: Options{Command: "drain", Value: "drain", MinReady: 1},
		Selectors: []ctl.Selector{{Backend: "canary_web", Server: "web-1"}}, Writer: wr, Replica: pollsReplica(t, nil)})
	if err == nil || strings.Contains(err.Error(), "--force") || !strings.Contains(err.Error(), "nothing was written") || !strings.Contains(err.Error(), dead) {
		t.Fatalf("write with Consul unreachable: %v; want it to name Consul, say nothing was written, and not suggest --force", err)
	}
	err = fleet.Missing([]api.ReplicaAnswer{{ID: "n1", Answered: true}, {ID: "n3", Error: "dial tcp 127.0.0.1:9779: connect: connection refused"}})
	if !errors.Is(err, ctl.ErrCannotConfirm) || strings.Contains(err.Error(), "--addr <it>") || !strings.Contains(err.Error(), "HTTP address") || !strings.Contains(err.Error(), "9778") {
		t.Fatalf("Missing: %v; want a hint at the replica's HTTP address, not the raft one in the error", err)
	}
}

// Issue 18.3: a write command runs without cobra: wait for the sync, read
// the fleet, plan, drop deletes of absent keys, apply; a dry run writes
// nothing. Against a real Consul.
func TestWriteOrchestration(t *testing.T) {
	kv, wr := realConsul(t)
	ctx := context.Background()
	if _, err := kv.Put(&consulapi.KVPair{Key: "hastate/state/canary_web/web-2", Value: []byte("50%")}, nil); err != nil {
		t.Fatal(err)
	}
	write := func(cmd, value string, dry bool, args ...string) (Plan, error) {
		t.Helper()
		sels, err := ctl.ParseSelectors(args)
		if err != nil {
			t.Fatal(err)
		}
		return Write(ctx, Request{Options: Options{Command: cmd, Value: value, MinReady: 1},
			Selectors: sels, DryRun: dry, Writer: wr, Replica: scriptedReplicaOf(t, identityOf(t, wr), 1<<50, nil, func(int) *api.StateView { return ctltest.Fleet() })})
	}
	keys := func() string {
		ks, _, err := kv.Keys("hastate/state/", "", nil)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Join(ks, " ")
	}
	p, err := write("drain", "drain", true, "canary_web/web-1")
	if err != nil || p.Written || planKeys(p) != "canary_web/web-1" || keys() != "hastate/state/canary_web/web-2" {
		t.Fatalf("dry run: %+v %v, keys %q", p, err, keys())
	}
	var out strings.Builder
	p.Report(&out)
	if !strings.Contains(out.String(), "dry run, nothing written") {
		t.Errorf("dry run report: %q", out.String())
	}
	if p, err = write("drain", "drain", false, "canary_web/web-1"); err != nil || !p.Written || keys() != "hastate/state/canary_web/web-1 hastate/state/canary_web/web-2" {
		t.Fatalf("drain: %+v %v, keys %q", p, err, keys())
	}
	// ready of a server with its own key and no backend-wide key: deleted.
	if p, err = write("ready", "ready", false, "canary_web/web-2"); err != nil || !p.Written || keys() != "hastate/state/canary_web/web-1" {
		t.Fatalf("ready: %+v %v, keys %q", p, err, keys())
	}
	// ready of a server without a key: nothing to write, and it says so.
	p, err = write("ready", "ready", false, "main_web/m-1")
	out.Reset()
	p.Report(&out)
	if err != nil || p.Written || !strings.Contains(out.String(), "nothing to write") || !strings.Contains(out.String(), "already ready") {
		t.Fatalf("ready of a server without a key: %v %q", err, out.String())
	}
	// A backend-wide drain in Consul that the replica's view does not show
	// yet: ready writes the server's key, never silently nothing.
	if _, err := kv.Put(&consulapi.KVPair{Key: "hastate/state/main_web/*", Value: []byte("drain")}, nil); err != nil {
		t.Fatal(err)
	}
	p, err = write("ready", "ready", false, "main_web/m-1")
	if err != nil || !p.Written || !strings.Contains(keys(), "hastate/state/main_web/m-1") {
		t.Fatalf("ready under a backend-wide key the replica did not show: %+v %v, keys %q", p, err, keys())
	}
}

// Issue 22.2: a write that a concurrent write overtakes between its read
// and its transaction is read and planned again, never applied on what it
// read: ready of a server with its own drain would delete the key, but a
// backend-wide drain written meanwhile makes it write ready.
func TestWriteReplansAfterAConcurrentWrite(t *testing.T) {
	kv, wr := realConsul(t)
	ctx := context.Background()
	if _, err := kv.Put(&consulapi.KVPair{Key: "hastate/state/main_web/m-1", Value: []byte("drain")}, nil); err != nil {
		t.Fatal(err)
	}
	var concurrent int
	p, err := Write(ctx, Request{Options: Options{Command: "ready", Value: "ready", MinReady: 1},
		Selectors: []ctl.Selector{{Backend: "main_web", Server: "m-1"}}, Writer: wr,
		Replica: scriptedReplicaOf(t, identityOf(t, wr), 1<<50, nil, func(int) *api.StateView { return ctltest.Fleet() }),
		beforeApply: func(attempt int) {
			if attempt == 0 {
				concurrent++
				if _, err := kv.Put(&consulapi.KVPair{Key: "hastate/state/main_web/*", Value: []byte("drain")}, nil); err != nil {
					t.Fatal(err)
				}
			}
		}})
	if err != nil || !p.Written || p.Retried != 1 || concurrent != 1 {
		t.Fatalf("ready overtaken by a backend-wide drain: %+v %v", p, err)
	}
	if got, _, _ := kv.Get("hastate/state/main_web/m-1", nil); got == nil || string(got.Value) != "ready" {
		t.Fatalf("main_web/m-1 = %v after ready under a backend-wide drain written meanwhile; want ready (a delete leaves it drained)", got)
	}
	var out strings.Builder
	p.Report(&out)
	if !strings.Contains(out.String(), "read Consul and planned again once") || !strings.Contains(out.String(), "written as ready under main_web/* (drain)") {
		t.Errorf("report: %s", out.String())
	}
}

// A write waits until the replica has applied the Consul index its plan
// read, and a replica that does not catch up in time refuses the write
// (cannot confirm: the replica tells who polls which server and the
// capacity guard counts from it) unless --allow-no-replica lifts the
// guard, which the plan then names. Here the replica stays at index 1,
// below the prefix's.
func TestWriteWaitsForTheReplicaOrRefuses(t *testing.T) {
	kv, wr := realConsul(t)
	if _, err := kv.Put(&consulapi.KVPair{Key: "hastate/state/main_web/m-2", Value: []byte("maint")}, nil); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name    string
		allow   Allow
		written bool
	}{
		{"refused", Allow{}, false},
		{"--allow-no-replica", Allow{NoReplica: true}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			p, err := Write(ctx, Request{Options: Options{Command: "drain", Value: "drain", MinReady: 1, Allow: tt.allow},
				Selectors: []ctl.Selector{{Backend: "canary_web", Server: "web-1"}}, Writer: wr,
				Replica: scriptedReplicaOf(t, identityOf(t, wr), 1, nil, func(int) *api.StateView { return ctltest.Fleet() })})
			got, _, gerr := kv.Get("hastate/state/canary_web/web-1", nil)
			if gerr != nil {
				t.Fatal(gerr)
			}
			switch {
			case !tt.written && (!errors.Is(err, ctl.ErrCannotConfirm) || !strings.Contains(fmt.Sprint(err), "nothing was written") ||
				!strings.Contains(fmt.Sprint(err), GuardNoReplica.Flag()) || got != nil || p.Written):
				t.Fatalf("a write whose replica never applied the index it read: %v (written %v, key %v), want refused by the guard %q (cannot confirm, nothing written)", err, p.Written, got, GuardNoReplica)
			case tt.written && (err != nil || got == nil || len(p.Lifted) != 1 || p.Lifted[0].Guard != GuardNoReplica):
				t.Fatalf("with --allow-no-replica: %v (key %v, lifted %v), want written with the guard %q named", err, got, p.Lifted, GuardNoReplica)
			}
		})
	}
}

// --override deletes the own keys a backend-wide drain would not reach,
// each only as it was read: one written meanwhile (an operator's maint of
// that server) makes the write read and plan again, never deleted unseen.
func TestOverrideDeletesOwnKeysOnlyAsRead(t *testing.T) {
	kv, wr := realConsul(t)
	ctx := context.Background()
	if _, err := kv.Put(&consulapi.KVPair{Key: "hastate/state/canary_web/web-1", Value: []byte("50%")}, nil); err != nil {
		t.Fatal(err)
	}
	p, err := Write(ctx, Request{Options: Options{Command: "drain", Value: "drain", MinReady: 1, Override: true},
		Selectors: []ctl.Selector{{Backend: "canary_web", Server: "*"}}, Writer: wr,
		Replica: scriptedReplicaOf(t, identityOf(t, wr), 1<<50, nil, func(int) *api.StateView { return ctltest.Fleet() }),
		beforeApply: func(attempt int) {
			if attempt == 0 {
				if _, err := kv.Put(&consulapi.KVPair{Key: "hastate/state/canary_web/web-1", Value: []byte("maint")}, nil); err != nil {
					t.Fatal(err)
				}
			}
		}})
	if err != nil || !p.Written || p.Retried != 1 {
		t.Fatalf("drain canary_web/* --override overtaken by a write to web-1's own key: %+v %v; want it read and planned again once", p, err)
	}
}
