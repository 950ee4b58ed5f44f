package fsm

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/hastate/hastate/internal/testenv"
	"github.com/hastate/hastate/state"
)

// entry encodes a Command as raft log data, as the leader writes it.
func entry(t testing.TB, c Command) []byte {
	t.Helper()
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// rejectedEntries are entries the FSM cannot apply as written, one per
// line of testdata/rejected-entries.jsonl (the node's tests replay them
// through raft too): first the entries a leader that did not validate ramp
// policies committed for issue 7's report (config/ramp
// {"duration":"0","interval":"0"} was accepted, and drain -> ready with a
// key's 10m ramp divided by the interval 0 on every replica, again at every
// log replay), then a value of the wrong JSON type, bytes that are not
// JSON, and ramp steps with absurd weights and targets.
func rejectedEntries(t testing.TB) [][]byte {
	t.Helper()
	return testenv.Lines(t, "testdata/rejected-entries.jsonl")
}

func TestFSMApplyIsTotal(t *testing.T) {
	f := New(Options{})
	var rejected []error
	f.o.Rejected = func(err error) { rejected = append(rejected, err) }
	for i, data := range rejectedEntries(t) {
		f.Apply(&raft.Log{Type: raft.LogCommand, Index: uint64(i + 1), Data: data})
	}
	// The three crash entries: only the ramp policy is refused, the KV
	// changes are applied (web/a goes ready at once, without a ramp). The
	// undecodable and wrongly typed entries are skipped. (An entry of an
	// unknown type is not: see TestUnknownEntryWithholds.)
	if got := string(f.serving.Load().Lookup([]byte("web/a"), 3)); got != "ready 100%\n" {
		t.Errorf("web/a answers %q after drain -> ready under an invalid policy, want ready 100%%", got)
	}
	if len(f.mirror.Ramps()) != 0 {
		t.Errorf("ramps %+v started under an invalid policy", f.mirror.Ramps())
	}
	if len(rejected) != 5 {
		t.Errorf("%d entries reported, want 5 (3 invalid policies, undecodable x2): %v", len(rejected), rejected)
	}
	for _, err := range rejected {
		if !strings.Contains(err.Error(), "raft entry ") {
			t.Errorf("report %q does not name the entry", err)
		}
	}
	if f.index.Load() != uint64(len(rejectedEntries(t))) {
		t.Errorf("state index %d: a skipped entry must still count as applied", f.index.Load())
	}
}

// TestFSMApplyRecoversFromPanic: the last line of defence, for a bug not
// yet known: a panic while applying is reported, not fatal, and the
// replica keeps serving what its mirror holds.
func TestFSMApplyRecoversFromPanic(t *testing.T) {
	f := New(Options{})
	var rejected []error
	f.o.Rejected = func(err error) { rejected = append(rejected, err) }
	f.Apply(&raft.Log{Type: raft.LogCommand, Index: 1, Data: entry(t, Command{Type: CmdKV, Change: state.Change{Set: map[string]string{"state/web/a": "drain"}}})})
	res := f.mutate(2, func(*state.Mirror) []state.RampEvent { panic("boom") })
	if err, ok := res.(error); !ok || !strings.Contains(err.Error(), "boom") || len(rejected) != 1 {
		t.Fatalf("mutate after a panic returned %v (reported %v), want the panic as an error", res, rejected)
	}
	if got := string(f.serving.Load().Lookup([]byte("web/a"), 3)); got != "drain\n" {
		t.Errorf("after a panic web/a answers %q, want drain", got)
	}
	f.mu.Lock() // the lock was released
	f.mu.Unlock()
}

// FuzzFSMApply feeds the FSM arbitrary entries: raw bytes, and KV changes
// and ramp steps under arbitrary policies (the leader validates what it
// writes, but a log may hold what an older leader wrote). No input may
// panic, and every answer served is a whole line or withheld.
func FuzzFSMApply(f *testing.F) {
	for _, d := range rejectedEntries(f) {
		f.Add(d, 10, int64(0), int64(0), 1.0, "state/web/a", `{"state":"ready","ramp":"10m"}`, 50, int64(time.Minute))
	}
	f.Add([]byte(`{"type":"kv","change":{"delete":["state/web/a"]}}`), 0, int64(time.Hour), int64(time.Nanosecond), math.NaN(), "state/web/*", "drain", 101, int64(-1))
	f.Add([]byte(`{}`), -5, int64(-1), int64(-1), -1.0, "state//", `{"state":"maint","ramp":"24h"}`, -1, int64(math.MaxInt64))
	f.Add([]byte(`{"type":"ramp","steps":{"done":["web/*"]}}`), 100, int64(math.MaxInt64), int64(math.MaxInt64), math.Inf(1), "state/web/a/b", "30%", 99, int64(math.MinInt64))

	f.Fuzz(func(t *testing.T, raw []byte, start int, dur, interval int64, aggression float64, key, value string, weight int, elapsed int64) {
		fsm := New(Options{})
		fsm.o.Rejected = func(error) {}
		p := state.RampPolicy{Start: start, Duration: time.Duration(dur), Interval: time.Duration(interval), Aggression: aggression}
		at := time.Unix(1_800_000_000, 0)
		target := strings.TrimPrefix(key, state.StatePrefix)
		// JSON cannot carry NaN or infinities: such a policy cannot be in
		// a log, and enc leaves the entry empty (undecodable) instead.
		enc := func(c Command) []byte { b, _ := json.Marshal(c); return b }
		cmds := [][]byte{
			raw,
			enc(Command{Type: CmdKV, At: at, Ramp: p, Change: state.Change{Set: map[string]string{key: `{"state":"drain","ramp":"10m"}`, "state/web/*": "drain"}}}),
			enc(Command{Type: CmdKV, At: at, Ramp: p, Change: state.Change{Set: map[string]string{key: value, "config/ramp": value}, Delete: []string{"state/web/*"}}}),
			enc(Command{Type: CmdRamp, Steps: state.RampSteps{Weights: map[string]int{target: weight}, Done: []string{target}}}),
			enc(Command{Type: CmdKV, At: at, Ramp: p, Change: state.Change{Delete: []string{key}}}),
		}
		var index uint64
		apply := func(data []byte) any {
			index++
			return fsm.Apply(&raft.Log{Type: raft.LogCommand, Index: index, Data: data})
		}
		for i, data := range cmds {
			switch res := apply(data).(type) {
			case nil, error, ApplyResult:
			default:
				t.Fatalf("entry %d: Apply returned %T", i, res)
			}
			// The leader's step computation is total too, and its
			// steps apply.
			apply(enc(Command{Type: CmdRamp, Steps: state.NextSteps(fsm.Ramps(), at.Add(time.Duration(elapsed)))}))
			snap := fsm.serving.Load()
			for _, req := range []string{target, "web/a", "web/zz"} {
				slash := strings.IndexByte(req, '/')
				if slash < 0 {
					continue
				}
				if line := snap.Lookup([]byte(req), slash); line != nil && !strings.HasSuffix(string(line), "\n") {
					t.Fatalf("entry %d: %s answers %q: not a whole line", i, req, line)
				}
			}
		}
	})
}

// TestLargeChangesReturnMemory: an entry that changes LargeChange keys or
// more, and a restore, are followed by returning memory to the OS (see
// memory.go); an ordinary entry is not.
func TestLargeChangesReturnMemory(t *testing.T) {
	f := New(Options{})
	var large int
	f.o.Large = func() { large++ }
	set := func(n int) map[string]string {
		kv := make(map[string]string, n)
		for i := range n {
			kv[fmt.Sprintf("state/web/s%05d", i)] = "drain"
		}
		return kv
	}
	apply := func(i uint64, c state.Change) {
		t.Helper()
		if r := f.Apply(&raft.Log{Type: raft.LogCommand, Index: i, Data: entry(t, Command{Type: CmdKV, KVIndex: i, Change: c})}); r != nil {
			if err, ok := r.(error); ok {
				t.Fatal(err)
			}
		}
	}
	apply(1, state.Change{Set: set(10)})
	if large != 0 {
		t.Fatalf("an entry of 10 keys: %d returns, want 0", large)
	}
	apply(2, state.Change{Set: set(LargeChange)})
	if large != 1 {
		t.Fatalf("an entry of %d keys: %d returns, want 1", LargeChange, large)
	}
	_, sink := roundTrip(t, f)
	if err := f.Restore(io.NopCloser(bytes.NewReader(sink.Bytes()))); err != nil {
		t.Fatal(err)
	}
	if large != 2 {
		t.Fatalf("after a restore: %d returns, want 2", large)
	}
}
