package write

import (
	"encoding/json"
	"strings"

	"github.com/hastate/hastate/state"
)

// A state key holds one plain word, always (DESIGN.md, KV contract): the
// runbook's per-node agent, ChatOps and `consul kv get` read it. What
// hastate adds (reason, by, at, until, ramp) goes to the key's meta key in
// the same transaction. TxnOps is the one place that turns a planned write
// into what Consul is told.

// TxnOps returns the operations one planned write makes: a state key set
// to a value with additions (the JSON form ctl.Value builds) becomes the
// plain word in the state key and the additions in its meta key; a state
// key set to a plain word also deletes its meta key (it would describe an
// earlier write); deleting a state key deletes its meta key. Other keys
// are written as planned.
func TxnOps(o Op) []Op {
	mk, ok := state.MetaKeyOf(o.Key)
	if !ok || !strings.Contains(o.Key, state.StatePrefix) {
		return []Op{o}
	}
	if o.Delete {
		return []Op{o, {Delete: true, Key: mk}}
	}
	v, err := state.ParseValue(o.Value)
	if err != nil {
		return []Op{o} // not ours to rewrite; the planner checked the value
	}
	word := Op{Key: o.Key, Value: v.String()}
	if !state.IsJSONValue(o.Value) && len(o.Lifted) == 0 && o.Effect == "" {
		return []Op{word, {Delete: true, Key: mk}}
	}
	return []Op{word, {Key: mk, Value: metaValue(v, o.Lifted, o.Effect)}}
}

// metaValue is the meta key of v, with the guards the write lifted under
// "lifted", one string ("; " between guards) so that the meta key stays an
// object of strings (readers ignore fields they do not know), and what the
// write left under "effect".
func metaValue(v state.Value, lifted []string, effect string) string {
	m := state.MarshalMeta(v)
	if len(lifted) == 0 && effect == "" {
		return m
	}
	var j map[string]string
	if err := json.Unmarshal([]byte(m), &j); err != nil {
		return m // MarshalMeta always encodes an object
	}
	if len(lifted) > 0 {
		j["lifted"] = strings.Join(lifted, "; ")
	}
	if effect != "" {
		j["effect"] = effect
	}
	b, err := json.Marshal(j)
	if err != nil {
		return m
	}
	return string(b)
}

// txnLen is the number of Consul operations the planned ops make at most:
// two for a state key (the key and its meta key), one for any other.
func txnLen(ops []Op) int {
	n := 0
	for _, o := range ops {
		n++
		if _, ok := state.MetaKeyOf(o.Key); ok && strings.Contains(o.Key, state.StatePrefix) {
			n++
		}
	}
	return n
}
