package state_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/hastate/hastate/state"
)

// withheld is how these tests write "no answer, close": Lookup returns nil.
const withheld = ""

// mirrorOf returns a synced mirror holding kv, brought there the way the
// leader does it: Apply(Diff(kv)).
func mirrorOf(t *testing.T, kv map[string]string) *state.Mirror {
	t.Helper()
	m := state.NewMirror()
	m.Apply(m.Diff(kv))
	return m
}

func snapshotOf(t *testing.T, kv map[string]string) *state.Snapshot {
	t.Helper()
	return mirrorOf(t, kv).Snapshot()
}

// answer returns what the agent server would write for a raw request, as a
// string ("" when withheld). It checks that every answer is one LF-terminated
// line and that Resolve explains exactly what Lookup serves.
func answer(t *testing.T, snap *state.Snapshot, raw string) string {
	t.Helper()
	b, s, err := state.ParseRequest([]byte(raw))
	if err != nil {
		t.Fatalf("ParseRequest(%q): %v", raw, err)
	}
	req := []byte(raw)[:len(b)+1+len(s)]
	line := snap.Lookup(req, len(b))
	res := snap.Resolve(string(b), string(s))
	if line == nil {
		if !res.Answer.Withheld {
			t.Errorf("request %q: Lookup withholds, Resolve answers %q (source %s)", raw, res.Answer, res.Source)
		}
		return withheld
	}
	if len(line) == 0 || strings.IndexByte(string(line), '\n') != len(line)-1 {
		t.Errorf("request %q: answer %q is not one LF-terminated line", raw, line)
	}
	if got := res.Answer.String() + "\n"; res.Answer.Withheld || got != string(line) {
		t.Errorf("request %q: Lookup answers %q, Resolve %+v (source %s)", raw, line, res.Answer, res.Source)
	}
	return string(line)
}

// expectAnswers checks a set of request → wire line pairs.
func expectAnswers(t *testing.T, snap *state.Snapshot, want map[string]string) {
	t.Helper()
	for _, req := range slices.Sorted(maps.Keys(want)) {
		if got := answer(t, snap, req); got != want[req] {
			t.Errorf("request %q: answer %q, want %q", req, got, want[req])
		}
	}
}

func TestAnswerLines(t *testing.T) {
	tests := []struct {
		value, line string
	}{
		{"ready", "ready 100%\n"},
		{"READY", "ready 100%\n"},
		{"25%", "ready 25%\n"},
		{"0%", "ready 0%\n"},
		{"100%", "ready 100%\n"},
		{"256%", "ready 256%\n"},
		{"drain", "drain\n"},
		{"maint", "maint\n"},
		{" Drain\n", "drain\n"},
		{`{"state":"drain","reason":"zonal maintenance","by":"alice"}`, "drain\n"},
		{`{"state":"maint"}`, "maint\n"},
		{`{"state":"ready","ramp":"10m"}`, "ready 100%\n"},
		{`{"state":"40%"}`, "ready 40%\n"},
	}
	for _, tt := range tests {
		t.Run(tt.value, func(t *testing.T) {
			snap := snapshotOf(t, map[string]string{"state/web/a": tt.value})
			if got := answer(t, snap, "web/a\n"); got != tt.line {
				t.Errorf("value %q: answer %q, want %q", tt.value, got, tt.line)
			}
			v, err := state.ParseValue(tt.value)
			if err != nil {
				t.Fatal(err)
			}
			if got := state.ValueAnswer(v).String() + "\n"; got != tt.line {
				t.Errorf("ValueAnswer(%q) = %q, want %q", tt.value, got, tt.line)
			}
		})
	}
}

func TestAnswerString(t *testing.T) {
	tests := []struct {
		a    state.Answer
		want string
	}{
		{state.Answer{Admin: state.Ready, Weight: 100}, "ready 100%"},
		{state.Answer{Admin: state.Ready, Weight: 25}, "ready 25%"},
		{state.Answer{Admin: state.Ready, Weight: 0}, "ready 0%"},
		{state.Answer{Admin: state.Drain}, "drain"},
		{state.Answer{Admin: state.Maint}, "maint"},
		{state.Answer{Withheld: true}, ""},
		{state.Answer{Withheld: true, Admin: state.Drain}, ""},
	}
	for _, tt := range tests {
		if got := tt.a.String(); got != tt.want {
			t.Errorf("%+v.String() = %q, want %q", tt.a, got, tt.want)
		}
	}
}

// TestEveryWeightAnswer serves every N% once and checks its wire line.
func TestEveryWeightAnswer(t *testing.T) {
	kv := map[string]string{}
	want := map[string]string{}
	for n := 0; n <= state.MaxWeight; n++ {
		kv[fmt.Sprintf("state/web/s%d", n)] = fmt.Sprintf("%d%%", n)
		want[fmt.Sprintf("web/s%d\n", n)] = fmt.Sprintf("ready %d%%\n", n)
	}
	expectAnswers(t, snapshotOf(t, kv), want)
}

func TestPrecedence(t *testing.T) {
	tests := []struct {
		name string
		kv   map[string]string
		want map[string]string // request -> answer line
	}{
		{
			name: "no keys: ready 100%",
			kv:   map[string]string{},
			want: map[string]string{"web/a\n": "ready 100%\n", "x/y": "ready 100%\n"},
		},
		{
			name: "exact key",
			kv:   map[string]string{"state/web/a": "drain"},
			want: map[string]string{"web/a\n": "drain\n", "web/a\r\n": "drain\n", "web/a": "drain\n", "web/b\n": "ready 100%\n"},
		},
		{
			name: "wildcard covers every server of its backend",
			kv:   map[string]string{"state/web/*": "drain"},
			want: map[string]string{
				"web/a\n":         "drain\n",
				"web/new-node\n":  "drain\n",
				"web/*\n":         "drain\n",
				"api/a\n":         "ready 100%\n",
				"web2/a\n":        "ready 100%\n",
				"we/a\n":          "ready 100%\n",
				"canary_web/a\n":  "ready 100%\n",
				"WEB/a\n":         "ready 100%\n", // names are case-sensitive
				"web.canary/a\n":  "ready 100%\n",
				"api/new-node\n":  "ready 100%\n",
				"web/a.example\n": "drain\n",
			},
		},
		{
			name: "exact key beats wildcard",
			kv:   map[string]string{"state/web/*": "drain", "state/web/a": "ready", "state/web/b": "25%", "state/web/c": "maint"},
			want: map[string]string{
				"web/a\n": "ready 100%\n",
				"web/b\n": "ready 25%\n",
				"web/c\n": "maint\n",
				"web/d\n": "drain\n",
			},
		},
		{
			name: "wildcard weight, exact drain",
			kv:   map[string]string{"state/web/*": "10%", "state/web/a": "drain"},
			want: map[string]string{"web/a\n": "drain\n", "web/b\n": "ready 10%\n"},
		},
		{
			name: "wildcard of another backend does not apply",
			kv:   map[string]string{"state/api/*": "maint", "state/web/a": "drain"},
			want: map[string]string{"web/a\n": "drain\n", "web/b\n": "ready 100%\n", "api/a\n": "maint\n", "api/b\n": "maint\n"},
		},
		{
			name: "same server name in another backend",
			kv:   map[string]string{"state/api/a": "drain"},
			want: map[string]string{"web/a\n": "ready 100%\n", "api/a\n": "drain\n"},
		},
		{
			name: "exact key with no valid value withholds even under a wildcard",
			kv:   map[string]string{"state/web/*": "drain", "state/web/a": "bogus"},
			want: map[string]string{"web/a\n": withheld, "web/b\n": "drain\n"},
		},
		{
			name: "wildcard with no valid value withholds the servers it covers",
			kv:   map[string]string{"state/web/*": "300%", "state/web/a": "drain"},
			want: map[string]string{"web/a\n": "drain\n", "web/b\n": withheld, "api/b\n": "ready 100%\n"},
		},
		{
			name: "wildcard ready",
			kv:   map[string]string{"state/web/*": "ready"},
			want: map[string]string{"web/a\n": "ready 100%\n"},
		},
		{
			name: "non-state keys do not answer",
			kv:   map[string]string{"config/ramp": "drain", "web/a": "drain", "statesweb/a": "drain"},
			want: map[string]string{"web/a\n": "ready 100%\n"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			expectAnswers(t, snapshotOf(t, tt.kv), tt.want)
		})
	}
}

func TestResolveSource(t *testing.T) {
	snap := snapshotOf(t, map[string]string{
		"state/web/*": "drain",
		"state/web/a": "maint",
		"state/web/b": "nope",
	})
	tests := []struct {
		backend, server string
		source          state.Source
		answer          string
	}{
		{"web", "a", "state/web/a", "maint"},
		{"web", "b", "state/web/b", withheld},
		{"web", "c", "state/web/*", "drain"},
		{"api", "a", state.SourceAbsent, "ready 100%"},
	}
	for _, tt := range tests {
		r := snap.Resolve(tt.backend, tt.server)
		if r.Backend != tt.backend || r.Server != tt.server || r.Source != tt.source || r.Answer.String() != tt.answer {
			t.Errorf("Resolve(%q, %q) = %+v, want source %q answer %q", tt.backend, tt.server, r, tt.source, tt.answer)
		}
		switch {
		case tt.source == state.SourceAbsent:
			if r.Entry != nil {
				t.Errorf("Resolve(%q, %q): absent key has entry %+v", tt.backend, tt.server, *r.Entry)
			}
		case r.Entry == nil:
			t.Errorf("Resolve(%q, %q): no entry for source %q", tt.backend, tt.server, tt.source)
		case state.Source(r.Entry.Key) != tt.source:
			t.Errorf("Resolve(%q, %q): entry key %q, source %q", tt.backend, tt.server, r.Entry.Key, tt.source)
		}
	}
	if r := snap.Resolve("web", "b"); r.Entry == nil || r.Entry.Valid() || r.Entry.HasLast || r.Entry.Raw != "nope" {
		t.Errorf("Resolve(web, b).Entry = %+v, want the invalid entry with raw %q and no last value", r.Entry, "nope")
	}
}

// TestInvalidValueKeepsLastValid walks one key through the life the contract
// describes: a typo never changes what is served, a deletion clears the key
// and forgets its last valid value.
func TestInvalidValueKeepsLastValid(t *testing.T) {
	for _, key := range []string{"state/web/a", "state/web/*"} {
		t.Run(key, func(t *testing.T) {
			m := state.NewMirror()
			steps := []struct {
				kv      map[string]string // full KV content after the step
				answer  string            // for web/a
				invalid int
				last    string // LastRaw of the key; "" when it has none
			}{
				{kv: map[string]string{key: "drain"}, answer: "drain\n", last: "drain"},
				{kv: map[string]string{key: "300%"}, answer: "drain\n", invalid: 1, last: "drain"},
				{kv: map[string]string{key: "draim"}, answer: "drain\n", invalid: 1, last: "drain"},
				{kv: map[string]string{key: `{"state":"drain"`}, answer: "drain\n", invalid: 1, last: "drain"},
				{kv: map[string]string{key: "25%"}, answer: "ready 25%\n", last: "25%"},
				{kv: map[string]string{key: ""}, answer: "ready 25%\n", invalid: 1, last: "25%"},
				{kv: map[string]string{key: `{"state":"maint","reason":"disk"}`}, answer: "maint\n", last: `{"state":"maint","reason":"disk"}`},
				{kv: map[string]string{key: "-1%"}, answer: "maint\n", invalid: 1, last: `{"state":"maint","reason":"disk"}`},
				{kv: map[string]string{}, answer: "ready 100%\n"},
				// Deleted and re-created invalid: the old value is forgotten.
				{kv: map[string]string{key: "-1%"}, answer: withheld, invalid: 1},
				{kv: map[string]string{key: "ready"}, answer: "ready 100%\n", last: "ready"},
			}
			for i, st := range steps {
				m.Apply(m.Diff(st.kv))
				snap := m.Snapshot()
				if got := answer(t, snap, "web/a\n"); got != st.answer {
					t.Errorf("step %d (%v): answer %q, want %q", i, st.kv, got, st.answer)
				}
				if got := snap.Invalid(); got != st.invalid {
					t.Errorf("step %d (%v): Invalid() = %d, want %d", i, st.kv, got, st.invalid)
				}
				entries := snap.Entries()
				if len(st.kv) == 0 {
					if len(entries) != 0 {
						t.Errorf("step %d: deleted key still has entries %+v", i, entries)
					}
					continue
				}
				if len(entries) != 1 {
					t.Fatalf("step %d: entries %+v, want one", i, entries)
				}
				e := entries[0]
				if e.Key != key || e.Backend != "web" || e.Server != strings.TrimPrefix(key, "state/web/") {
					t.Errorf("step %d: entry %+v has the wrong key parts", i, e)
				}
				if e.Raw != st.kv[key] {
					t.Errorf("step %d: entry Raw = %q, want %q", i, e.Raw, st.kv[key])
				}
				if e.Valid() != (st.invalid == 0) {
					t.Errorf("step %d: entry Valid() = %v with Err %q", i, e.Valid(), e.Err)
				}
				if !e.Valid() && !strings.Contains(e.Err, state.ErrInvalidValue.Error()) {
					t.Errorf("step %d: Err %q does not say the value is invalid", i, e.Err)
				}
				if e.HasLast != (st.last != "") || e.LastRaw != st.last {
					t.Errorf("step %d: entry last = %v %q, want %q", i, e.HasLast, e.LastRaw, st.last)
				}
				if e.HasLast {
					want, err := state.ParseValue(e.LastRaw)
					if err != nil || e.Last() != want {
						t.Errorf("step %d: entry Last = %+v, want the parse of %q", i, e.Last(), e.LastRaw)
					}
				}
			}
		})
	}
}

func TestInvalidValueWithoutLastIsWithheld(t *testing.T) {
	snap := snapshotOf(t, map[string]string{"state/web/a": "300%", "state/web/b": "drain"})
	if line := snap.Lookup([]byte("web/a"), 3); line != nil {
		t.Errorf("Lookup(web/a) = %q, want nil (withheld)", line)
	}
	r := snap.Resolve("web", "a")
	if !r.Answer.Withheld || r.Answer.String() != "" || r.Source != "state/web/a" {
		t.Errorf("Resolve(web, a) = %+v, want withheld from state/web/a", r)
	}
	if got := answer(t, snap, "web/b\n"); got != "drain\n" {
		t.Errorf("web/b: answer %q, want drain", got)
	}
	if got := snap.Invalid(); got != 1 {
		t.Errorf("Invalid() = %d, want 1", got)
	}
}

func TestInvalidKeyShape(t *testing.T) {
	bad := []string{
		"state/foo",
		"state/a/b/c",
		"state//a",
		"state/a/",
		"state/",
		"state/web/a/",
		"state//",
	}
	kv := map[string]string{"state/web/a": "maint"}
	for _, k := range bad {
		kv[k] = "drain"
	}
	snap := snapshotOf(t, kv)

	entries := snap.Entries()
	if len(entries) != len(bad)+1 {
		t.Fatalf("Entries() has %d entries, want %d: %+v", len(entries), len(bad)+1, entries)
	}
	if !slices.IsSortedFunc(entries, func(a, b state.Entry) int { return strings.Compare(a.Key, b.Key) }) {
		t.Errorf("Entries() not sorted by key: %+v", entries)
	}
	for _, e := range entries {
		if e.Key == "state/web/a" {
			if !e.Valid() || e.Backend != "web" || e.Server != "a" {
				t.Errorf("valid key reported as %+v", e)
			}
			continue
		}
		if e.Valid() || !strings.Contains(e.Err, state.ErrInvalidKey.Error()) || !strings.Contains(e.Err, e.Key) {
			t.Errorf("key %q: Err = %q, want an invalid-key error naming the key", e.Key, e.Err)
		}
		if e.Backend != "" || e.Server != "" || e.HasLast || e.Raw != "drain" {
			t.Errorf("key %q: entry %+v, want no backend, server or last value, raw kept", e.Key, e)
		}
	}
	if got := snap.Invalid(); got != len(bad) {
		t.Errorf("Invalid() = %d, want %d", got, len(bad))
	}
	// Not served: nothing they might be taken to mean is drained.
	expectAnswers(t, snap, map[string]string{
		"web/a\n": "maint\n",
		"web/b\n": "ready 100%\n",
		"foo/a\n": "ready 100%\n",
		"a/b\n":   "ready 100%\n",
		"b/c\n":   "ready 100%\n",
		"a/x\n":   "ready 100%\n",
	})
}

func TestNonStateKeys(t *testing.T) {
	kv := map[string]string{
		"config/ramp":   "5m",
		"state/web/a":   "drain",
		"statefoo":      "drain",
		"README":        "hello",
		"config/nested": `{"state":"drain"}`,
	}
	m := mirrorOf(t, kv)
	if got := m.KV(); !maps.Equal(got, kv) {
		t.Errorf("KV() = %v, want %v", got, kv)
	}
	if m.Len() != len(kv) {
		t.Errorf("Len() = %d, want %d", m.Len(), len(kv))
	}
	entries := m.Snapshot().Entries()
	if len(entries) != 1 || entries[0].Key != "state/web/a" {
		t.Errorf("Entries() = %+v, want only state/web/a", entries)
	}

	// KV returns a copy.
	got := m.KV()
	got["state/web/a"] = "ready"
	if m.KV()["state/web/a"] != "drain" {
		t.Errorf("changing the map KV returned changed the mirror")
	}
}

func TestDiff(t *testing.T) {
	tests := []struct {
		name     string
		from, to map[string]string
		want     state.Change
	}{
		{name: "empty to empty", from: map[string]string{}, to: map[string]string{}},
		{name: "empty to nil", from: map[string]string{}, to: nil},
		{name: "unchanged", from: map[string]string{"state/web/a": "drain", "x": "1"}, to: map[string]string{"state/web/a": "drain", "x": "1"}},
		{
			name: "add",
			from: map[string]string{"state/web/a": "drain"},
			to:   map[string]string{"state/web/a": "drain", "state/web/b": "maint"},
			want: state.Change{Set: map[string]string{"state/web/b": "maint"}},
		},
		{
			name: "change",
			from: map[string]string{"state/web/a": "drain", "state/web/b": "maint"},
			to:   map[string]string{"state/web/a": "ready", "state/web/b": "maint"},
			want: state.Change{Set: map[string]string{"state/web/a": "ready"}},
		},
		{
			name: "whitespace is a change",
			from: map[string]string{"state/web/a": "drain"},
			to:   map[string]string{"state/web/a": "drain\n"},
			want: state.Change{Set: map[string]string{"state/web/a": "drain\n"}},
		},
		{
			name: "empty value is not absent",
			from: map[string]string{},
			to:   map[string]string{"state/web/a": ""},
			want: state.Change{Set: map[string]string{"state/web/a": ""}},
		},
		{
			name: "delete, sorted",
			from: map[string]string{"state/web/c": "drain", "state/web/a": "drain", "state/web/b": "drain", "config/x": "1"},
			to:   map[string]string{"state/web/b": "drain"},
			want: state.Change{Delete: []string{"config/x", "state/web/a", "state/web/c"}},
		},
		{
			name: "delete all",
			from: map[string]string{"state/web/a": "drain", "state/web/*": "maint"},
			to:   nil,
			want: state.Change{Delete: []string{"state/web/*", "state/web/a"}},
		},
		{
			name: "mixed",
			from: map[string]string{"state/web/a": "drain", "state/web/b": "maint", "state/web/c": "25%"},
			to:   map[string]string{"state/web/a": "drain", "state/web/b": "ready", "state/web/d": "0%"},
			want: state.Change{
				Set:    map[string]string{"state/web/b": "ready", "state/web/d": "0%"},
				Delete: []string{"state/web/c"},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := mirrorOf(t, tt.from)
			c := m.Diff(tt.to)
			if !maps.Equal(c.Set, tt.want.Set) || !slices.Equal(c.Delete, tt.want.Delete) {
				t.Errorf("Diff = %+v, want %+v", c, tt.want)
			}
			if c.Empty() != (len(tt.want.Set) == 0 && len(tt.want.Delete) == 0) {
				t.Errorf("Diff(...).Empty() = %v for %+v", c.Empty(), c)
			}
			m.Apply(c)
			if got := m.KV(); !maps.Equal(got, tt.to) {
				t.Errorf("after Apply(Diff): KV() = %v, want %v", got, tt.to)
			}
			if again := m.Diff(tt.to); !again.Empty() {
				t.Errorf("Diff after Apply(Diff) = %+v, want empty", again)
			}
		})
	}
}

// TestDiffApplyRandom applies random full KV reads in sequence and checks
// that each Diff holds exactly the needed set/delete operations and that a
// mirror fed by Diff ends in the same state as one built from scratch.
func TestDiffApplyRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	keys := []string{"state/web/a", "state/web/b", "state/web/*", "state/api/x", "state/api/*", "state/bad", "config/x"}
	values := []string{"ready", "drain", "maint", "25%", "300%", "junk", "", `{"state":"drain","ramp":"1m"}`}
	m := state.NewMirror()
	for round := range 2000 {
		desired := map[string]string{}
		for _, k := range keys {
			if rng.IntN(3) > 0 {
				desired[k] = values[rng.IntN(len(values))]
			}
		}
		before := m.KV()
		c := m.Diff(desired)
		for k, v := range c.Set {
			if old, ok := before[k]; ok && old == v {
				t.Fatalf("round %d: Diff sets %q to its current value %q", round, k, v)
			}
			if desired[k] != v {
				t.Fatalf("round %d: Diff sets %q = %q, desired %q", round, k, v, desired[k])
			}
		}
		for k, v := range desired {
			if old, ok := before[k]; (!ok || old != v) && c.Set[k] != v {
				t.Fatalf("round %d: Diff misses setting %q = %q", round, k, v)
			}
		}
		var wantDelete []string
		for k := range before {
			if _, ok := desired[k]; !ok {
				wantDelete = append(wantDelete, k)
			}
		}
		slices.Sort(wantDelete)
		if !slices.Equal(c.Delete, wantDelete) {
			t.Fatalf("round %d: Diff deletes %v, want %v", round, c.Delete, wantDelete)
		}
		m.Apply(c)
		if got := m.KV(); !maps.Equal(got, desired) {
			t.Fatalf("round %d: KV() = %v, want %v", round, got, desired)
		}

		// Valid values and their answers do not depend on history; invalid
		// ones do, so compare only keys that are valid now.
		fresh := mirrorOf(t, desired).Snapshot()
		snap := m.Snapshot()
		for i, e := range snap.Entries() {
			f := fresh.Entries()[i]
			if e.Valid() && e != f {
				t.Fatalf("round %d: entry %+v, built from scratch %+v", round, e, f)
			}
		}
	}
}

func TestSynced(t *testing.T) {
	m := state.NewMirror()
	if m.Synced() {
		t.Error("new mirror is synced")
	}
	if m.Len() != 0 || len(m.KV()) != 0 {
		t.Errorf("new mirror holds %v", m.KV())
	}
	// An empty KV read still means the mirror holds state: "nothing set".
	m.Apply(m.Diff(map[string]string{}))
	if !m.Synced() {
		t.Error("mirror not synced after applying an empty read")
	}
}

// buildHistory returns a mirror whose keys cover every case Export must
// carry: valid, invalid with a last valid value, invalid without one, an
// invalid key shape and a non-state key.
func buildHistory(t *testing.T) *state.Mirror {
	t.Helper()
	m := state.NewMirror()
	m.Apply(m.Diff(map[string]string{
		"state/web/a": "drain",
		"state/web/*": `{"state":"maint","reason":"r","by":"b","ramp":"2m"}`,
		"state/api/x": "25%",
	}))
	m.Apply(m.Diff(map[string]string{
		"state/web/a": "300%", // invalid, last valid drain
		"state/web/*": "nope", // invalid, last valid maint (JSON)
		"state/api/x": "25%",
		"state/api/y": "bogus", // invalid, never valid
		"state/bad":   "drain", // invalid key
		"config/ramp": "5m",
	}))
	return m
}

var historyRequests = []string{"web/a\n", "web/b\n", "api/x\n", "api/y\n", "api/z\n", "bad/x\n", "other/x\n"}

func TestExportRestore(t *testing.T) {
	m := buildHistory(t)
	p := m.Export()
	if want := map[string]string{"state/web/a": "drain", "state/web/*": `{"state":"maint","reason":"r","by":"b","ramp":"2m"}`}; !maps.Equal(p.LastValid, want) {
		t.Errorf("Export().LastValid = %v, want %v", p.LastValid, want)
	}
	if !p.Synced || !maps.Equal(p.KV, m.KV()) {
		t.Errorf("Export() = %+v, want synced with the mirror's KV", p)
	}

	// Through JSON, as a raft snapshot stores it.
	data, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	var decoded state.Persisted
	if err := json.Unmarshal(data, &decoded); err != nil {
		t.Fatal(err)
	}
	r := state.Restore(decoded)

	if !r.Synced() {
		t.Error("restored mirror is not synced")
	}
	if !maps.Equal(r.KV(), m.KV()) {
		t.Errorf("restored KV() = %v, want %v", r.KV(), m.KV())
	}
	want, got := m.Snapshot(), r.Snapshot()
	if !slices.Equal(got.Entries(), want.Entries()) {
		t.Errorf("restored entries\n%+v\nwant\n%+v", got.Entries(), want.Entries())
	}
	if got.Invalid() != 3+1 {
		t.Errorf("restored Invalid() = %d, want 4", got.Invalid())
	}
	for _, req := range historyRequests {
		if a, b := answer(t, got, req), answer(t, want, req); a != b {
			t.Errorf("request %q: restored answer %q, original %q", req, a, b)
		}
	}
	expectAnswers(t, got, map[string]string{
		"web/a\n": "drain\n",     // last valid of an invalid key
		"web/b\n": "maint\n",     // last valid of an invalid wildcard
		"api/x\n": "ready 25%\n", // valid
		"api/y\n": withheld,      // invalid, never valid
		"api/z\n": "ready 100%\n",
	})
	if e := got.Resolve("web", "b").Entry; e == nil || e.Last().Reason != "r" || e.Last().By != "b" || !e.Last().RampSet {
		t.Errorf("restored wildcard entry %+v lost the JSON fields of its last valid value", e)
	}

	// Export of the restored mirror is the same durable form, and restored
	// mirrors keep the last-valid rule going.
	p2 := r.Export()
	if p2.Synced != p.Synced || !maps.Equal(p2.KV, p.KV) || !maps.Equal(p2.LastValid, p.LastValid) {
		t.Errorf("Export after Restore = %+v, want %+v", p2, p)
	}
	r.Apply(r.Diff(map[string]string{"state/web/a": "still-bad"}))
	if got := answer(t, r.Snapshot(), "web/a\n"); got != "drain\n" {
		t.Errorf("restored mirror lost the last valid value on a new invalid value: %q", got)
	}
}

func TestExportRestoreUnsynced(t *testing.T) {
	p := state.NewMirror().Export()
	if p.Synced || len(p.KV) != 0 || len(p.LastValid) != 0 {
		t.Errorf("Export of a new mirror = %+v, want empty and unsynced", p)
	}
	r := state.Restore(p)
	if r.Synced() || r.Len() != 0 {
		t.Errorf("Restore(%+v): synced %v, %d keys; want unsynced and empty", p, r.Synced(), r.Len())
	}
	// The zero Persisted restores too (a snapshot written before any state).
	if r := state.Restore(state.Persisted{}); r.Synced() || r.Len() != 0 {
		t.Errorf("Restore(Persisted{}): synced %v, %d keys", r.Synced(), r.Len())
	}
	// Synced with no keys: the replica knows "nothing is set".
	r = state.Restore(state.Persisted{Synced: true})
	if !r.Synced() {
		t.Error("Restore(Persisted{Synced: true}) is not synced")
	}
	if got := answer(t, r.Snapshot(), "web/a\n"); got != "ready 100%\n" {
		t.Errorf("answer from a synced empty restore = %q, want ready 100%%", got)
	}
}

func TestNilSnapshotWithholdsEverything(t *testing.T) {
	var snap *state.Snapshot
	for _, req := range []string{"web/a", "web/*", "x/y"} {
		b, _, err := state.ParseRequest([]byte(req))
		if err != nil {
			t.Fatal(err)
		}
		if line := snap.Lookup([]byte(req), len(b)); line != nil {
			t.Errorf("nil Snapshot: Lookup(%q) = %q, want nil", req, line)
		}
		if got := answer(t, snap, req); got != withheld {
			t.Errorf("nil Snapshot: answer(%q) = %q", req, got)
		}
	}
	r := snap.Resolve("web", "a")
	if !r.Answer.Withheld || r.Source != state.SourceNoState || r.Entry != nil || r.Backend != "web" || r.Server != "a" {
		t.Errorf("nil Snapshot: Resolve = %+v, want withheld with source %q", r, state.SourceNoState)
	}
	if e := snap.Entries(); e != nil {
		t.Errorf("nil Snapshot: Entries() = %v, want nil", e)
	}
	if n := snap.Invalid(); n != 0 {
		t.Errorf("nil Snapshot: Invalid() = %d, want 0", n)
	}
}

// TestSnapshotIsImmutable: a snapshot handed to the agent server does not
// change when the mirror moves on, and can be read from many goroutines
// while it does (run with -race).
func TestSnapshotIsImmutable(t *testing.T) {
	m := mirrorOf(t, map[string]string{"state/web/a": "drain", "state/web/*": "maint"})
	old := m.Snapshot()

	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			for range 500 {
				b := old.Lookup([]byte("web/a"), 3)
				w := old.Lookup([]byte("web/z"), 3)
				r := old.Resolve("web", "a")
				if string(b) != "drain\n" || string(w) != "maint\n" || r.Answer.String() != "drain" || len(old.Entries()) != 2 || old.Invalid() != 0 {
					errs <- fmt.Errorf("old snapshot changed: %q %q %+v", b, w, r)
					return
				}
			}
		})
	}
	for i := range 500 {
		m.Apply(m.Diff(map[string]string{"state/web/a": fmt.Sprintf("%d%%", i%257), "state/web/b": "junk"}))
		_ = m.Snapshot()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	expectAnswers(t, old, map[string]string{"web/a\n": "drain\n", "web/b\n": "maint\n"})
}

func TestChangeEmpty(t *testing.T) {
	tests := []struct {
		c    state.Change
		want bool
	}{
		{state.Change{}, true},
		{state.Change{Set: map[string]string{}, Delete: []string{}}, true},
		{state.Change{Set: map[string]string{"k": ""}}, false},
		{state.Change{Delete: []string{"k"}}, false},
	}
	for _, tt := range tests {
		if got := tt.c.Empty(); got != tt.want {
			t.Errorf("%+v.Empty() = %v, want %v", tt.c, got, tt.want)
		}
	}
}

// TestChangeJSON: Change is the raft payload; it must survive JSON.
func TestChangeJSON(t *testing.T) {
	c := state.Change{Set: map[string]string{"state/web/a": " drain\n", "state/web/*": `{"state":"maint"}`}, Delete: []string{"state/x/y"}}
	data, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	var got state.Change
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(got.Set, c.Set) || !slices.Equal(got.Delete, c.Delete) {
		t.Errorf("Change JSON round trip = %+v, want %+v", got, c)
	}
	if data, err := json.Marshal(state.Change{}); err != nil || string(data) != "{}" {
		t.Errorf("empty Change marshals to %s, %v; want {}", data, err)
	}
}

func TestDiffKeysEqualsDiffOnTheKeysThatDiffer(t *testing.T) {
	m := state.NewMirror()
	m.Apply(state.Change{Set: map[string]string{"state/web/a": "drain", "state/web/b": "maint", "config/ramp": `{"duration":"5m"}`}})
	desired := map[string]string{"state/web/a": "ready", "state/web/c": "drain", "config/ramp": `{"duration":"5m"}`}
	full := m.Diff(desired)
	// Every key that differs, an unchanged one and a repeat: the same.
	got := m.DiffKeys(desired, []string{"state/web/c", "state/web/a", "config/ramp", "state/web/b", "state/web/a", "state/web/b"})
	if !maps.Equal(got.Set, full.Set) || !slices.Equal(got.Delete, full.Delete) {
		t.Errorf("DiffKeys = %+v, Diff = %+v", got, full)
	}
	if c := m.DiffKeys(desired, nil); !c.Empty() {
		t.Errorf("DiffKeys with no keys = %+v, want empty", c)
	}
}

// TestDigestIsTheSortedQuotedLines: the digest is SHA-256 over the sorted
// lines %q=%q, as the tests and tools outside compute it, for the mirror
// as for a map.
func TestDigestIsTheSortedQuotedLines(t *testing.T) {
	kv := map[string]string{"state/web/b": "maint", "state/web/a": `{"reason":"x\ny"}`, "state/wéb/\"q\"": "\x01", "config/ramp": ""}
	h := sha256.New()
	for _, k := range slices.Sorted(maps.Keys(kv)) {
		fmt.Fprintf(h, "%q=%q\n", k, kv[k])
	}
	want := hex.EncodeToString(h.Sum(nil))
	if got := state.Digest(kv); got != want {
		t.Errorf("Digest = %s, want %s", got, want)
	}
	m := state.NewMirror()
	m.Apply(state.Change{Set: kv})
	if got := m.Digest(); got != want {
		t.Errorf("Mirror.Digest = %s, want %s", got, want)
	}
}
