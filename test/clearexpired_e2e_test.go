package test

import (
	"strings"
	"testing"
	"time"

	"github.com/hastate/hastate/internal/testenv"
)

// TestE2EClearExpiredBackendWide: a backend-wide drain --for expires on a
// real replica; status shows it expired (no problem) and names `hastate
// clear --expired`, which deletes the backend-wide key and its meta key in
// one transaction; the answers do not change (issue 35).
func TestE2EClearExpiredBackendWide(t *testing.T) {
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	hs := StartCluster(t, 1, HastateOptions{ConsulAddr: consul.Addr(), Args: []string{"--ramp-duration", "0"}})
	StartHAProxyLB(t, hs, Backend{Name: "shop", Servers: []string{"s1", "s2"}})
	op := hs[0].Operator()
	testenv.Eventually(t, 20*time.Second, func() error {
		_, code := op.RunCode(t, "status", "shop/s2")
		return testenv.Expect(code == 0, "HAProxy has not polled shop/s2 yet")
	})
	op.Run(t, "drain", "shop/*", "--reason", "expiring", "--for", "2s")
	testenv.Eventually(t, 20*time.Second, func() error {
		out := op.Run(t, "status", "shop")
		return testenv.Expect(strings.Contains(out, "1 expired key (--for passed: hastate treats it as absent): state/shop/*; `hastate clear --expired` removes it"),
			"status does not show the expired backend-wide key:\n%s", out)
	})
	for _, s := range []string{"shop/s1", "shop/s2"} {
		if got := hs[0].Ask(t, s); got != "ready 100%" {
			t.Fatalf("%s answers %q after the expiry, want ready 100%%", s, got)
		}
	}
	out := op.Run(t, "clear", "--expired", "shop")
	if !strings.Contains(out, "1 expired key (with their meta keys) deleted in one Consul transaction") || !strings.Contains(out, "delete "+kvPrefix+"state/shop/* (drain, expired ") {
		t.Fatalf("clear --expired shop:\n%s", out)
	}
	t.Logf("clear --expired:\n%s", out)
	for _, k := range []string{"state/shop/*", "meta/shop/*"} {
		if p, _, err := consul.Client(t).KV().Get(kvPrefix+k, nil); err != nil || p != nil {
			t.Errorf("%s after clear --expired: %+v %v", k, p, err)
		}
	}
	testenv.Consistently(t, 3*time.Second, func() error {
		for _, s := range []string{"shop/s1", "shop/s2"} {
			if got := hs[0].Ask(t, s); got != "ready 100%" {
				return testenv.Expect(false, "%s answers %q after clear --expired, want ready 100%% (unchanged)", s, got)
			}
		}
		return nil
	})
	if out := op.Run(t, "status", "shop"); strings.Contains(out, "expired") {
		t.Errorf("status after clear --expired:\n%s", out)
	}
}
