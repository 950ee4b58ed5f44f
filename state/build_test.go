package state

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

// rebuilt returns a snapshot of m built from scratch, leaving m's
// incremental state (its last snapshot and dirty shards) as it was.
func rebuilt(m *Mirror) *Snapshot {
	last, dirty := m.last, maps.Clone(m.dirty)
	s := m.RebuildSnapshot()
	m.last, m.dirty = last, dirty
	return s
}

// sameSnapshot fails unless got and want answer alike: the same Lookup line
// and Resolve for every request in reqs, the same Entries, Targets, Ramps,
// Len and Invalid.
func sameSnapshot(t *testing.T, step string, got, want *Snapshot, reqs []string) {
	t.Helper()
	for _, req := range reqs {
		i := strings.IndexByte(req, '/')
		g, w := got.Lookup([]byte(req), i), want.Lookup([]byte(req), i)
		if (g == nil) != (w == nil) || string(g) != string(w) {
			t.Fatalf("%s: Lookup(%q) = %q, full rebuild %q", step, req, g, w)
		}
		gr, wr := got.Resolve(req[:i], req[i+1:]), want.Resolve(req[:i], req[i+1:])
		if a, b := resolutionString(gr), resolutionString(wr); a != b {
			t.Fatalf("%s: Resolve(%q) = %s, full rebuild %s", step, req, a, b)
		}
	}
	if g, w := got.Entries(), want.Entries(); !slices.Equal(g, w) {
		t.Fatalf("%s: Entries() =\n%+v\nfull rebuild\n%+v", step, g, w)
	}
	if g, w := got.Targets(), want.Targets(); !slices.Equal(g, w) {
		t.Fatalf("%s: Targets() = %v, full rebuild %v", step, g, w)
	}
	if g, w := got.Ramps(), want.Ramps(); !slices.Equal(g, w) {
		t.Fatalf("%s: Ramps() = %+v, full rebuild %+v", step, g, w)
	}
	if got.Len() != want.Len() || got.Invalid() != want.Invalid() {
		t.Fatalf("%s: Len, Invalid = %d, %d; full rebuild %d, %d", step, got.Len(), got.Invalid(), want.Len(), want.Invalid())
	}
}

// resolutionString renders a Resolution with its pointers followed.
func resolutionString(r Resolution) string {
	s := fmt.Sprintf("%s/%s %q %s", r.Backend, r.Server, r.Answer.String()+"|"+fmt.Sprint(r.Answer.Withheld), r.Source)
	if r.Entry != nil {
		s += fmt.Sprintf(" entry=%+v", *r.Entry)
	}
	if r.Ramp != nil {
		s += fmt.Sprintf(" ramp=%+v", *r.Ramp)
	}
	if r.Expired != nil {
		s += fmt.Sprintf(" expired=%+v", *r.Expired)
	}
	return s
}

// TestIncrementalSnapshotMatchesRebuild applies random KV changes, ramp
// steps and expiries, and after each one checks that the incremental
// snapshot answers exactly as one rebuilt from scratch, that it shares the
// shards of backends the step did not touch, and that the previous
// snapshot did not change.
func TestIncrementalSnapshotMatchesRebuild(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	backends := []string{"web", "web-2", "api", "db", "a"}
	servers := []string{"a", "b", "c", Wildcard}
	var keys []string
	for _, b := range backends {
		for _, s := range servers {
			keys = append(keys, StatePrefix+b+"/"+s)
		}
	}
	// Misshapen keys, and one that is not a state key at all.
	keys = append(keys, "state/web", "state/a/b/c", "state//x", "state/", "config/ramp")
	var reqs []string
	for _, b := range append(backends, "zzz") {
		for _, s := range append(servers, "new") {
			reqs = append(reqs, b+"/"+s)
		}
	}
	reqs = append(reqs, "a/b/c", "/x", "web/")
	at := t0
	values := func() string {
		switch rng.IntN(10) {
		case 0:
			return "junk"
		case 1:
			return fmt.Sprintf("%d%%", rng.IntN(300))
		case 2:
			return `{"state":"drain","until":"` + at.Add(time.Duration(rng.IntN(5))*time.Second).Format(time.RFC3339) + `"}`
		case 3:
			return `{"state":"ready","ramp":"` + []string{"0", "3s", "20s"}[rng.IntN(3)] + `"}`
		case 4, 5:
			return "ready"
		case 6:
			return "maint"
		default:
			return "drain"
		}
	}
	policy := RampPolicy{Start: 10, Duration: 10 * time.Second, Interval: time.Second, Aggression: 1, FromMaint: true}

	m := NewMirror()
	m.Apply(Change{}) // synced, empty
	prev := m.Snapshot()
	for step := range 3000 {
		prevEntries, prevLines := prev.Entries(), map[string]string{}
		for _, req := range reqs {
			prevLines[req] = string(prev.Lookup([]byte(req), strings.IndexByte(req, '/')))
		}
		at = at.Add(time.Duration(rng.IntN(1500)) * time.Millisecond)
		var touched []string // shards this step may change
		var what string
		switch rng.IntN(6) {
		case 0, 1, 2:
			c := Change{Set: map[string]string{}}
			for range 1 + rng.IntN(3) {
				k := keys[rng.IntN(len(keys))]
				if rng.IntN(4) == 0 {
					c.Delete = append(c.Delete, k)
					delete(c.Set, k)
				} else if !slices.Contains(c.Delete, k) {
					c.Set[k] = values()
				}
				touched = append(touched, entryShard(k))
			}
			m.ApplyAt(c, at, policy)
			what = fmt.Sprintf("change %+v", c)
		case 3, 4:
			s := NextSteps(m.Ramps(), at)
			m.ApplySteps(s)
			for t := range s.Weights {
				touched = append(touched, shardName(t))
			}
			for _, t := range s.Done {
				touched = append(touched, shardName(t))
			}
			what = fmt.Sprintf("steps %+v", s)
		default:
			due := m.Due(at)
			m.Expire(due, at, policy)
			for _, k := range due {
				touched = append(touched, entryShard(k))
			}
			what = fmt.Sprintf("expire %v", due)
		}
		name := fmt.Sprintf("step %d (%s)", step, what)
		got := m.Snapshot()
		sameSnapshot(t, name, got, rebuilt(m), reqs)

		for g := range got.groups {
			for n, sh := range got.groups[g] {
				if !slices.Contains(touched, n) && prev.shard(n) != sh {
					t.Fatalf("%s: shard %q was rebuilt, but the step does not touch it", name, n)
				}
			}
		}
		if !slices.Equal(prev.Entries(), prevEntries) {
			t.Fatalf("%s: the previous snapshot's entries changed", name)
		}
		for _, req := range reqs {
			if line := string(prev.Lookup([]byte(req), strings.IndexByte(req, '/'))); line != prevLines[req] {
				t.Fatalf("%s: the previous snapshot's answer to %q changed from %q to %q", name, req, prevLines[req], line)
			}
		}
		prev = got
	}
	if len(m.Ramps()) == 0 && prev.Len() == 0 {
		t.Fatal("the random walk ended empty: it exercises too little")
	}
}

// TestSnapshotSharesUntouchedShards: a change to one backend rebuilds that
// backend's shard only; nothing changed, nothing is rebuilt.
func TestSnapshotSharesUntouchedShards(t *testing.T) {
	m := NewMirror()
	m.Apply(set("state/web/a", "drain", "state/api/x", "maint", "state/db/*", "25%"))
	s1 := m.Snapshot()
	if s2 := m.Snapshot(); s2 != s1 {
		t.Error("Snapshot without a change built a new snapshot")
	}
	m.Apply(set("state/web/b", "maint", "config/ramp", "{}"))
	s2 := m.Snapshot()
	if s2.shard("web") == s1.shard("web") {
		t.Error("the changed backend's shard is shared with the old snapshot")
	}
	for _, b := range []string{"api", "db"} {
		if s2.shard(b) != s1.shard(b) {
			t.Errorf("shard %q rebuilt by a change to web", b)
		}
	}
	m.Apply(del("state/api/x"))
	s3 := m.Snapshot()
	if s3.shard("api") != emptyShard || len(m.parts) != 2 {
		t.Errorf("deleting a backend's last key leaves its shard: %v, parts %v", s3.shard("api"), slices.Sorted(maps.Keys(m.parts)))
	}
	if got := string(s3.Lookup([]byte("api/x"), 3)); got != "ready 100%\n" {
		t.Errorf("api/x after delete: %q", got)
	}
	if got := string(s1.Lookup([]byte("api/x"), 3)); got != "maint\n" {
		t.Errorf("old snapshot's api/x: %q", got)
	}
}

// BenchmarkApplyEntry measures what one raft entry costs a replica: apply
// a one-key change to a mirror of n state keys (10 servers a backend, one
// backend wildcard in ten) and build the serving snapshot, before (a full
// rebuild, as every entry did until the snapshot was sharded) and after
// (Snapshot: the touched backend only). It reports both per entry and
// their ratio, so one run shows the curve:
//
//	go test -run '^$' -bench ApplyEntry -benchtime 100x ./state
func BenchmarkApplyEntry(b *testing.B) {
	for _, n := range []int{1_000, 10_000, 50_000} {
		b.Run(fmt.Sprintf("keys=%d", n), func(b *testing.B) {
			kv := make(map[string]string, n)
			for i := range n {
				kv[fmt.Sprintf("state/be%04d/srv%02d", i/10, i%10)] = "ready"
				if i%100 == 0 {
					kv[fmt.Sprintf("state/be%04d/*", i/10)] = "drain"
				}
			}
			policy := RampPolicy{Start: 10, Duration: 5 * time.Minute, Interval: 10 * time.Second, Aggression: 1}
			m := NewMirror()
			m.ApplyAt(m.Diff(kv), t0, policy)
			m.RebuildSnapshot()
			backends := n / 10
			change := func(i int) {
				k := fmt.Sprintf("state/be%04d/srv%02d", (i*7919)%backends, i%10)
				v := "drain"
				if i%2 == 1 {
					v = "ready" // starts a ramp
				}
				m.ApplyAt(Change{Set: map[string]string{k: v}}, t0.Add(time.Duration(i)*time.Second), policy)
			}
			var full, incr time.Duration
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				start := time.Now()
				change(2 * i)
				m.RebuildSnapshot()
				full += time.Since(start)

				start = time.Now()
				change(2*i + 1)
				m.Snapshot()
				incr += time.Since(start)
			}
			b.ReportMetric(float64(full.Nanoseconds())/float64(b.N), "full-ns/entry")
			b.ReportMetric(float64(incr.Nanoseconds())/float64(b.N), "incr-ns/entry")
			b.ReportMetric(float64(full)/float64(incr), "full/incr")
		})
	}
}

// snapshotText renders everything a snapshot answers for reqs, with every
// pointer followed: two calls return the same text unless what the
// snapshot holds changed.
func snapshotText(s *Snapshot, reqs []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "len %d invalid %d\nentries %+v\nramps %+v\ntargets %v\n", s.Len(), s.Invalid(), s.Entries(), s.Ramps(), s.Targets())
	for _, req := range reqs {
		i := strings.IndexByte(req, '/')
		fmt.Fprintf(&b, "%s: %q %s\n", req, s.Lookup([]byte(req), i), resolutionString(s.Resolve(req[:i], req[i+1:])))
	}
	return b.String()
}

// TestOldSnapshotsSurviveMirrorChanges: snapshots share entries with the
// mirror, so the mirror must never change an entry in place. Every kind of
// change (a new state, a new reason, an invalid value, a delete, an
// expiry, ramp starts, steps and ends) leaves every earlier snapshot as it
// was, and a change shares the entries it does not touch, even within
// the shard it rebuilds.
func TestOldSnapshotsSurviveMirrorChanges(t *testing.T) {
	until := `{"state":"drain","reason":"r","until":"` + t0.Add(10*time.Second).Format(time.RFC3339) + `"}`
	reqs := []string{"web/a", "web/b", "web/c", "web/*", "web/new", "api/x", "api/y", "api/*", "api/new", "bad/x"}
	p := rampPolicy() // 10% to 100% over 10s
	// want fails the test unless n events (or keys) came out of a step: the
	// walk must reach the changes it names.
	want := func(t *testing.T, step string, got, n int) {
		t.Helper()
		if got != n {
			t.Fatalf("%s: %d events, want %d", step, got, n)
		}
	}
	steps := []struct {
		name  string
		apply func(t *testing.T, m *Mirror, at time.Time)
	}{
		{"set", func(t *testing.T, m *Mirror, at time.Time) {
			m.ApplyAt(set("state/web/a", "drain", "state/web/b", until, "state/web/c", "maint", "state/web/*", "25%",
				"state/api/x", "drain", "state/api/y", "50%", "state/api/*", "drain", "state/bad", "drain"), at, p)
		}},
		{"a new reason", func(t *testing.T, m *Mirror, at time.Time) {
			m.ApplyAt(set("state/web/a", `{"state":"drain","reason":"disk"}`), at, p)
		}},
		{"an invalid value", func(t *testing.T, m *Mirror, at time.Time) { m.ApplyAt(set("state/web/c", "maimt"), at, p) }},
		{"undrain: ramps start", func(t *testing.T, m *Mirror, at time.Time) {
			want(t, "undrain", len(m.ApplyAt(Change{Set: map[string]string{"state/api/x": "ready"}, Delete: []string{"state/api/*"}}, at, p)), 2)
		}},
		{"a ramp step", func(t *testing.T, m *Mirror, at time.Time) {
			s := NextSteps(m.Ramps(), at)
			want(t, "a ramp step", len(s.Weights), 2)
			m.ApplySteps(s)
		}},
		{"expire", func(t *testing.T, m *Mirror, at time.Time) {
			due := m.Due(at)
			want(t, "expire", len(due), 1)
			m.Expire(due, at, p)
		}},
		{"delete and set in one change", func(t *testing.T, m *Mirror, at time.Time) {
			m.ApplyAt(Change{Set: map[string]string{"state/web/c": "drain"}, Delete: []string{"state/web/c", "state/api/y"}}, at, p)
		}},
		{"a wildcard ends its ramp", func(t *testing.T, m *Mirror, at time.Time) {
			want(t, "a wildcard", len(m.ApplyAt(set("state/api/*", "maint"), at, p)), 1)
		}},
		{"a value without a time", func(t *testing.T, m *Mirror, at time.Time) {
			m.Apply(set("state/web/b", "ready", "state/web/a", "maint"))
		}},
		{"ramps done", func(t *testing.T, m *Mirror, at time.Time) {
			want(t, "ramps done", len(m.ApplySteps(NextSteps(m.Ramps(), at.Add(time.Hour)))), 1)
		}},
	}
	m := NewMirror()
	type frozen struct {
		step string
		snap *Snapshot
		text string
	}
	var old []frozen
	at := t0
	for _, st := range steps {
		prev := m.Snapshot()
		old = append(old, frozen{st.name, prev, snapshotText(prev, reqs)})
		at = at.Add(3 * time.Second)
		st.apply(t, m, at)
		cur := m.Snapshot()
		for _, f := range old {
			if got := snapshotText(f.snap, reqs); got != f.text {
				t.Fatalf("after %q, the snapshot taken before %q changed:\n%s\nwant\n%s", st.name, f.step, got, f.text)
			}
		}
		// Entries the step did not replace are shared, not copied.
		for _, e := range prev.shard("web").entries {
			if n := cur.shard("web").entry(e.Key); n != nil && *n == *e && n != e {
				t.Fatalf("after %q: the unchanged entry %s was copied, not shared", st.name, e.Key)
			}
		}
	}
	if len(m.Ramps()) != 0 || m.Snapshot().Len() != 7 {
		t.Fatalf("the walk ended with ramps %+v and %d keys: it did not go where the test means", m.Ramps(), m.Snapshot().Len())
	}
}
