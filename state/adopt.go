package state

// This file holds the adoption marker: <prefix>config/adopt, written by
// `hastate adopt-consul` into the Consul cluster that is to be mirrored
// from now on (a restored, rebuilt or DR cluster). Adopting a Consul
// changes what every HAProxy is told, so it takes the same authority as a
// write to that Consul's prefix: a token that may write <prefix>config/
// (the shipped writer policy), proven to Consul by the write itself. The
// raft leader adopts a cluster only when its own read of that cluster,
// made with its read token and proven like any read, holds a marker that
// names that very cluster and the source recorded in raft now; no HTTP
// request to a replica adopts anything.

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// AdoptKey is the KV key, relative to the prefix, of the adoption marker.
const AdoptKey = "config/adopt"

// Adoption is the marker's value: the cluster to adopt (the one holding
// the marker), the source it replaces (what raft records when the marker
// is written), and who wrote it, when and why. Naming both makes the
// marker one transition: once adopted, the record is Cluster and the
// marker names a record that is gone, so it adopts nothing again, and a
// marker left in a cluster that is later recorded anew by another
// adoption does not take the mirror back to it.
type Adoption struct {
	// Cluster is the adopted cluster's ID (its servers, for a Consul
	// without Connect), as /v1/cluster consul shows it.
	Cluster string `json:"cluster"`
	// ReplacesCluster and ReplacesPrefix name the recorded source: its
	// cluster ID (its servers when it has none) and its prefix.
	ReplacesCluster string    `json:"replaces_cluster"`
	ReplacesPrefix  string    `json:"replaces_prefix"`
	At              time.Time `json:"at"`
	By              string    `json:"by,omitempty"`
	Reason          string    `json:"reason,omitempty"`
}

// SourceID is how an adoption marker names s: its cluster ID, or its
// servers for a Consul that says none.
func SourceID(s MirrorSource) string {
	if s.ClusterID != "" {
		return s.ClusterID
	}
	return s.Servers
}

// NamesSource reports whether id names s: its cluster ID or its servers.
func NamesSource(id string, s MirrorSource) bool {
	return id != "" && (id == s.ClusterID || id == s.Servers)
}

// MarshalAdoption renders the marker's value.
func MarshalAdoption(a Adoption) string {
	a.At = a.At.UTC().Truncate(time.Second)
	b, _ := json.Marshal(a) // strings and a time: cannot fail
	return string(b)
}

// ParseAdoption reads the marker's value.
func ParseAdoption(raw string) (Adoption, error) {
	var a Adoption
	if err := json.Unmarshal([]byte(strings.TrimSpace(raw)), &a); err != nil {
		return Adoption{}, fmt.Errorf("adoption marker %q is not the JSON hastate adopt-consul writes (%v)", cut(raw, 80), err)
	}
	if a.Cluster == "" || a.ReplacesCluster == "" || a.ReplacesPrefix == "" {
		return Adoption{}, fmt.Errorf("adoption marker %q lacks cluster, replaces_cluster or replaces_prefix (write it with hastate adopt-consul)", cut(raw, 80))
	}
	return a, nil
}

// ErrNoAdoption: the read holds no adoption marker.
var ErrNoAdoption = errors.New("no adoption marker")

// AdoptionOf decides whether a read from read, whose content is kv (keys
// relative to the prefix), adopts read in place of rec, the source
// recorded in raft: only when kv holds a marker that names read (the
// cluster that holds the marker) and rec (cluster and prefix). It returns
// the marker, or why not (ErrNoAdoption when there is none).
func AdoptionOf(kv map[string]string, read, rec MirrorSource) (Adoption, error) {
	raw, ok := kv[AdoptKey]
	if !ok {
		return Adoption{}, ErrNoAdoption
	}
	a, err := ParseAdoption(raw)
	switch {
	case err != nil:
		return Adoption{}, err
	case !NamesSource(a.Cluster, read):
		return a, fmt.Errorf("the adoption marker names cluster %q, but this Consul is %s: a marker adopts only the cluster that holds it", a.Cluster, read)
	case !NamesSource(a.ReplacesCluster, rec) || a.ReplacesPrefix != rec.Prefix:
		return a, fmt.Errorf("the adoption marker replaces cluster %q, prefix %q, but raft records %s: it was written for another transition (write it again with hastate adopt-consul)",
			a.ReplacesCluster, a.ReplacesPrefix, rec)
	}
	return a, nil
}
