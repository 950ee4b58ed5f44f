package write

import (
	"context"
	"fmt"
	"testing"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/fleet"
	"github.com/hastate/hastate/internal/testenv"
)

// fillConsul writes n state keys under hastate/, in backends of 50
// servers (be0/s0 ...), every tenth drained, the others at 50%, and a
// drain of backend be3.
func fillConsul(b *testing.B, kv *consulapi.KV, n int) {
	b.Helper()
	var ops consulapi.KVTxnOps
	flush := func() {
		if len(ops) == 0 {
			return
		}
		if ok, resp, _, err := kv.Txn(ops, nil); err != nil || !ok {
			b.Fatalf("fill: %v %v", err, resp)
		}
		ops = ops[:0]
	}
	for i := range n {
		v := "50%"
		if i%10 == 0 {
			v = "drain"
		}
		ops = append(ops, &consulapi.KVTxnOp{Verb: consulapi.KVSet, Key: ctl.Key("hastate/", fmt.Sprintf("be%d", i/50), fmt.Sprintf("s%d", i)), Value: []byte(v)})
		if len(ops) == MaxTxnKeys {
			flush()
		}
	}
	// be3/* covers be3's servers: ready writes ready there, not a delete.
	ops = append(ops, &consulapi.KVTxnOp{Verb: consulapi.KVSet, Key: ctl.Key("hastate/", "be3", "*"), Value: []byte("drain")})
	flush()
}

// BenchmarkWriteDecision is the Consul side of one write, at 1k and 50k
// keys: "unconditional" is the path before issue 22 (the prefix index read
// in Consul's default mode, then an unconditional transaction); "consistent"
// is today's (the keys the plan depends on read with ?consistent, the
// prefix index read with ?consistent after them, the plan, a transaction
// conditional on every key read). The replica's part (wait, fleet) is the
// same in both and left out. The difference is the extra latency.
func BenchmarkWriteDecision(b *testing.B) {
	consul := testenv.StartConsul(b, testenv.ConsulOptions{})
	kv := consul.Client(b).KV()
	wr, err := NewWriter(consul.Addr(), "hastate/")
	if err != nil {
		b.Fatal(err)
	}
	g := fleet.GateOptions{Consul: wr.Client, ConsulAddr: wr.Addr, Prefix: "hastate/"}
	ctx := context.Background()
	filled := 0
	for _, n := range []int{1000, 50_000} {
		fillConsul(b, kv, n) // a superset of the smaller fill
		filled = n
		for _, c := range []struct {
			name string
			cmd  string
			sel  ctl.Selector
			o    Options
		}{
			{"drain one server", "drain", ctl.Selector{Backend: "be3", Server: "s151"}, Options{}},
			{"ready one server", "ready", ctl.Selector{Backend: "be3", Server: "s152"}, Options{}},
			{"backend-wide drain", "drain", ctl.Selector{Backend: "be4", Server: "*"}, Options{KeepOwn: true}},
		} {
			o := c.o
			o.Command, o.Value, o.Prefix, o.MinReady, o.Allow = c.cmd, c.cmd, "hastate/", 1, Allow{NoReplica: true}
			plan := func() Plan {
				r := NewKVRead("hastate/")
				_, needs, _ := PlanWrite(nil, r, []ctl.Selector{c.sel}, o) // as Write does for literal selectors
				for range maxRounds {
					if err := wr.Read(ctx, r, needs); err != nil {
						b.Fatal(err)
					}
					if _, err := g.ConsulIndex(ctx); err != nil {
						b.Fatal(err)
					}
					p, more, err := PlanWrite(nil, r, []ctl.Selector{c.sel}, o)
					if err != nil {
						b.Fatal(err)
					}
					if !more.any() {
						return p
					}
					needs = more
				}
				b.Fatal("the plan kept needing reads")
				return Plan{}
			}
			b.Run(fmt.Sprintf("keys=%d/%s/unconditional", filled, c.name), func(b *testing.B) {
				p := plan()
				p.Deps = nil
				for b.Loop() {
					if _, _, err := kv.Keys("hastate/", "/", (&consulapi.QueryOptions{}).WithContext(ctx)); err != nil {
						b.Fatal(err)
					}
					if err := wr.Apply(ctx, p); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run(fmt.Sprintf("keys=%d/%s/consistent", filled, c.name), func(b *testing.B) {
				for b.Loop() {
					p := plan()
					if err := wr.Apply(ctx, p); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
