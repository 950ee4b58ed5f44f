package app

import (
	"testing"
	"time"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/kvsync"
)

// TestIdentityReadFailureCannotMirror (issue 43): a replica whose Consul
// answers the probe but whose identity read fails cannot tell which
// cluster it reads, and its watch applies nothing; it must not report
// that it can mirror, or every replica in that state takes leadership in
// turn every --kv-failover-after, withholding all the while.
func TestIdentityReadFailureCannotMirror(t *testing.T) {
	since := time.Date(2026, 12, 7, 3, 0, 0, 0, time.UTC)
	ok := kvsync.ProbeHealth{Reachable: true, Verdict: api.MirrorVerdict{Reason: api.MirrorOK}}
	token := kvsync.ProbeHealth{Verdict: api.MirrorVerdict{Reason: api.MirrorTokenCannotRead, Detail: "403"}}
	read := &api.ConsulIdentity{ClusterID: "52191f9d", Cluster: "10.0.0.1:8300"}
	failed := &api.ConsulIdentity{ClusterID: "52191f9d", Cluster: "10.0.0.1:8300", Error: "read the Consul servers (/v1/status/peers): 500", FailingSince: since}
	for _, tc := range []struct {
		name  string
		probe kvsync.ProbeHealth
		id    *api.ConsulIdentity
		want  api.MirrorReason
	}{
		{"probe not run yet", kvsync.ProbeHealth{}, read, api.MirrorConsulUnreachable},
		{"probe ok, identity read", ok, read, api.MirrorOK},
		{"probe ok, identity never read yet (the node compares nil with the record)", ok, nil, api.MirrorOK},
		{"probe ok, last identity read failed (the last good one kept)", ok, failed, api.MirrorConsulUnreachable},
		{"the probe's own reason first", token, failed, api.MirrorTokenCannotRead},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := mirrorVerdict(tc.probe, tc.id)
			if v.Reason != tc.want {
				t.Fatalf("verdict %v, want %s", v, tc.want)
			}
			if tc.id == failed && v.Reason == api.MirrorConsulUnreachable && !v.Since.Equal(since) {
				t.Errorf("since %v, want the first failed identity read %v (the failover's timer)", v.Since, since)
			}
		})
	}
}
