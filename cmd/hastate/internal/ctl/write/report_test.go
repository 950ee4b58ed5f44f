package write

import (
	"strings"
	"testing"
)

// Issue 27.13: counts agree with what they count.
func TestWriteReportCounts(t *testing.T) {
	var out strings.Builder
	p := Plan{Command: "drain", Written: true, Ops: []Op{{Key: "hastate/state/web/a", Value: `{"state":"drain","by":"alice"}`}}}
	p.Report(&out)
	if first := strings.SplitN(out.String(), "\n", 2)[0]; first != "drain: 1 key (2 operations: with its meta key) written in one Consul transaction:" {
		t.Errorf("header %q", first)
	}
	out.Reset()
	p.Ops = append(p.Ops, Op{Delete: true, Key: "hastate/state/web/b"})
	p.Report(&out)
	if first := strings.SplitN(out.String(), "\n", 2)[0]; first != "drain: 2 keys (4 operations: state keys with their meta keys) written in one Consul transaction:" {
		t.Errorf("header %q", first)
	}
}
