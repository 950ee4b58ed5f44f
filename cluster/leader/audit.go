package leader

import (
	"maps"
	"slices"
	"strings"

	"github.com/hastate/hastate/state"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// What the leader logs about each KV change it applies, so that the logs
// answer "who drained what, when" and name every value it ignores.
const (
	// maxLoggedChanges caps the keys named in one "kv change applied"
	// line; the rest are counted.
	maxLoggedChanges = 20
	// MaxLoggedValue is the length, in bytes, values are cut to in logs.
	MaxLoggedValue = 200
)

// keyChange is one key of a KV change as logged: its old and new state.
type keyChange struct{ key, old, new string }

func (c keyChange) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	enc.AddString("key", c.key)
	enc.AddString("old", c.old)
	enc.AddString("new", c.new)
	return nil
}

type keyChanges []keyChange

func (cs keyChanges) MarshalLogArray(enc zapcore.ArrayEncoder) error {
	for _, c := range cs {
		if err := enc.AppendObject(c); err != nil {
			return err
		}
	}
	return nil
}

// changeFields are the fields naming what a change does: each key (sorted,
// at most maxLoggedChanges) with its old and new state, and how many more.
func changeFields(c state.Change, old map[string]string) []zap.Field {
	keys := slices.Sorted(maps.Keys(c.Set))
	keys = append(keys, c.Delete...)
	slices.Sort(keys)
	shown := keys[:min(len(keys), maxLoggedChanges)]
	cs := make(keyChanges, 0, len(shown))
	for _, k := range shown {
		o, had := old[k]
		n, set := c.Set[k]
		cs = append(cs, keyChange{key: k, old: describe(k, o, had), new: describe(k, n, set)})
	}
	return []zap.Field{zap.Array("changes", cs), zap.Int("changes_not_shown", len(keys)-len(shown))}
}

// describe renders a key's value for the audit log: "(absent)", a state
// key's short form with who and why, or the raw value cut short.
func describe(key, raw string, present bool) string {
	if !present {
		return "(absent)"
	}
	if !strings.HasPrefix(key, state.StatePrefix) {
		return cutValue(raw)
	}
	v, err := state.ParseValue(raw)
	if err != nil {
		return "invalid: " + cutValue(raw)
	}
	var b strings.Builder
	b.WriteString(v.String())
	if v.By != "" {
		b.WriteString(" by " + cutValue(v.By))
	}
	if v.Reason != "" {
		b.WriteString(" (" + cutValue(v.Reason) + ")")
	}
	if v.RampSet {
		b.WriteString(" ramp " + v.Ramp.String())
	}
	return b.String()
}

func cutValue(s string) string {
	if len(s) <= MaxLoggedValue {
		return s
	}
	return s[:MaxLoggedValue] + "..."
}

// logInvalid logs every state key the change sets to something that does
// not parse, once per key and value: the change holds only what differs
// from the mirror, so a value is logged when it arrives and not again.
func (d *Duties) logInvalid(c state.Change) {
	for _, k := range slices.Sorted(maps.Keys(c.Set)) {
		if !strings.HasPrefix(k, state.StatePrefix) {
			continue
		}
		if err := state.CheckKV(k, c.Set[k]); err != nil {
			d.log.Warn("ignoring an invalid KV value: the server keeps its last valid state (fix or delete the key)",
				zap.String("key", cutValue(k)), zap.String("value", cutValue(c.Set[k])), zap.String("reason", err.Error()))
		}
	}
}
