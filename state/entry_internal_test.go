package state

import "testing"

// Keys holding the same value share one copy of it, in the mirror and in
// a mirror restored from its snapshot, and an invalid value keeps the
// shared last one.
func TestEntriesShareTheirLastValue(t *testing.T) {
	const zonal = `{"state":"drain","reason":"zone b","by":"alice","at":"2026-11-30T10:00:00Z"}`
	m := NewMirror()
	m.ApplyAt(set("state/web/a", zonal, "state/api/b", zonal, "state/web/c", "drain", "state/api/d", "DRAIN"), t0, RampPolicy{})
	m.ApplyAt(set("state/web/a", "bad"), t0, RampPolicy{})
	for name, m := range map[string]*Mirror{"mirror": m, "restored": Restore(persisted(t, m))} {
		for _, pair := range [][2]string{{"state/web/a", "state/api/b"}, {"state/web/c", "state/api/d"}} {
			a, b := m.entry(pair[0]), m.entry(pair[1])
			if a.last != b.last {
				t.Errorf("%s: %s and %s hold %#v and %#v apart", name, pair[0], pair[1], a.Last(), b.Last())
			}
		}
		if e := m.entry("state/web/a"); e.Valid() || e.Last().Reason != "zone b" {
			t.Errorf("%s: state/web/a = %+v, want invalid, its last value the zonal drain", name, e)
		}
	}
}
