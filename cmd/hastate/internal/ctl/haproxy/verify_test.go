package haproxy

import (
	"errors"
	"strings"
	"testing"

	"github.com/hastate/hastate/cmd/hastate/internal/ctl"
)

// verify's verdict is decided on what each problem is, counted where it
// is found, not on its text (issue 27.16).
func TestVerifyVerdict(t *testing.T) {
	if err := (VerifyReport{Servers: 1, Instances: 1}).Err(); err != nil {
		t.Errorf("no problem: %v", err)
	}
	unconfirmed := VerifyReport{Problems: []string{"web/a on HAProxy h: its newest sample is old"}}
	if err := unconfirmed.Err(); !errors.Is(err, ctl.ErrCannotConfirm) || errors.Is(err, ctl.ErrNotDone) {
		t.Errorf("only what it cannot confirm: %v, want ErrCannotConfirm", err)
	}
	disagrees := VerifyReport{Problems: []string{"web/a on HAProxy h: cannot confirm: x", "web/b on HAProxy h: reports UP"}, Disagreements: 1, Servers: 2, Instances: 1}
	err := disagrees.Err()
	if !errors.Is(err, ctl.ErrNotDone) || !strings.Contains(err.Error(), "2 servers on 1 HAProxy instance;") {
		t.Errorf("a disagreement: %v, want ErrNotDone with the summary", err)
	}
}

// Issue 45: rows whose samples predate the change are pending, and the
// summary says so (not "HAProxy does not agree").
func TestVerifyVerdictPending(t *testing.T) {
	rep := VerifyReport{Problems: []string{"web/a on HAProxy h: pending: reports UP weight 100"}, Pending: 1, Servers: 1, Instances: 1}
	err := rep.Err()
	if !errors.Is(err, ctl.ErrCannotConfirm) || !strings.Contains(err.Error(), "cannot confirm yet: 1 row is pending") || strings.Contains(err.Error(), "does not agree") {
		t.Errorf("only pending rows: %v", err)
	}
}
