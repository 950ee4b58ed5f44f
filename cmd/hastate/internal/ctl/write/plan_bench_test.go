package write

import (
	"fmt"
	"testing"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl"
)

// bigFleet is n servers in n/50 backends, every tenth with a key of its
// own, every backend with a drained backend-wide key.
func bigFleet(n int) *api.StateView {
	v := &api.StateView{HoldsState: true, Replicas: []api.ReplicaAnswer{{ID: "n1", Answered: true}}}
	for i := range n {
		b := fmt.Sprintf("be%d", i/50)
		if i%50 == 0 {
			v.Servers = append(v.Servers, api.ServerState{Backend: b, Server: "*", Key: "hastate/state/" + b + "/*", Kind: api.KindDrain, Answer: "drain", Desired: "drain"})
		}
		r := api.ServerState{Backend: b, Server: fmt.Sprintf("s%d", i), Polled: 2, Told: 2, Kind: api.KindDrain, Answer: "drain"}
		if i%10 == 0 {
			r.Key, r.Kind, r.Weight, r.Answer, r.Desired = "hastate/state/"+b+"/"+r.Server, api.KindReady, 100, "ready 100%", "ready"
		}
		v.Servers = append(v.Servers, r)
	}
	return v
}

// Planning costs what the fleet holds once, not once per matched server:
// a glob over 50,000 servers is refused (past one transaction) quickly.
func BenchmarkPlanWriteGlob50k(b *testing.B) {
	f := bigFleet(50_000)
	kv := kvOf(f, nil)
	for _, cmd := range []string{"ready", "clear", "drain"} {
		b.Run(cmd, func(b *testing.B) {
			sels := []ctl.Selector{{Backend: "*", Server: "s1*"}}
			for b.Loop() {
				_, _ = planAll(b, f, kv, sels, Options{Command: cmd, Value: cmd, Prefix: "hastate/", MinReady: 1, KeepOwn: true})
			}
		})
	}
	b.Run("drain backends", func(b *testing.B) {
		sels := []ctl.Selector{{Backend: "be1*", Server: "*"}}
		for b.Loop() {
			_, _ = planAll(b, f, kv, sels, Options{Command: "drain", Value: "drain", Prefix: "hastate/", MinReady: 1, KeepOwn: true})
		}
	})
}
