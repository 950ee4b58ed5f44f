package state_test

import (
	"fmt"
	"testing"

	"github.com/hastate/hastate/state"
)

// BenchmarkLookup is the agent hot path on a snapshot of 50,000 keys
// (10 servers a backend): a server with its own key, one that follows its
// backend's wildcard, one of a backend without keys.
func BenchmarkLookup(b *testing.B) {
	kv := map[string]string{}
	for i := range 50_000 {
		kv[fmt.Sprintf("state/be%04d/srv%02d", i/10, i%10)] = "drain"
		if i%100 == 0 {
			kv[fmt.Sprintf("state/be%04d/*", i/10)] = "maint"
		}
	}
	m := state.NewMirror()
	m.Apply(m.Diff(kv))
	snap := m.Snapshot()
	for _, req := range []string{"be1234/srv05", "be1230/new", "other/srv01"} {
		b.Run(req, func(b *testing.B) {
			r := []byte(req)
			i := len(req) - len("/srv05")
			if req == "be1230/new" {
				i = len("be1230")
			}
			b.ReportAllocs()
			for b.Loop() {
				if snap.Lookup(r, i) == nil {
					b.Fatal("withheld")
				}
			}
		})
	}
}
