package state

// This file holds the migration marker: <prefix>config/migration, written
// by `hastate migration start` while HAProxy nodes move from the runbook's
// per-node agent to hastate, both serving the same prefix. The per-node
// agent reads only <prefix>state/<backend>/<server>, so a key under
// config/ is invisible to it; the replicas mirror it as data (it never
// changes an answer) and show it in status and on the status page.

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// MigrationKey is the KV key, relative to the prefix, of the migration
// marker. While it exists (whatever it holds) a migration is marked.
const MigrationKey = "config/migration"

// Migration is the marker's value: who marked the migration, when and why.
type Migration struct {
	Started time.Time `json:"started"`
	By      string    `json:"by,omitempty"`
	Reason  string    `json:"reason,omitempty"`
}

// MarshalMigration renders the marker's value.
func MarshalMigration(m Migration) string {
	m.Started = m.Started.UTC().Truncate(time.Second)
	b, _ := json.Marshal(m) // a struct of strings and a time: cannot fail
	return string(b)
}

// ParseMigration reads the marker's value. A value it cannot read still
// marks a migration (fail safe: the CLI keeps to what the per-node agent
// serves); the error says what is wrong with it.
func ParseMigration(raw string) (Migration, error) {
	var m Migration
	if err := json.Unmarshal([]byte(strings.TrimSpace(raw)), &m); err != nil {
		return Migration{}, fmt.Errorf("migration marker %q is not the JSON hastate migration start writes (%v); it still marks a migration", cut(raw, 80), err)
	}
	return m, nil
}

// AgentWord reports whether the per-node agent of the runbook understands
// a state key's raw value: one of its four words, ready, drain, maint or
// N% (0..256), trimmed of surrounding whitespace. It answers nothing for
// anything else (a JSON value, a typo, a word in capitals), where hastate
// may answer.
func AgentWord(raw string) bool {
	switch s := strings.TrimSpace(raw); s {
	case "ready", "drain", "maint":
		return true
	default:
		n, ok := strings.CutSuffix(s, "%")
		if !ok || n == "" || strings.TrimLeft(n, "0123456789") != "" {
			return false
		}
		w, err := strconv.Atoi(n)
		return err == nil && w <= MaxWeight
	}
}

// Describe says when, by whom and why the migration was marked, for a
// line of status (empty parts left out): " since 2026-12-02 01:00:00 UTC
// by alice: gstg rollout".
func (m Migration) Describe() string {
	var s string
	if !m.Started.IsZero() {
		s = " since " + m.Started.UTC().Format("2006-01-02 15:04:05 UTC")
	}
	if m.By != "" {
		s += " by " + m.By
	}
	if m.Reason != "" {
		s += ": " + m.Reason
	}
	return s
}
