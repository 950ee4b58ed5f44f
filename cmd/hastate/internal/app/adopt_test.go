package app

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/state"
	"go.uber.org/zap/zaptest"
)

// fakeMirror is the node as the leader's Sink sees it: it refuses a read
// from another source than the recorded one, as cluster.Node does, and
// records adoptions.
type fakeMirror struct {
	rec     state.MirrorSource
	applied []state.KVRead
	adopted []string
	refuse  error // Adopt's error
}

var _ mirrorNode = (*fakeMirror)(nil)

func (f *fakeMirror) ApplyRead(_ context.Context, r state.KVRead) error {
	if v := api.SourceVerdict(*r.Source, f.rec); !v.CanMirror() {
		return &api.MirrorError{Verdict: v}
	}
	f.applied = append(f.applied, r)
	return nil
}

func (f *fakeMirror) RecordedSource() *state.MirrorSource { s := f.rec; return &s }

func (f *fakeMirror) Adopt(_ context.Context, src state.MirrorSource, want string) (*state.MirrorSource, error) {
	if f.refuse != nil {
		return nil, f.refuse
	}
	old := f.rec
	f.rec, f.adopted = src, append(f.adopted, want)
	return &old, nil
}

// TestLeaderAdoptsOnlyByTheMarkerInItsOwnRead (issue 43): the leader
// adopts the Consul it reads only when that read holds a marker naming it
// and the recorded source; a read without one, or with a marker for
// another transition, is refused as another cluster's and adopts nothing.
func TestLeaderAdoptsOnlyByTheMarkerInItsOwnRead(t *testing.T) {
	a := state.MirrorSource{ClusterID: "aaaa", Servers: "10.0.0.1:8300", Prefix: "hastate/"}
	b := state.MirrorSource{ClusterID: "bbbb", Servers: "10.0.9.1:8300", Prefix: "hastate/"}
	marker := func(cluster, replaces string) string {
		return state.MarshalAdoption(state.Adoption{Cluster: cluster, ReplacesCluster: replaces, ReplacesPrefix: "hastate/", At: time.Unix(1, 0)})
	}
	for _, tc := range []struct {
		name   string
		kv     map[string]string
		refuse error
		adopt  bool
	}{
		{"no marker", map[string]string{"state/web/s1": "ready"}, nil, false},
		{"a marker naming this cluster and the record", map[string]string{"state/web/s1": "drain", state.AdoptKey: marker("bbbb", "aaaa")}, nil, true},
		{"a marker naming another cluster", map[string]string{state.AdoptKey: marker("cccc", "aaaa")}, nil, false},
		{"a marker replacing another record", map[string]string{state.AdoptKey: marker("bbbb", "cccc")}, nil, false},
		{"the node refuses (level)", map[string]string{state.AdoptKey: marker("bbbb", "aaaa")}, errors.New("adopt refused: level 2"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := &fakeMirror{rec: a, refuse: tc.refuse}
			s := &adoptingSink{n: n, log: zaptest.NewLogger(t)}
			err := s.ApplyRead(t.Context(), state.KVRead{Index: 9, KV: tc.kv, Source: &b})
			var me *api.MirrorError
			switch {
			case tc.adopt && (err != nil || len(n.applied) != 1 || n.rec != b):
				t.Fatalf("not adopted: %v; applied %d reads, records %s", err, len(n.applied), n.rec)
			case !tc.adopt && (!errors.As(err, &me) || me.Verdict.Reason != api.MirrorOtherCluster || len(n.applied) != 0 || n.rec != a):
				t.Fatalf("adopted or applied without a valid marker: %v; applied %d reads, records %s", err, len(n.applied), n.rec)
			}
		})
	}
	// A read of the recorded cluster is applied as it is, whatever marker
	// it holds (one left behind adopts nothing again).
	n := &fakeMirror{rec: b}
	s := &adoptingSink{n: n, log: zaptest.NewLogger(t)}
	if err := s.ApplyRead(t.Context(), state.KVRead{Index: 9, KV: map[string]string{state.AdoptKey: marker("bbbb", "aaaa")}, Source: &b}); err != nil || len(n.adopted) != 0 {
		t.Errorf("a read of the recorded cluster: %v, adopted %v", err, n.adopted)
	}
}
