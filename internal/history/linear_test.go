package history

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/anishathalye/porcupine"
)

// lwrites: be/a drain written 100..120, then ready 40% 200..220; be/b's
// maint began at 150 and never was seen served (pending).
func lwrites() []Write {
	return []Write{
		{Server: "be/a", Answer: "drain", Began: at(100), Ended: at(120), By: "cli"},
		{Server: "be/a", Answer: "ready 40%", Began: at(200), Ended: at(220), By: "consul"},
		{Server: "be/b", Answer: "maint", Began: at(150), By: "consul"},
	}
}

func TestLinearizable(t *testing.T) {
	cases := []struct {
		name    string
		answers []Answer
		want    porcupine.CheckResult
		failing string
	}{
		{"in order", []Answer{ask("p1", "be/a", 50, Absent), ask("p2", "be/a", 130, "drain"), ask("p1", "be/a", 230, "ready 40%")}, porcupine.Ok, ""},
		{"during a write either value", []Answer{ask("p1", "be/a", 101, Absent), ask("p2", "be/a", 102, "drain"), ask("p1", "be/a", 200, "drain"), ask("p2", "be/a", 201, "ready 40%")}, porcupine.Ok, ""},
		// The old checker's own test accepted this (two pollers, each in
		// order): p2 sees the older value 5ms after p1's check of the newer
		// one ended.
		{"another poller older after a newer one", []Answer{ask("p1", "be/a", 205, "ready 40%"), ask("p2", "be/a", 215, "drain")}, porcupine.Illegal, "be/a"},
		{"stale after a completed write", []Answer{ask("p1", "be/a", 230, "drain")}, porcupine.Illegal, "be/a"},
		{"back to the initial value", []Answer{ask("p1", "be/a", 130, "drain"), ask("p1", "be/a", 140, Absent)}, porcupine.Illegal, "be/a"},
		{"a pending write, seen late", []Answer{ask("p1", "be/b", 140, Absent), ask("p1", "be/b", 900, "maint")}, porcupine.Ok, ""},
		{"a pending write, never seen", []Answer{ask("p1", "be/b", 900, Absent)}, porcupine.Ok, ""},
		{"a pending write, then not again", []Answer{ask("p1", "be/b", 300, "maint"), ask("p2", "be/b", 400, Absent)}, porcupine.Illegal, "be/b"},
		{"a value before its write began", []Answer{ask("p1", "be/b", 100, "maint")}, porcupine.Illegal, "be/b"},
		{"empty answers are no operation", []Answer{ask("p1", "be/a", 230, ""), ask("p1", "be/a", 240, "ready 40%")}, porcupine.Ok, ""},
		{"a value never written", []Answer{ask("p1", "be/c", 10, "drain")}, porcupine.Illegal, "be/c"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := Linearizable(lwrites(), c.answers, 0)
			if r.Result != c.want {
				t.Fatalf("%s, want %s", r, c.want)
			}
			if got := strings.Join(r.Failing, ","); got != c.failing {
				t.Errorf("failing servers %q, want %q", got, c.failing)
			}
			if r.Writes != 3 || r.Pending != 1 {
				t.Errorf("%s: want 3 writes, 1 pending", r)
			}
		})
	}
}

// TestLinearVisualize: a failing history's visualisation is an HTML page
// naming the operations.
func TestLinearVisualize(t *testing.T) {
	r := Linearizable(lwrites(), []Answer{ask("p1", "be/a", 230, "drain")}, 0)
	if r.Ok() {
		t.Fatalf("%s: want not linearizable", r)
	}
	path := filepath.Join(t.TempDir(), "artifacts", "history.html")
	if err := r.Visualize(path); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "<html") || !strings.Contains(string(b), "be/a: read") {
		t.Errorf("visualisation %s does not look like porcupine's page (%d bytes)", path, len(b))
	}
}
