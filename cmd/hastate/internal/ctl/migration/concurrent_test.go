package migration

import (
	"context"
	"strings"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/fleet"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/internal/ctltest"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/write"
	"github.com/hastate/hastate/internal/testenv"
	"github.com/hastate/hastate/kvsync"
	"github.com/hastate/hastate/state"
)

// Issue 34: `migration start` against a concurrent backend-wide drain,
// with a real Consul. The drain reads the marker absent and commits
// between start's read of the prefix and its CAS of the marker: the CAS
// covers only the marker, so the backend-wide key, which the per-node
// agents ignore, would stay under a marked migration. Start must find it
// and take its marker back (or never write it), refusing and naming it.
func TestStartRacesABackendWideDrain(t *testing.T) {
	srv := testenv.StartConsul(t, testenv.ConsulOptions{})
	w, err := write.NewWriter(srv.Addr(), "hastate/")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	id, err := kvsync.ReadIdentity(ctx, w.Client)
	if err != nil {
		t.Fatal(err)
	}
	replica, err := fleet.NewReplica(ctltest.Replica(t, api.ConsulIdentity{Datacenter: id.Datacenter, Cluster: id.Cluster}, 1<<50, nil,
		func(int) *api.StateView { return ctltest.Fleet() }))
	if err != nil {
		t.Fatal(err)
	}
	var drained write.Plan
	m, started, err := Start(ctx, w, Options{By: "alice", Now: time.Now(), beforeWrite: func() {
		var derr error
		drained, derr = write.Write(ctx, write.Request{Options: write.Options{Command: "drain", Value: "drain", MinReady: 1, KeepOwn: true},
			Selectors: []ctl.Selector{{Backend: "canary_web", Server: "*"}}, Writer: w, Replica: replica})
		if derr != nil || !drained.Written {
			t.Fatalf("the concurrent backend-wide drain: %+v %v", drained, derr)
		}
	}})
	if err == nil || started || !strings.Contains(err.Error(), "canary_web/* = \"drain\"") {
		t.Fatalf("start raced by a backend-wide drain: started %v, %v; want it refused naming canary_web/*", started, err)
	}
	after, err := Read(ctx, w)
	if err != nil {
		t.Fatal(err)
	}
	if after.Marked || m.Marked {
		t.Fatalf("a migration stays marked over a backend-wide drain the per-node agents ignore (unlike keys: %v)", after.Unlike)
	}
	// Once the key is fixed, start marks it.
	if _, err := w.Client.KV().Delete("hastate/state/canary_web/*", nil); err != nil {
		t.Fatal(err)
	}
	if _, started, err := Start(ctx, w, Options{By: "alice", Now: time.Now()}); err != nil || !started {
		t.Fatalf("start once the key is cleared: %v %v", started, err)
	}
}

// Issue 43: start takes back only its own marker, the one at the index its
// CAS wrote. Raced as above by a backend-wide drain, it finds a key the
// per-node agents serve differently; meanwhile another operator (the same
// pipeline user, within the same second) finished the migration and
// started it again: a marker with the very same words, but theirs. Start
// must leave it and say so, not delete it because its content matches.
func TestStartUndoesOnlyItsOwnMarker(t *testing.T) {
	srv := testenv.StartConsul(t, testenv.ConsulOptions{})
	w, err := write.NewWriter(srv.Addr(), "hastate/")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	now := time.Now()
	o := Options{By: "ci", Reason: "gstg rollout", Now: now}
	o.beforeWrite = func() {
		if _, err := w.Client.KV().Put(&consulapi.KVPair{Key: "hastate/state/canary_web/*", Value: []byte("drain")}, nil); err != nil {
			t.Fatal(err)
		}
	}
	var theirs uint64
	o.afterWrite = func() {
		// Someone else's finish, then start, with the same words.
		if _, err := w.Client.KV().Delete("hastate/"+state.MigrationKey, nil); err != nil {
			t.Fatal(err)
		}
		p := &consulapi.KVPair{Key: "hastate/" + state.MigrationKey, Value: []byte(state.MarshalMigration(state.Migration{Started: now, By: "ci", Reason: "gstg rollout"}))}
		if _, err := w.Client.KV().Put(p, nil); err != nil {
			t.Fatal(err)
		}
		got, _, err := w.Client.KV().Get(p.Key, nil)
		if err != nil || got == nil {
			t.Fatalf("their marker: %v %v", got, err)
		}
		theirs = got.ModifyIndex
	}
	_, started, err := Start(ctx, w, o)
	if err == nil || started || !strings.Contains(err.Error(), "changed meanwhile by someone else and is left as it is") {
		t.Fatalf("start raced by a drain and by another start: started %v, %v; want it refused, leaving the other marker", started, err)
	}
	got, _, err := w.Client.KV().Get("hastate/"+state.MigrationKey, nil)
	if err != nil || got == nil || got.ModifyIndex != theirs {
		t.Fatalf("the other operator's marker (index %d) after start's undo: %+v %v; start deleted a marker it did not write", theirs, got, err)
	}
}
