package state

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// TestAdoptionOf pins who may adopt a Consul: only a marker in the read
// itself, naming the cluster that holds it and the source recorded now.
func TestAdoptionOf(t *testing.T) {
	a := MirrorSource{ClusterID: "aaaa", Servers: "10.0.0.1:8300", Prefix: "hastate/"}
	b := MirrorSource{ClusterID: "bbbb", Servers: "10.0.9.1:8300", Prefix: "hastate/"}
	noConnect := MirrorSource{Servers: "10.0.7.1:8300", Prefix: "hastate/"}
	otherPrefix := MirrorSource{ClusterID: "aaaa", Servers: "10.0.0.1:8300", Prefix: "next/"}
	marker := func(cluster, replaces, prefix string) map[string]string {
		return map[string]string{"state/web/s1": "drain", AdoptKey: MarshalAdoption(Adoption{Cluster: cluster, ReplacesCluster: replaces, ReplacesPrefix: prefix, At: time.Unix(1, 0), By: "alice"})}
	}
	for _, tc := range []struct {
		name      string
		kv        map[string]string
		read, rec MirrorSource
		want      string // "" adopts; else a part of the error
	}{
		{"no marker", map[string]string{"state/web/s1": "drain"}, b, a, "no adoption marker"},
		{"marker for this cluster, replacing the record", marker("bbbb", "aaaa", "hastate/"), b, a, ""},
		{"by servers, for a Consul without Connect", marker("10.0.7.1:8300", "10.0.0.1:8300", "hastate/"), noConnect, a, ""},
		{"another prefix of the same cluster", marker("aaaa", "aaaa", "hastate/"), otherPrefix, a, ""},
		{"marker naming another cluster than the one holding it", marker("cccc", "aaaa", "hastate/"), b, a, "a marker adopts only the cluster that holds it"},
		{"marker written before another adoption (replaces another)", marker("bbbb", "cccc", "hastate/"), b, a, "written for another transition"},
		{"marker of a prefix move left behind", marker("aaaa", "aaaa", "old/"), otherPrefix, a, "written for another transition"},
		{"empty ID names nothing", marker("", "aaaa", "hastate/"), MirrorSource{Prefix: "hastate/"}, a, "lacks cluster"},
		{"not JSON", map[string]string{AdoptKey: "yes"}, b, a, "is not the JSON"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := AdoptionOf(tc.kv, tc.read, tc.rec)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("not adopted: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("AdoptionOf = %v, want an error containing %q", err, tc.want)
			}
		})
	}
	if _, err := AdoptionOf(nil, b, a); !errors.Is(err, ErrNoAdoption) {
		t.Errorf("no marker: %v, want ErrNoAdoption", err)
	}
}
