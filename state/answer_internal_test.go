package state

import (
	"bytes"
	"testing"
)

// TestAnswerLine checks the shared wire lines against Answer.String,
// including weights no valid value can produce.
func TestAnswerLine(t *testing.T) {
	answers := []Answer{{Withheld: true}, {Admin: Drain}, {Admin: Maint}, {Admin: Ready, Weight: -1}, {Admin: Ready, Weight: 257}, {Admin: Ready, Weight: 1000}}
	for w := 0; w <= MaxWeight; w++ {
		answers = append(answers, Answer{Admin: Ready, Weight: w})
	}
	for _, a := range answers {
		line := *a.lineRef()
		if a.Withheld {
			if line != nil {
				t.Errorf("%+v.lineRef() = %q, want nil", a, line)
			}
			continue
		}
		if want := a.String() + "\n"; string(line) != want {
			t.Errorf("%+v.lineRef() = %q, want %q", a, line, want)
		}
		if bytes.IndexByte(line, '\n') != len(line)-1 {
			t.Errorf("%+v.lineRef() = %q: not one LF-terminated line", a, line)
		}
	}
}
