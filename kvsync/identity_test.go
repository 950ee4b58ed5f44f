package kvsync

import "testing"

func TestIdentitySame(t *testing.T) {
	for _, tc := range []struct {
		a, b Identity
		same bool
	}{
		{Identity{"dc1", "10.0.0.1:8300,10.0.0.2:8300"}, Identity{"dc1", "10.0.0.1:8300,10.0.0.2:8300"}, true},
		{Identity{"dc1", "10.0.0.1:8300,10.0.0.2:8300"}, Identity{"", "10.0.0.2:8300,10.0.0.3:8300"}, true}, // a server replaced
		{Identity{"dc1", "10.0.0.1:8300"}, Identity{"dc2", "10.0.0.1:8300"}, false},
		{Identity{"dc1", "10.0.0.1:8300"}, Identity{"dc1", "10.0.1.1:8300"}, false},
		{Identity{"", ""}, Identity{"", ""}, false},
	} {
		if got := tc.a.Same(tc.b); got != tc.same {
			t.Errorf("%v.Same(%v) = %v, want %v", tc.a, tc.b, got, tc.same)
		}
	}
}
