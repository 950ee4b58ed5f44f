package test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/hastate/hastate/internal/testenv"
)

// TestE2ENothingAnOperatorWritesCrashesTheCluster: issue 7's report, run as
// it happened, then a dozen more nonsense ramp policies, per-key ramp values
// of every wrong kind, keys of odd shape and a 500 KB value. Before the fix,
// the first three writes panicked every replica in raft's apply, and again
// at every restart. Now each bad value is refused where it is parsed: every
// replica stays up, keeps answering, and keeps following KV.
func TestE2ENothingAnOperatorWritesCrashesTheCluster(t *testing.T) {
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	hs := StartCluster(t, 3, HastateOptions{ConsulAddr: consul.Addr(),
		Args: []string{"--ramp-duration", "1m", "--ramp-interval", "1s"}})
	const policy = kvPrefix + "config/ramp"
	const srv = "web/a"

	// The report, verbatim.
	consul.Put(t, policy, `{"duration":"0","interval":"0"}`)
	consul.Put(t, stateKey(srv), `{"state":"drain","ramp":"10m"}`)
	waitAll(t, hs, srv, "drain")
	consul.Put(t, stateKey(srv), `{"state":"ready","ramp":"10m"}`)
	// The invalid policy is ignored: the flags' policy ramps with the
	// key's 10m duration.
	waitAll(t, hs, srv, "ready 10%")
	leader := WaitLeader(t, 10*time.Second, hs...)
	if !leader.LogContains(t, "ignoring invalid ramp policy in KV") {
		t.Error("the leader did not log the invalid ramp policy")
	}
	if got := leader.Metric(t, "hastate_ramp_policy_invalid"); got != 1 {
		t.Errorf("hastate_ramp_policy_invalid = %v on the leader, want 1", got)
	}

	policies := []string{
		`{"interval":"0"}`, `{"interval":"-1s"}`, `{"interval":"1ns"}`, `{"interval":"1ms"}`,
		`{"duration":"-5m"}`, `{"duration":"100000h"}`, `{"duration":"999999999999h"}`, `{"duration":5}`,
		`{"start":"500%"}`, `{"start":-1}`, `{"start":"lots"}`, `{"aggression":0}`, `{"aggression":-1}`,
		`{"aggression":"fast"}`, `{"interval":true}`, `not json`, `[1,2]`, `{"duration":"5m"`, `null`,
	}
	rampValues := []string{`"0"`, `"-5m"`, `"99999h"`, `"abc"`, `600`, `true`, `{"d":"1m"}`, `""`, `null`, `"1ns"`, `"24h1s"`}
	for i, p := range policies {
		consul.Put(t, policy, p)
		r := rampValues[i%len(rampValues)]
		consul.Put(t, stateKey(srv), fmt.Sprintf(`{"state":"drain","ramp":%s}`, r))
		consul.Put(t, stateKey(srv), fmt.Sprintf(`{"state":"ready","ramp":%s}`, r))
		consul.Put(t, stateKey(srv), "drain")
		waitAll(t, hs, srv, "drain")
		consul.Put(t, stateKey(srv), fmt.Sprintf(`{"state":"ready","ramp":%s}`, r))
		// A valid ramp value ramps, an invalid one keeps the last
		// valid value (drain); either way every replica answers.
		for _, h := range hs {
			if a := h.Ask(t, srv); a == "" {
				t.Fatalf("policy %s, ramp %s: %s gave no answer", p, r, h.NodeID)
			}
		}
	}

	// Keys of odd shape. Which of them Consul stores depends on how it was
	// built: a release (and scripts/ensure-consul.sh, built with Consul's
	// own go line) answers 404 to an empty path segment ("state//a") and
	// 400 to control and format characters; built with Go 1.26's GODEBUG
	// defaults it redirects "state//a" to the cleaned "state/a" and stores
	// that. A key Consul refuses can never reach hastate: the test logs it
	// and checks the keys Consul did store (the FSM fuzz test covers any
	// key). invalid: hastate must list the key among its invalid keys.
	type oddKey struct {
		key, value string
		invalid    bool
	}
	odd := []oddKey{
		{kvPrefix + "state/web", "drain", true},                                 // no server part
		{kvPrefix + "state/web/a/b", "drain", true},                             // extra slash
		{kvPrefix + "state//a", "drain", true},                                  // empty backend
		{kvPrefix + "state/web/", "drain", true},                                // empty server
		{kvPrefix + "state/" + strings.Repeat("b", 600) + "/a", "drain", false}, // long, but a key
		{kvPrefix + "state/we\x01b/a\x7f", "drain", true},                       // control characters
		{kvPrefix + "state/web/tab\tnl\n", "drain", true},                       // tab and newline
		{kvPrefix + "state/we b/a\u200b", "drain", false},                       // a space, a format character
		{kvPrefix + "state/wéb/☃%2F..%00", "drain", false},                      // odd, but a key
		{kvPrefix + "state", "drain", false},                                    // the state folder itself
		{kvPrefix, "drain", false},                                              // the prefix itself
		{kvPrefix + "state/web/big", strings.Repeat("x", 500<<10), true},        // a 500 KB value
		{kvPrefix + "state/web/bigjson", `{"state":"drain","reason":"` + strings.Repeat("r", 400<<10) + `"}`, false},
	}
	kv := consul.Client(t).KV()
	before, _, err := kv.Keys(kvPrefix, "", nil)
	var keys []string
	if err != nil {
		t.Fatalf("list %s: %v", kvPrefix, err)
	}
	putErr := map[string]error{}
	for _, o := range odd {
		_, putErr[o.key] = kv.Put(&api.KVPair{Key: o.key, Value: []byte(o.value)}, nil)
	}
	// What Consul stored, by exact name: a 200 is not enough, the key may
	// have been stored under a cleaned name.
	keys, _, err = kv.Keys(kvPrefix, "", nil)
	if err != nil {
		t.Fatalf("list %s: %v", kvPrefix, err)
	}
	stored := map[string]bool{}
	for _, k := range keys {
		stored[k] = true
	}
	var wantInvalid []string
	reached := 0
	for _, o := range odd {
		if putErr[o.key] == nil && stored[o.key] {
			reached++
		}
		switch {
		case putErr[o.key] != nil:
			t.Logf("Consul refuses the key %q (%v): a key Consul refuses can never reach hastate", o.key, putErr[o.key])
		case !stored[o.key]:
			t.Logf("Consul answered the write of %q but did not store that key: it can never reach hastate", o.key)
		case o.invalid:
			wantInvalid = append(wantInvalid, strings.TrimPrefix(o.key, kvPrefix))
		}
	}
	for _, k := range keys {
		if !slices.Contains(before, k) && !slices.ContainsFunc(odd, func(o oddKey) bool { return o.key == k }) {
			t.Logf("Consul stored %q instead (a cleaned name of one of the keys above)", k)
		}
	}
	if len(wantInvalid) < 4 {
		t.Fatalf("Consul stored only %v of the invalid keys: the test proves too little", wantInvalid)
	}
	// The cluster still follows KV and every replica answers it.
	consul.Put(t, stateKey("web/ctl"), "maint")
	waitAll(t, hs, "web/ctl", "maint")
	waitAll(t, hs, "web/bigjson", "drain")
	for _, h := range hs {
		if a := h.Ask(t, "web/big"); a != "" {
			t.Errorf("%s answers %q for a key whose only value is invalid, want no answer", h.NodeID, a)
		}
		if got := h.Metric(t, "hastate_fsm_apply_errors_total"); got != 0 {
			t.Errorf("%s: hastate_fsm_apply_errors_total = %v: a bad value reached the raft log", h.NodeID, got)
		}
		var v stateView
		h.GetJSON(t, "/v1/state?limit=100000", &v)
		listed := map[string]bool{}
		for _, ik := range v.InvalidKeys {
			listed[ik.Key] = true
		}
		for _, k := range wantInvalid {
			if !listed[k] {
				t.Errorf("%s does not list %q among its %d invalid keys", h.NodeID, k, len(v.InvalidKeys))
			}
		}
		if code, _ := h.Readiness(t); code != 200 {
			t.Errorf("%s: readiness %d", h.NodeID, code)
		}
	}
	t.Logf("Consul stored %d of the %d odd keys; every replica lists the %d invalid ones among them: %q", reached, len(odd), len(wantInvalid), wantInvalid)

	// Every replica restarts over its log and comes back serving.
	for _, h := range hs {
		h.Restart(t)
	}
	for _, h := range hs {
		h.WaitReady(t)
	}
	waitAll(t, hs, "web/ctl", "maint")
	consul.Put(t, stateKey("web/ctl"), "drain")
	waitAll(t, hs, "web/ctl", "drain")
}

// waitAll waits until every replica answers server with want.
func waitAll(t testing.TB, hs []*Hastate, server, want string) {
	t.Helper()
	if _, err := waitAllAnswer(hs, server, want, 15*time.Second); err != nil {
		t.Fatal(err)
	}
}

// TestE2EConsulStoppedSaysSoEverywhere: with Consul stopped, every replica
// (not only the leader) says so within 10s: the cluster-wide metrics, the
// readiness body and `hastate status` on stderr; and it keeps serving.
func TestE2EConsulStoppedSaysSoEverywhere(t *testing.T) {
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	hs := StartCluster(t, 3, HastateOptions{ConsulAddr: consul.Addr()})
	op := hs[0].Operator("--allow-unknown") // no HAProxy polls
	op.Run(t, "drain", "be_cs/web1")
	waitAll(t, hs, "be_cs/web1", "drain")
	// A follower hears the leader's report within a second.
	for _, h := range hs {
		var rd Readiness
		testenv.Eventually(t, 5*time.Second, func() error {
			_, rd = h.Readiness(t)
			return testenv.Expect(rd.KV.Warning == "" && h.Metric(t, "hastate_kv_reachable") == 1, "%s with Consul up: %+v", h.NodeID, rd.KV)
		})
		if age := h.Metric(t, "hastate_kv_sync_age_seconds"); age > 5 {
			t.Errorf("%s: hastate_kv_sync_age_seconds = %v with Consul up", h.NodeID, age)
		}
	}

	consul.Kill()
	stopped := time.Now()
	seen := map[string]time.Duration{}
	testenv.Eventually(t, 10*time.Second, func() error {
		for _, h := range hs {
			if _, ok := seen[h.NodeID]; ok {
				continue
			}
			code, rd := h.Readiness(t)
			status, _ := h.Operator().RunCode(t, "status")
			if code == 200 && h.Metric(t, "hastate_kv_reachable") == 0 &&
				strings.Contains(rd.Detail, "Consul not synced for") && strings.Contains(rd.KV.Warning, "Consul not synced for") &&
				strings.Contains(status, "warning: Consul not synced for") {
				seen[h.NodeID] = time.Since(stopped)
			}
		}
		return testenv.Expect(len(seen) == len(hs), "only %v said Consul is lost", seen)
	})
	t.Logf("Consul stopped: metrics, readiness and hastate status said so after %v", seen)
	for _, h := range hs {
		if a := h.Ask(t, "be_cs/web1"); a != "drain" {
			t.Errorf("%s answers %q with Consul down, want the last state (drain)", h.NodeID, a)
		}
	}
}
