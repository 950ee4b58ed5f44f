package state

import (
	"strings"
	"testing"
	"time"
)

func TestAgentWord(t *testing.T) {
	for raw, want := range map[string]bool{"ready": true, "drain": true, "maint": true, " maint\n": true, "0%": true, "256%": true,
		"257%": false, "%": false, "-1%": false, "Drain": false, `{"state":"drain"}`: false, "": false, "50": false, "1.5%": false} {
		if got := AgentWord(raw); got != want {
			t.Errorf("AgentWord(%q) = %v, want %v", raw, got, want)
		}
	}
}

func TestMigrationMarker(t *testing.T) {
	m := Migration{Started: time.Date(2026, 12, 2, 1, 0, 0, 500, time.FixedZone("x", 3600)), By: "alice", Reason: "gstg"}
	got, err := ParseMigration(MarshalMigration(m))
	if err != nil || !got.Started.Equal(m.Started.Truncate(time.Second)) || got.By != "alice" || got.Reason != "gstg" {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	if d := got.Describe(); d != " since 2026-12-02 00:00:00 UTC by alice: gstg" {
		t.Errorf("Describe = %q", d)
	}
	if _, err := ParseMigration("yes"); err == nil || !strings.Contains(err.Error(), "it still marks a migration") {
		t.Errorf("ParseMigration(yes) = %v", err)
	}
}

// TestMarkerIsNotAState: the marker is mirrored as data and never becomes
// a state key, an invalid key or an answer.
func TestMarkerIsNotAState(t *testing.T) {
	m := NewMirror()
	m.Apply(Change{Set: map[string]string{MigrationKey: MarshalMigration(Migration{Started: time.Now()}), "state/web/a": "drain"}})
	s := m.Snapshot()
	if es := s.Entries(); len(es) != 1 || es[0].Key != "state/web/a" {
		t.Fatalf("entries %+v, want state/web/a alone", es)
	}
	if raw, ok := m.Raw(MigrationKey); !ok || !strings.Contains(raw, "started") {
		t.Errorf("Raw(%s) = %q, %v", MigrationKey, raw, ok)
	}
	if got := string(s.Lookup([]byte("config/migration"), len("config"))); got != "ready 100%\n" {
		t.Errorf("a request for config/migration answers %q, as any unknown server", got)
	}
}
