package state

import (
	"encoding/json"
	"fmt"
	"runtime"
	"testing"
	"time"
)

// fleetValue is the value of the i-th state key of a fleet as operators
// hold it: 40% drain, 10% maint, 25% weights, 10% drains with a reason,
// 5% maints with their own ramp, the rest ready.
func fleetValue(i int) string {
	switch i % 20 {
	case 0, 1, 2, 3, 4, 5, 6, 7:
		return "drain"
	case 8, 9:
		return "maint"
	case 10, 11, 12, 13, 14:
		return fmt.Sprintf("%d%%", (i*7)%101)
	case 15, 16:
		return `{"state":"drain","reason":"zonal maintenance us-east1-b","by":"alice","at":"2025-03-01T10:00:00Z"}`
	case 17:
		return `{"state":"maint","reason":"zonal maintenance us-east1-b","by":"alice","ramp":"10m","at":"2025-03-01T10:00:00Z"}`
	default:
		return "ready"
	}
}

// fleetMirror returns a mirror of backends × servers state keys and its
// snapshot, brought there as a replica's FSM does it: the leader's Diff
// of a full read goes through JSON (so the mirror owns strings decoded
// from the raft entry, not the test's), then ApplyAt and Snapshot.
func fleetMirror(tb testing.TB, backends, servers int) (*Mirror, *Snapshot) {
	tb.Helper()
	kv := make(map[string]string, backends*servers+1)
	for i := range backends * servers {
		kv[fmt.Sprintf("state/be%04d/srv%02d", i/servers, i%servers)] = fleetValue(i)
	}
	kv["config/ramp"] = `{"duration":"5m"}`
	m := NewMirror()
	data, err := json.Marshal(m.Diff(kv))
	if err != nil {
		tb.Fatal(err)
	}
	var c Change
	if err := json.Unmarshal(data, &c); err != nil {
		tb.Fatal(err)
	}
	m.ApplyAt(c, t0, DefaultRampPolicy())
	return m, m.Snapshot()
}

// heapInUse returns the bytes of live heap after a full collection.
func heapInUse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// BenchmarkMirror50k measures a replica holding 50,000 state keys (1,000
// backends of 50 servers): the heap that the mirror and its serving
// snapshot keep alive (retained), what one single-key raft entry costs
// (change: ApplyAt and Snapshot), and the leader's per-tick reads (due:
// Due; ramps: Ramps), with no key due and no ramp in progress, as in a
// quiet fleet, then Due again with 1,000 keys that have an until.
//
//	go test -run '^$' -bench Mirror50k -benchtime 5x ./state   (retained)
//	go test -run '^$' -bench Mirror50k ./state
func BenchmarkMirror50k(b *testing.B) {
	const backends, servers = 1000, 50
	b.Run("retained", func(b *testing.B) {
		var total float64
		for b.Loop() {
			before := heapInUse()
			m, s := fleetMirror(b, backends, servers)
			after := heapInUse()
			runtime.KeepAlive(m)
			runtime.KeepAlive(s)
			total += float64(after-before) / (1 << 20)
		}
		b.ReportMetric(total/float64(b.N), "heap-MB")
	})

	m, _ := fleetMirror(b, backends, servers)
	policy := DefaultRampPolicy()
	b.Run("change", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			// Alternate a server between drain and ready: every other
			// entry starts a ramp, as an undrain does.
			k := fmt.Sprintf("state/be%04d/srv%02d", (i/2*7919)%backends, i/2%servers)
			v := "drain"
			if i%2 == 1 {
				v = "ready"
			}
			m.ApplyAt(Change{Set: map[string]string{k: v}}, t0.Add(time.Duration(i)*time.Second), policy)
			m.Snapshot()
		}
	})

	m, _ = fleetMirror(b, backends, servers)
	now := t0.Add(time.Hour)
	b.Run("due", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if len(m.Due(now)) != 0 {
				b.Fatal("a key is due")
			}
		}
	})
	b.Run("ramps", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if len(m.Ramps()) != 0 {
				b.Fatal("a ramp is in progress")
			}
		}
	})

	// One server in fifty drained for a while: Due has 1,000 untils to
	// look at, none of them passed yet.
	c := Change{Set: map[string]string{}}
	until := `{"state":"drain","until":"` + now.Add(time.Hour).Format(time.RFC3339) + `"}`
	for i := range backends {
		c.Set[fmt.Sprintf("state/be%04d/srv%02d", i, i%servers)] = until
	}
	m.ApplyAt(c, t0, policy)
	b.Run("due-1000-untils", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if len(m.Due(now)) != 0 {
				b.Fatal("a key is due")
			}
		}
	})
}
