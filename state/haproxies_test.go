package state

import (
	"fmt"
	"reflect"
	"testing"
	"time"
)

func TestPlanHAProxies(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	rec := HAProxies{
		"10.0.0.1": {First: t0, Last: t0},
		"10.0.0.2": {First: t0, Last: t0},
		"10.0.0.3": {First: t0, Last: t0.Add(-HAProxyForget)},
	}
	cases := []struct {
		name   string
		seen   map[string]time.Time
		now    time.Time
		want   HAProxyChange
		reason string
	}{
		{"steady within coarse: nothing", map[string]time.Time{"10.0.0.1": t0.Add(HAProxyCoarse - time.Second), "10.0.0.2": t0.Add(time.Second), "10.0.0.3": t0},
			t0.Add(HAProxyCoarse), HAProxyChange{Seen: map[string]time.Time{"10.0.0.3": t0}}, "only the old record moves"},
		{"coarse passed: bumped", map[string]time.Time{"10.0.0.1": t0.Add(HAProxyCoarse), "10.0.0.2": t0.Add(time.Second)},
			t0.Add(HAProxyCoarse), HAProxyChange{Seen: map[string]time.Time{"10.0.0.1": t0.Add(HAProxyCoarse)}, Forget: []string{"10.0.0.3"}}, "3 is neither seen nor recorded within the forget window"},
		{"new source recorded", map[string]time.Time{"10.0.0.9": t0},
			t0, HAProxyChange{Seen: map[string]time.Time{"10.0.0.9": t0}}, "3 is not forgotten: its forget time is now"},
		{"not seen, not forgotten yet", nil, t0.Add(HAProxyForget - time.Second), HAProxyChange{Forget: []string{"10.0.0.3"}}, ""},
		{"not seen past forget", nil, t0.Add(HAProxyForget), HAProxyChange{Forget: []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"}}, ""},
		{"seen by a replica but long ago", map[string]time.Time{"10.0.0.1": t0}, t0.Add(HAProxyForget), HAProxyChange{Forget: []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"}}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := PlanHAProxies(rec, c.seen, c.now)
			if c.name == "new source recorded" {
				c.want.Forget = []string{"10.0.0.3"}
			}
			if !reflect.DeepEqual(got.Change, c.want) {
				t.Fatalf("plan = %+v, want %+v %s", got.Change, c.want, c.reason)
			}
		})
	}
}

func TestHAProxiesApplyMovesForwardOnly(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	h := HAProxies{}
	h.Apply(HAProxyChange{Seen: map[string]time.Time{"a": t0}})
	h.Apply(HAProxyChange{Seen: map[string]time.Time{"a": t0.Add(-time.Minute)}})
	if got := h["a"]; !got.First.Equal(t0) || !got.Last.Equal(t0) {
		t.Fatalf("a = %+v: an older sighting moved Last back", got)
	}
	h.Apply(HAProxyChange{Seen: map[string]time.Time{"a": t0.Add(time.Minute)}})
	if got := h["a"]; !got.First.Equal(t0) || !got.Last.Equal(t0.Add(time.Minute)) {
		t.Fatalf("a = %+v, want First %v Last %v", got, t0, t0.Add(time.Minute))
	}
	h.Apply(HAProxyChange{Forget: []string{"a"}})
	if len(h) != 0 {
		t.Fatalf("after forget: %v", h)
	}
}

func TestPlanHAProxiesBounded(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	rec := HAProxies{}
	for i := range MaxHAProxies - 1 {
		rec[fmt.Sprintf("r%d", i)] = HAProxySeen{First: t0, Last: t0}
	}
	seen := map[string]time.Time{}
	for i := range 5 {
		seen[fmt.Sprintf("n%d", i)] = t0
	}
	p := PlanHAProxies(rec, seen, t0)
	if len(p.Change.Seen) != 1 || p.Over != 4 {
		t.Fatalf("room for 1 new source: seen %d, over %d; want 1, 4", len(p.Change.Seen), p.Over)
	}
	// A batch carries at most MaxHAProxyBatch sources, oldest records first.
	rec = HAProxies{}
	seen = map[string]time.Time{}
	for i := range MaxHAProxyBatch + 10 {
		src := fmt.Sprintf("s%05d", i)
		rec[src] = HAProxySeen{First: t0, Last: t0.Add(time.Duration(i) * time.Millisecond)}
		seen[src] = t0.Add(time.Hour)
	}
	p = PlanHAProxies(rec, seen, t0.Add(time.Hour))
	if len(p.Change.Seen) != MaxHAProxyBatch {
		t.Fatalf("batch = %d, want %d", len(p.Change.Seen), MaxHAProxyBatch)
	}
	if _, ok := p.Change.Seen["s00000"]; !ok {
		t.Fatal("the oldest record is not in the first batch")
	}
	if _, ok := p.Change.Seen[fmt.Sprintf("s%05d", MaxHAProxyBatch+9)]; ok {
		t.Fatal("the newest record is in the first batch")
	}
}
