package leader

import (
	"strings"
	"testing"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/state"
)

// TestVerdict: a replica may mirror only the source recorded in raft; one
// that reads another cluster is told so (naming adopt-consul), one that
// cannot tell which Consul it reads may not mirror a recorded source, and
// with nothing recorded any source may; the wiring's own verdict wins
// when it is not ok.
func TestVerdict(t *testing.T) {
	a := state.MirrorSource{ClusterID: "aaaa", Datacenter: "dc1", Servers: "127.0.0.1:8300", Prefix: "hastate/"}
	b := state.MirrorSource{ClusterID: "bbbb", Datacenter: "dc1", Servers: "127.0.0.1:9300", Prefix: "hastate/"}
	otherPrefix := a
	otherPrefix.Prefix = "other/"
	for _, c := range []struct {
		name   string
		h      ConsulHealth
		rec    *state.MirrorSource
		reason api.MirrorReason
		detail string
	}{
		{"the recorded source", ConsulHealth{Reachable: true, Source: &a}, &a, api.MirrorOK, ""},
		{"another cluster", ConsulHealth{Reachable: true, Source: &b}, &a, api.MirrorOtherCluster, "adopt-consul"},
		{"another prefix", ConsulHealth{Reachable: true, Source: &otherPrefix}, &a, api.MirrorOtherPrefix, ""},
		{"no identity read yet, a source recorded", ConsulHealth{Reachable: true}, &a, api.MirrorConsulUnreachable, "identity"},
		{"nothing recorded", ConsulHealth{Reachable: true, Source: &b}, nil, api.MirrorOK, ""},
		{"Consul unreachable", ConsulHealth{Source: &a}, &a, api.MirrorConsulUnreachable, "cannot read Consul"},
		{"the wiring's verdict", ConsulHealth{Reachable: true, Source: &a, Verdict: api.MirrorVerdict{Reason: api.MirrorTokenCannotRead}}, &a, api.MirrorTokenCannotRead, ""},
	} {
		v := Verdict(c.h, c.rec)
		if v.Reason != c.reason || !strings.Contains(v.Detail, c.detail) {
			t.Errorf("%s: verdict %v (%s), want %s naming %q", c.name, v.Reason, v.Detail, c.reason, c.detail)
		}
	}
}
