package kvsync

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/hastate/hastate/internal/testenv"
	"github.com/hastate/hastate/state"
)

// BenchmarkConsistentRead measures what Consul's consistent mode costs per
// read of the prefix, against a real Consul on loopback, at 1,000 and
// 50,000 keys: a full read (nothing held, as a new leader's first read) and
// a read equal to the held one (the common wake-up), each in Consul's
// default mode and in consistent mode (the watch's), on one Consul server
// and on a three-server cluster read through a follower:
//
//	go test -run '^$' -bench ConsistentRead -benchtime 20x ./kvsync
func BenchmarkConsistentRead(b *testing.B) {
	for _, servers := range []int{1, 3} {
		b.Run(fmt.Sprintf("servers=%d", servers), func(b *testing.B) {
			// One server: -dev's in-memory Consul; three: a cluster on
			// loopback, read through a follower, as a client agent would.
			addr := ""
			if servers == 1 {
				addr = testenv.StartConsul(b, testenv.ConsulOptions{}).Addr()
			} else {
				cc := testenv.StartConsulCluster(b, servers)
				addr = cc.Servers[(cc.Leader(b, 30*time.Second)+1)%servers].Addr()
			}
			benchmarkReadModes(b, addr)
		})
	}
}

func benchmarkReadModes(b *testing.B, addr string) {
	cl, err := NewClient("http://" + addr)
	if err != nil {
		b.Fatal(err)
	}
	loaded := 0
	for _, keys := range []int{1000, 50000} {
		loadKeys(b, cl.KV(), loaded, keys)
		loaded = keys
		for _, held := range []bool{false, true} {
			for _, mode := range []string{"default", "consistent"} {
				b.Run(fmt.Sprintf("keys=%d/held=%v/mode=%s", keys, held, mode), func(b *testing.B) {
					w, err := New(Options{Client: cl, Prefix: "hastate/", Sink: nopSink{}})
					if err != nil {
						b.Fatal(err)
					}
					w.defaultMode = mode == "default"
					ctx := context.Background()
					_, first, err := w.read(ctx, 0, heldNone)
					if err != nil {
						b.Fatal(err)
					}
					if first.count != keys {
						b.Fatalf("read %d keys, want %d", first.count, keys)
					}
					last := heldNone
					if held {
						last = first.full
					}
					for b.Loop() {
						if _, l, err := w.read(ctx, 0, last); err != nil || l.count != keys {
							b.Fatalf("read: %d keys, %v", l.count, err)
						}
					}
				})
			}
		}
	}
}

var heldNone held

type nopSink struct{}

func (nopSink) ApplyRead(context.Context, state.KVRead) error { return nil }

// loadKeys writes keys from..to-1 under hastate/state/ in transactions of
// Consul's limit of 64 operations.
func loadKeys(b testing.TB, kv *api.KV, from, to int) {
	b.Helper()
	start := time.Now()
	for i := from; i < to; i += 64 {
		var ops api.KVTxnOps
		for j := i; j < min(i+64, to); j++ {
			ops = append(ops, &api.KVTxnOp{Verb: api.KVSet, Key: fmt.Sprintf("hastate/state/be%03d/srv%05d", j%500, j), Value: []byte("drain")})
		}
		if ok, resp, _, err := kv.Txn(ops, nil); err != nil || !ok {
			b.Fatalf("load keys %d..: %v %+v", i, err, resp)
		}
	}
	b.Logf("loaded %d keys in %s", to-from, time.Since(start).Round(time.Millisecond))
}

// TestConsulRestartConsistentReadsAreNeverStale kills and restarts a
// one-server Consul with data on disk while two readers list the prefix
// every few milliseconds, one in Consul's default mode and one in
// consistent mode (the watch's). A read is stale when it holds fewer keys
// than were written before the kill. The consistent reader must never see
// one; how many the default reader saw is logged (it depends on timing:
// the window is between the restarted server's election and its applying
// the log).
func TestConsulRestartConsistentReadsAreNeverStale(t *testing.T) {
	const (
		keys     = 200
		restarts = 4
	)
	c := testenv.StartConsul(t, testenv.ConsulOptions{Persistent: true})
	cl, err := NewClient("http://" + c.Addr())
	if err != nil {
		t.Fatal(err)
	}
	loadKeys(t, cl.KV(), 0, keys)
	type counts struct{ reads, stale, failed int }
	var res [2]counts // default, consistent
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i, mode := range []string{"default", "consistent"} {
		w, err := New(Options{Client: cl, Prefix: "hastate/", Sink: nopSink{}, WaitTime: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		w.defaultMode = mode == "default"
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				_, l, err := w.read(ctx, 0, heldNone)
				switch {
				case err != nil:
					res[i].failed++
				case l.count < keys:
					res[i].stale++
				default:
					res[i].reads++
				}
				time.Sleep(2 * time.Millisecond)
			}
		}()
	}
	for range restarts {
		c.Kill()
		time.Sleep(200 * time.Millisecond) // readers fail meanwhile: a real outage
		c.Restart(t)
		time.Sleep(500 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	t.Logf("over %d SIGKILL+restarts of a one-server Consul holding %d keys: default mode %d full reads, %d stale (fewer keys), %d failed; consistent mode %d full reads, %d stale, %d failed",
		restarts, keys, res[0].reads, res[0].stale, res[0].failed, res[1].reads, res[1].stale, res[1].failed)
	if res[1].stale != 0 {
		t.Errorf("consistent mode read %d stale listings", res[1].stale)
	}
	if res[1].reads == 0 {
		t.Error("the consistent reader never read the listing")
	}
}
