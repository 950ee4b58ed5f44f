package state

// This file holds the meta keys: what hastate's CLI writes beside a state
// key (<prefix>meta/<backend>/<server>), and the feature levels that say
// what the replicated state machine does with them.

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// MetaPrefix is the part of a KV key, after the configured prefix, under
// which meta keys live: <prefix>meta/<backend>/<server> describes
// <prefix>state/<backend>/<server>.
const MetaPrefix = "meta/"

// Feature levels of the replicated state machine. A level is raised by a
// raft entry the leader writes only once every voter advertises that it
// understands it, so that every replica applies every entry the same way
// while releases are mixed (see cluster's level gate).
const (
	// LevelBase is release 0.13.0's: meta keys are mirrored as data and
	// nothing else; a state key's JSON form is the only source of
	// until and ramp.
	LevelBase = 1
	// LevelMeta: a meta key whose state matches its state key also
	// gives the key its until (expiry) and its undrain ramp duration.
	LevelMeta = 2
	// LevelRecorded is release 0.15.0's level. Two kinds of entry wait
	// for it, since release 0.14.0 knows neither:
	//   - source (issue 37): the raft leader records the Consul cluster
	//     and KV prefix of the mirror (MirrorSource) and applies a read
	//     only from that same source;
	//   - haproxies (issue 34): the cluster records which HAProxy nodes
	//     exist (each source and, coarsely, when it last polled any
	//     replica; see HAProxies), so that operator commands decide from
	//     the replicas that are up.
	// Snapshots carry both (version 6). They are written only once every
	// voter advertises this level.
	LevelRecorded = 3
	// MaxLevel is the highest level this build understands.
	MaxLevel = LevelRecorded
)

// Notes on a state key, shown in status.
const (
	NoteJSONState   = "JSON in a state key: other readers do not understand it (hastate migrate-kv rewrites it as word + meta)"
	NoteOutside     = "set outside hastate: the meta key describes an earlier state and is ignored"
	NoteMetaWaits   = "the meta key's until and ramp wait until every replica runs a release that reads them (see /v1/cluster level)"
	noteMetaInvalid = "meta key ignored: "
)

// MetaKeyOf returns the meta key that describes a state key, both either
// relative to the prefix or with the same prefix in front; ok is false for
// a key that is not <...>state/<backend>/<server>.
func MetaKeyOf(stateKey string) (string, bool) { return swapDir(stateKey, StatePrefix, MetaPrefix) }

// StateKeyOf is MetaKeyOf's inverse.
func StateKeyOf(metaKey string) (string, bool) { return swapDir(metaKey, MetaPrefix, StatePrefix) }

// swapDir turns <p>from<backend>/<server> into <p>to<backend>/<server>.
func swapDir(key, from, to string) (string, bool) {
	i := strings.LastIndexByte(key, '/')
	if i <= 0 {
		return "", false
	}
	j := strings.LastIndexByte(key[:i], '/')
	// key[j+1:] is <backend>/<server>; before it must end with from.
	head := key[:j+1]
	if j <= 0 || i == len(key)-1 || j+1 == i || !strings.HasSuffix(head, from) {
		return "", false
	}
	return head[:len(head)-len(from)] + to + key[j+1:], true
}

// ParseMeta parses a meta key's value: a JSON object with a required
// "state" and optional "reason", "by", "at", "until" (RFC 3339) and
// "ramp", the fields of a state key's JSON form. Unknown fields are
// ignored: a newer release may add some. It returns the value the meta key
// describes; the error says why the meta key is ignored.
func ParseMeta(raw string) (Value, error) {
	var j jsonValue
	if err := json.Unmarshal([]byte(raw), &j); err != nil {
		return Value{}, fmt.Errorf("not a JSON object: %v", err)
	}
	return j.value()
}

// MarshalMeta renders a meta key's value for v, the value a CLI write
// means (its state and the additions).
func MarshalMeta(v Value) string {
	j := map[string]string{"state": v.String()}
	if v.Reason != "" {
		j["reason"] = v.Reason
	}
	if v.By != "" {
		j["by"] = v.By
	}
	if v.RampSet {
		j["ramp"] = formatRamp(v.Ramp)
	}
	if !v.At.IsZero() {
		j["at"] = v.At.UTC().Format(time.RFC3339)
	}
	if !v.Until.IsZero() {
		j["until"] = v.Until.UTC().Format(time.RFC3339)
	}
	b, _ := json.Marshal(j) // a map of strings always encodes
	return string(b)
}

func formatRamp(d time.Duration) string {
	if d == 0 {
		return "0"
	}
	return d.String()
}

// IsJSONValue reports whether a state key's raw value is the JSON form.
func IsJSONValue(raw string) bool { return strings.HasPrefix(strings.TrimSpace(raw), "{") }

// withMeta is the value a state key holding the word v means with its meta
// key (raw, present), at level: a meta key counts only while its state is
// v's; its until and ramp count only from LevelMeta on. note says what
// status should show about the pair ("" when nothing).
func withMeta(v Value, raw string, present bool, level int) (out Value, note string) {
	if !present {
		return v, ""
	}
	m, err := ParseMeta(raw)
	if err != nil {
		return v, noteMetaInvalid + err.Error()
	}
	if !sameState(m, v) {
		return v, NoteOutside
	}
	v.Reason, v.By, v.At = m.Reason, m.By, m.At
	if level < LevelMeta {
		if !m.Until.IsZero() || m.RampSet {
			note = NoteMetaWaits
		}
		return v, note
	}
	v.Until = m.Until
	if m.RampSet {
		v.Ramp, v.RampSet = m.Ramp, true
	}
	return v, ""
}
