package testenv

import (
	"bytes"
	"os"
	"testing"
)

// Lines reads the file at path (a fixture under testdata/) as one item
// per line, without the line breaks; empty lines are skipped.
func Lines(t testing.TB, path string) [][]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for _, l := range bytes.Split(b, []byte("\n")) {
		if len(l) > 0 {
			out = append(out, l)
		}
	}
	return out
}
