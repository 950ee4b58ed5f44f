package test

import (
	"strings"
	"testing"
	"time"

	"github.com/hastate/hastate/internal/testenv"
)

// Issue 27.4: an invalid <prefix>config/ramp is visible on every replica,
// not only on the one that leads: hastate_ramp_policy_invalid is 1
// through each of them, and `hastate status` and the status page, asked
// of a follower, name the key and why it is ignored.
func TestE2EInvalidRampPolicyIsVisibleOnEveryReplica(t *testing.T) {
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	hs := StartCluster(t, 3, HastateOptions{ConsulAddr: consul.Addr()})
	leader := WaitLeader(t, 10*time.Second, hs...)
	follower := others(hs, leader)[0]
	consul.Put(t, kvPrefix+"config/ramp", `{"interval":"0"}`)
	for _, h := range hs {
		testenv.Eventually(t, 10*time.Second, func() error {
			got := h.Metric(t, "hastate_ramp_policy_invalid")
			return testenv.Expect(got == 1, "%s: hastate_ramp_policy_invalid = %v, want 1", h.NodeID, got)
		})
	}
	op := Operator{ConsulAddr: consul.Addr(), Env: []string{"HASTATE_ADDR=" + follower.HTTPAddr}}
	out := op.Run(t, "status")
	if !strings.Contains(out, "invalid key config/ramp: invalid ramp policy") || !strings.Contains(out, "the --ramp-* flags apply") {
		t.Errorf("hastate status through follower %s does not show the invalid ramp policy:\n%s", follower.NodeID, out)
	}
	code, page, err := follower.get("/")
	if err != nil || code != 200 {
		t.Fatalf("GET / on %s: %d %v", follower.NodeID, code, err)
	}
	for _, want := range []string{"config/ramp", "ignored: the --ramp-* flags apply", "1 invalid key"} {
		if !strings.Contains(string(page), want) {
			t.Errorf("the status page of follower %s lacks %q", follower.NodeID, want)
		}
	}
	consul.Put(t, kvPrefix+"config/ramp", `{"interval":"5s"}`)
	for _, h := range hs {
		testenv.Eventually(t, 10*time.Second, func() error {
			got := h.Metric(t, "hastate_ramp_policy_invalid")
			return testenv.Expect(got == 0, "%s: hastate_ramp_policy_invalid = %v after the fix, want 0", h.NodeID, got)
		})
	}
	if out := op.Run(t, "status"); strings.Contains(out, "config/ramp") {
		t.Errorf("a valid ramp policy still shows in status:\n%s", out)
	}
}
