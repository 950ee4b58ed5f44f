package kvsync

import "testing"

func TestIdentitySame(t *testing.T) {
	for _, tc := range []struct {
		a, b Identity
		same bool
	}{
		{Identity{Datacenter: "dc1", Cluster: "10.0.0.1:8300,10.0.0.2:8300"}, Identity{Datacenter: "dc1", Cluster: "10.0.0.1:8300,10.0.0.2:8300"}, true},
		{Identity{Datacenter: "dc1", Cluster: "10.0.0.1:8300,10.0.0.2:8300"}, Identity{Datacenter: "", Cluster: "10.0.0.2:8300,10.0.0.3:8300"}, true}, // a server replaced
		{Identity{Datacenter: "dc1", Cluster: "10.0.0.1:8300"}, Identity{Datacenter: "dc2", Cluster: "10.0.0.1:8300"}, false},
		{Identity{Datacenter: "dc1", Cluster: "10.0.0.1:8300"}, Identity{Datacenter: "dc1", Cluster: "10.0.1.1:8300"}, false},
		{Identity{Datacenter: "", Cluster: ""}, Identity{Datacenter: "", Cluster: ""}, false},
		// The cluster ID decides where both say it: a DR cluster restored
		// from a snapshot has other servers and the same ID; a fresh
		// cluster on the same addresses has another.
		{Identity{ClusterID: "a", Cluster: "10.0.0.1:8300"}, Identity{ClusterID: "a", Cluster: "10.9.0.1:8300"}, true},
		{Identity{ClusterID: "a", Cluster: "10.0.0.1:8300"}, Identity{ClusterID: "b", Cluster: "10.0.0.1:8300"}, false},
		{Identity{ClusterID: "a", Datacenter: "dc1"}, Identity{ClusterID: "a", Datacenter: "dc2"}, false},
		{Identity{ClusterID: "a", Cluster: "10.0.0.1:8300"}, Identity{Cluster: "10.0.0.1:8300"}, true},
	} {
		if got := tc.a.Same(tc.b); got != tc.same {
			t.Errorf("%v.Same(%v) = %v, want %v", tc.a, tc.b, got, tc.same)
		}
	}
}
