package test

// Issue 32: Consul with ACLs on and default deny, as production runs it,
// with the policies hastate ships (deploy/terraform/policies, rendered as
// Terraform renders them). Consul hides what a token may not read; for
// the anonymous token it lists the prefix as empty. These tests show that
// no replica ever answers from such a listing: every answer is the state
// in Consul or nothing, and readiness names the token.

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/internal/testenv"
)

// aclFleet is the desired state the ACL tests hold in Consul: drained and
// maint servers, one by a backend-wide key, and one ready (no key).
var aclFleet = map[string]string{
	"web/s1": "drain",
	"web/s2": "maint",
	"web/s3": "ready 100%",
	"api/a1": "drain", // by api/*
	"api/a2": "drain", // by api/*
}

// aclConsul starts Consul with ACLs on and default deny and returns it
// with the shipped read and writer tokens.
func aclConsul(t *testing.T) (*testenv.Consul, testenv.Token, testenv.Token) {
	t.Helper()
	c := testenv.StartConsul(t, testenv.ConsulOptions{ACL: true})
	read, writer := c.ShippedTokens(t, kvPrefix)
	return c, read, writer
}

// tokenFile writes secret to a fresh file and returns its path.
func tokenFile(t *testing.T, secret string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "token")
	writeToken(t, p, secret)
	return p
}

// writeToken replaces the file's content at once (a rename), as the
// kubelet updates a Secret volume.
func writeToken(t *testing.T, path, secret string) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// writer is the operator of replica h with the shipped writer token.
func writer(h *Hastate, tok testenv.Token) Operator {
	o := h.Operator("--allow-unknown")
	o.Env = append(o.Env, "CONSUL_HTTP_TOKEN="+tok.SecretID)
	return o
}

// setACLFleet writes aclFleet through the CLI with the writer token and
// waits until every replica answers it.
func setACLFleet(t *testing.T, hs []*Hastate, w Operator) {
	t.Helper()
	w.Run(t, "drain", "web/s1", "--reason", "acl test")
	w.Run(t, "maint", "web/s2")
	w.Run(t, "drain", "api/*")
	for s, want := range aclFleet {
		if _, err := waitAllAnswer(hs, s, want, 30*time.Second); err != nil {
			t.Fatal(err)
		}
	}
}

// fleetPollers ask every replica for every server of a fleet in a loop, as
// HAProxy does, and sort each answer: the state in Consul (ok), nothing
// (withheld: refused, closed without an answer), or anything else (wrong).
// They also keep the longest run of withheld answers per (replica, server).
type fleetPollers struct {
	stop chan struct{}
	wg   sync.WaitGroup

	mu                   sync.Mutex
	want                 map[string]string
	ok, wrong, withheld  int
	wrongs               []string
	since                map[string]time.Time // first withheld answer of the current run, by replica/server
	longest              time.Duration
	longestAt, longestOf string
}

func startFleetPollers(hs []*Hastate, want map[string]string) *fleetPollers {
	p := &fleetPollers{stop: make(chan struct{}), want: want, since: map[string]time.Time{}}
	for _, h := range hs {
		for s := range want {
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				tickUntil(p.stop, 20*time.Millisecond, func() { p.poll(h, s) })
			}()
		}
	}
	return p
}

func (p *fleetPollers) poll(h *Hastate, server string) {
	kind, ans, _ := probeAgent(h.AgentAddr, server)
	now := time.Now()
	key := h.NodeID + " " + server
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case kind == probeAnswered && ans == p.want[server]:
		p.ok++
		if s, ok := p.since[key]; ok {
			if d := now.Sub(s); d > p.longest {
				p.longest, p.longestAt, p.longestOf = d, s.Format("15:04:05.000"), key
			}
			delete(p.since, key)
		}
	case kind == probeAnswered:
		p.wrong++
		if len(p.wrongs) < 10 {
			p.wrongs = append(p.wrongs, fmt.Sprintf("%s %s answered %q for %s, Consul holds %q", now.Format("15:04:05.000"), h.NodeID, ans, server, p.want[server]))
		}
	default:
		p.withheld++
		if _, ok := p.since[key]; !ok {
			p.since[key] = now
		}
	}
}

// Counts returns the answers so far.
func (p *fleetPollers) Counts() (ok, wrong, withheld int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ok, p.wrong, p.withheld
}

// resetLongest forgets the withheld runs so far (a test restarts replicas
// on purpose before it measures).
func (p *fleetPollers) resetLongest() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.since, p.longest, p.longestAt, p.longestOf = map[string]time.Time{}, 0, "", ""
}

// Stop stops the pollers and fails the test for any wrong answer.
func (p *fleetPollers) Stop(t *testing.T) (ok, wrong, withheld int) {
	t.Helper()
	close(p.stop)
	p.wg.Wait()
	ok, wrong, withheld = p.Counts()
	if wrong != 0 {
		t.Errorf("%d wrong answers (answers other than the state in Consul, or nothing):\n%s", wrong, strings.Join(p.wrongs, "\n"))
	}
	return ok, wrong, withheld
}

// waitTokenProblem waits until h's readiness names the token problem.
func waitTokenProblem(t *testing.T, h *Hastate, wantReady bool) string {
	t.Helper()
	var detail string
	testenv.Eventually(t, 30*time.Second, func() error {
		code, body, err := h.get("/-/readiness")
		if err != nil {
			return fmt.Errorf("%s readiness: %v", h.NodeID, err)
		}
		var rd Readiness
		if err := json.Unmarshal(body, &rd); err != nil {
			return fmt.Errorf("%s readiness %q: %v", h.NodeID, body, err)
		}
		detail = rd.Detail
		return testenv.Expect((code == 200) == wantReady && strings.Contains(rd.Detail, "the Consul token cannot read "+kvPrefix),
			"%s readiness %d %q: want ready=%t naming the token", h.NodeID, code, rd.Detail, wantReady)
	})
	return detail
}

// A replica with no token, and then the whole cluster restarted without
// its token, while servers are drained and in maint: every answer is the
// state in Consul or nothing; readiness, /v1/cluster and the metric name
// the token; a leader without a token hands leadership to one with it;
// a new replica without a token and without state answers nothing and is
// not ready.
func TestE2EACLReplicasWithoutTokenNeverGuess(t *testing.T) {
	consul, read, writerTok := aclConsul(t)
	file := tokenFile(t, read.SecretID)
	hs := StartCluster(t, 3, HastateOptions{ConsulAddr: consul.Addr(),
		Args: []string{"--consul-token-file", file, "--kv-failover-after", "3s"}})
	leader := WaitLeader(t, 30*time.Second, hs...)
	setACLFleet(t, hs, writer(leader, writerTok))
	polls := startFleetPollers(hs, aclFleet)

	// 1. One follower restarted without a token: it serves raft's state
	// and says it could not mirror; as leader it would apply nothing.
	var bare *Hastate
	for _, h := range hs {
		if h != leader {
			bare = h
		}
	}
	bare.AddArgs("--consul-token-file", "")
	bare.Restart(t)
	bare.WaitReady(t)
	d := waitTokenProblem(t, bare, true)
	t.Logf("follower without a token: readiness %q", d)
	var ci ClusterInfo
	bare.GetJSON(t, "/v1/cluster", &ci)
	if ci.ConsulToken == nil || ci.ConsulToken.Source != "none" || ci.ConsulToken.Problem == nil ||
		ci.ConsulToken.Problem.AccessorID != "00000000-0000-0000-0000-000000000002" || ci.Mirror == nil || ci.Mirror.Reason != api.MirrorTokenCannotRead {
		t.Errorf("/v1/cluster of the replica without a token: consul_token %+v, mirror %+v", ci.ConsulToken, ci.Mirror)
	}
	if v := bare.Metric(t, "hastate_consul_token_denied"); v != 1 {
		t.Errorf("hastate_consul_token_denied = %v on the replica without a token", v)
	}

	// Make it leader. A SIGTERM hands leadership only to a replica that
	// can mirror, so the leader is killed instead, until the election
	// falls on the replica without a token. It applies nothing, then hands
	// leadership at once to a replica whose token can read (it may lead
	// for less than a poll of WaitLeader: its log says it led).
	if l := WaitLeader(t, 30*time.Second, hs...); l != bare {
		l.Restart(t)
		l.WaitReady(t)
		if l := WaitLeader(t, 30*time.Second, hs...); l == bare {
			t.Errorf("a SIGTERM handed leadership to %s, whose token cannot read", bare.NodeID)
		}
	}
	for i := 0; ; i++ {
		l := WaitLeader(t, 30*time.Second, hs...)
		if l == bare || bare.LogContains(t, "handing leadership to a follower that can") {
			break
		}
		if i == 12 {
			t.Fatalf("leadership never moved to %s", bare.NodeID)
		}
		l.Kill()
		WaitLeader(t, 30*time.Second, others(hs, l)...)
		l.Start(t)
		l.WaitReady(t)
	}
	t.Logf("%s (no token) led", bare.NodeID)
	testenv.Eventually(t, 30*time.Second, func() error {
		l := WaitLeader(t, 30*time.Second, hs...)
		return testenv.Expect(l != bare, "leadership still with %s, whose token cannot read", bare.NodeID)
	})
	if !bare.LogContains(t, "handing leadership to a follower that can") {
		t.Errorf("%s did not log the hand-over", bare.NodeID)
	}
	polls.waitFor(t, 200)

	// 2. The whole cluster restarted without its token (a broken Secret
	// reference): every replica holds the last state, answers it, and
	// says the token cannot read; the leader applies nothing.
	for _, h := range hs {
		h.AddArgs("--consul-token-file", "")
		if code, _ := h.Stop(t); code != 0 {
			t.Fatalf("%s exited %d", h.NodeID, code)
		}
	}
	StartAll(t, hs...)
	polls.waitFor(t, 500)
	for _, h := range hs {
		waitTokenProblem(t, h, true)
	}
	l := WaitLeader(t, 30*time.Second, hs...)
	var rd Readiness
	_, rd = l.Readiness(t)
	if w := watch(rd); w.TokenProblem == nil || w.LastErrorReason != api.MirrorTokenCannotRead {
		t.Errorf("leader %s watch: %+v, want the token problem", l.NodeID, w)
	}
	if !l.LogContains(t, "holds the last state until the token may read the prefix") {
		t.Errorf("leader %s did not log that it holds the state for the token", l.NodeID)
	}
	for _, h := range hs {
		// hastate status (its warning) and the status page name it too.
		if out := h.Operator().Run(t, "status"); !strings.Contains(out, "the Consul token cannot read "+kvPrefix) {
			t.Errorf("hastate status on %s does not name the token:\n%s", h.NodeID, out)
		}
		if code, page, err := h.get("/"); err != nil || code != 200 || !strings.Contains(string(page), "the Consul token cannot read "+kvPrefix) {
			t.Errorf("status page of %s (HTTP %d, %v) does not name the token", h.NodeID, code, err)
		}
	}
	testenv.Consistently(t, 3*time.Second, func() error {
		_, wrong, _ := polls.Counts()
		return testenv.Expect(wrong == 0, "wrong answers while no replica has a token")
	})

	// 3. A replica without a token and without state (a new cluster of
	// one on the same Consul): nothing answered, not ready, saying why.
	fresh := NewHastate(t, HastateOptions{ConsulAddr: consul.Addr(), NodeID: "fresh"})
	fresh.Start(t)
	waitTokenProblem(t, fresh, false)
	for s := range aclFleet {
		if kind, ans, _ := probeAgent(fresh.AgentAddr, s); kind == probeAnswered {
			t.Errorf("a replica without state or token answered %q for %s", ans, s)
		}
	}
	fresh.Kill()

	// 4. The token back: the leader mirrors Consul again.
	for _, h := range hs {
		h.AddArgs("--consul-token-file", file)
		h.Restart(t)
		h.WaitReady(t)
	}
	testenv.Eventually(t, 30*time.Second, func() error {
		for _, h := range hs {
			if _, rd := h.Readiness(t); strings.Contains(rd.Detail, "token cannot read") {
				return fmt.Errorf("%s still names the token: %s", h.NodeID, rd.Detail)
			}
		}
		return nil
	})
	ok, wrong, withheld := polls.Stop(t)
	t.Logf("answers checked %d: %d the state in Consul, %d wrong, %d withheld (replicas restarting, catching up)", ok+wrong+withheld, ok, wrong, withheld)
}

// logTime is the time of a zap JSON log line.
func logTime(t *testing.T, line string) time.Time {
	t.Helper()
	var l struct{ TS string }
	if err := json.Unmarshal([]byte(line), &l); err != nil {
		t.Fatalf("log line %q: %v", line, err)
	}
	at, err := time.Parse("2006-01-02T15:04:05.000Z0700", l.TS)
	if err != nil {
		t.Fatalf("log line %q: ts: %v", line, err)
	}
	return at
}

// waitFor waits until n more answers were checked.
func (p *fleetPollers) waitFor(t *testing.T, n int) {
	t.Helper()
	ok, wrong, withheld := p.Counts()
	want := ok + wrong + withheld + n
	testenv.Eventually(t, 30*time.Second, func() error {
		ok, wrong, withheld := p.Counts()
		return testenv.Expect(ok+wrong+withheld >= want, "answers checked %d, want %d", ok+wrong+withheld, want)
	})
}

// The token rotated while HAProxy-like pollers ask every replica: the new
// token is written into each replica's token file (as the kubelet updates
// a Secret volume), every replica switches to it without a restart, the
// old token is revoked, and a change written afterwards is served: 0
// wrong answers, none withheld longer than one sync; the log and the
// metrics show the switch.
func TestE2EACLTokenRotation(t *testing.T) {
	consul, oldTok, writerTok := aclConsul(t)
	files := make([]string, 3)
	var args [][]string
	for i := range files {
		files[i] = tokenFile(t, oldTok.SecretID)
		args = append(args, []string{"--consul-token-file", files[i]})
	}
	hs := NewCluster(t, 3, HastateOptions{ConsulAddr: consul.Addr()})
	for i, h := range hs {
		h.AddArgs(args[i]...)
	}
	StartAll(t, hs...)
	leader := WaitLeader(t, 30*time.Second, hs...)
	w := writer(leader, writerTok)
	setACLFleet(t, hs, w)
	for _, h := range hs {
		testenv.Eventually(t, 10*time.Second, func() error {
			var ci ClusterInfo
			h.GetJSON(t, "/v1/cluster", &ci)
			return testenv.Expect(ci.ConsulToken != nil && ci.ConsulToken.AccessorID == oldTok.AccessorID, "%s names accessor %+v", h.NodeID, ci.ConsulToken)
		})
	}
	want := map[string]string{}
	for k, v := range aclFleet {
		want[k] = v
	}
	polls := startFleetPollers(hs, want)
	polls.waitFor(t, 300)

	newTok := consul.CreateToken(t, "hastate replicas, rotated", "hastate-read")
	rotated := time.Now()
	for _, f := range files {
		writeToken(t, f, newTok.SecretID)
	}
	var switched time.Duration
	for _, h := range hs {
		testenv.Eventually(t, 10*time.Second, func() error {
			var ci ClusterInfo
			h.GetJSON(t, "/v1/cluster", &ci)
			return testenv.Expect(ci.ConsulToken != nil && ci.ConsulToken.AccessorID == newTok.AccessorID, "%s names accessor %+v", h.NodeID, ci.ConsulToken)
		})
		line := h.LogLine(t, "Consul token changed")
		if line == "" {
			t.Fatalf("%s logged no switch", h.NodeID)
		}
		at := logTime(t, line)
		switched = max(switched, at.Sub(rotated))
		if v := h.Metric(t, "hastate_consul_token_changes_total"); v != 1 {
			t.Errorf("%s hastate_consul_token_changes_total = %v, want 1", h.NodeID, v)
		}
		if v := h.Metric(t, fmt.Sprintf(`hastate_consul_token_info{accessor_id=%q,source="file"}`, newTok.AccessorID)); v != 1 {
			t.Errorf("%s hastate_consul_token_info for the new accessor = %v, want 1", h.NodeID, v)
		}
	}
	consul.DeleteToken(t, oldTok)
	revoked := time.Now()
	polls.waitFor(t, 3000)
	for _, h := range hs {
		if v := h.Metric(t, "hastate_consul_token_denied"); v != 0 || h.Metric(t, "hastate_kv_probe_reachable") != 1 {
			t.Errorf("%s: hastate_consul_token_denied = %v, probe reachable %v after the revocation", h.NodeID, v, h.Metric(t, "hastate_kv_probe_reachable"))
		}
	}
	ok, wrong, withheld := polls.Stop(t)

	// A change after the revocation is served: the leader reads with the
	// new token.
	w.Run(t, "weight", "50%", "web/s3")
	seen, err := waitAllAnswer(hs, "web/s3", "ready 50%", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// One sync: the leader's watch answers within --kv-wait (10s); a
	// withheld run is bounded by far less when nothing restarts.
	if polls.longest > 10*time.Second {
		t.Errorf("an answer was withheld for %s (%s from %s), longer than one sync", polls.longest, polls.longestOf, polls.longestAt)
	}
	t.Logf("rotation: answers checked %d, wrong %d, withheld %d (longest run %s), time to switch (file written to the last replica's log line) %s, "+
		"old token revoked %s after the rotation; a weight written after it served by every replica %s after the revocation",
		ok+wrong+withheld, wrong, withheld, polls.longest.Round(time.Millisecond), switched.Round(time.Millisecond),
		revoked.Sub(rotated).Round(time.Millisecond), seen.Sub(revoked).Round(time.Millisecond))
}

// The shipped policies are enough and necessary: a replica with the read
// token runs (ready, mirroring, its agent's datacenter read), every
// documented command runs with the writer token, and a write with the
// read token, with no token or with a token on another prefix exits 5
// naming the rule that would allow it, writing nothing, meta keys
// included.
func TestE2EACLShippedPoliciesLetEveryCommandThrough(t *testing.T) {
	consul, read, writerTok := aclConsul(t)
	h := StartHastate(t, HastateOptions{ConsulAddr: consul.Addr(), Args: []string{"--consul-token-file", tokenFile(t, read.SecretID)}})
	var ci ClusterInfo
	h.GetJSON(t, "/v1/cluster", &ci)
	if ci.Mirror == nil || !ci.Mirror.CanMirror() || ci.ConsulToken == nil || ci.ConsulToken.Problem != nil {
		t.Errorf("replica with the read token: mirror %+v, token %+v", ci.Mirror, ci.ConsulToken)
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		h.GetJSON(t, "/v1/cluster", &ci)
		return testenv.Expect(ci.Consul != nil && ci.Consul.Datacenter == "dc1" && ci.Consul.Error == "",
			"the read token reads the agent's datacenter (agent_prefix read): %+v", ci.Consul)
	})
	w := writer(h, writerTok)
	steps := []struct {
		args []string
		code int
		want string // in Consul afterwards, "" nothing checked
	}{
		{[]string{"drain", "web/s1", "--reason", "acl", "--for", "1h"}, 0, "state/web/s1=drain"},
		{[]string{"weight", "50%", "web/s2"}, 0, "state/web/s2=50%"},
		{[]string{"maint", "web/s3"}, 0, "state/web/s3=maint"},
		{[]string{"ready", "web/s3"}, 0, ""},
		{[]string{"clear", "web/s2"}, 0, ""},
		{[]string{"drain", "web/s4", "--ramp", "1m"}, 0, "state/web/s4=drain"},
		{[]string{"drain", "api/*"}, 0, "state/api/*=drain"},
		{[]string{"ready", "api/a1"}, 0, "state/api/a1=ready"},
		{[]string{"drain", "api/*", "--override"}, 0, "state/api/*=drain"},
		{[]string{"precheck", "web/s1"}, 1, ""},
		{[]string{"weight", "100%", "web/s6"}, 0, "state/web/s6=100%"},
		{[]string{"precheck", "web/s6"}, 0, ""},
		{[]string{"wait", "web/s1", "--settled"}, 0, ""},
		{[]string{"status"}, 0, ""},
		{[]string{"status", "-o", "json"}, 0, ""},
		{[]string{"clear", "web/s1"}, 0, ""},
		{[]string{"clear", "web/s4"}, 0, ""},
		{[]string{"clear", "api/*"}, 0, ""},
		{[]string{"clear", "web/s6"}, 0, ""},
		{[]string{"migration", "start", "--reason", "acl"}, 0, "config/migration"},
		{[]string{"migration", "status"}, 0, ""},
		{[]string{"drain", "web/s5"}, 0, "state/web/s5=drain"},
		{[]string{"migration", "finish"}, 0, ""},
	}
	for _, s := range steps {
		out := w.RunExit(t, s.code, s.args...)
		if strings.Contains(out, "permission") {
			t.Errorf("hastate %s with the writer token: %s", strings.Join(s.args, " "), out)
		}
		if s.want == "" {
			continue
		}
		kv := consulKV(t, consul)
		k, v, _ := strings.Cut(s.want, "=")
		if got, ok := kv[k]; !ok || (v != "" && got != v) {
			t.Errorf("after hastate %s: Consul %s = %q (present %t), want %q", strings.Join(s.args, " "), k, got, ok, v)
		}
		if strings.HasPrefix(k, "state/") {
			if _, ok := kv["meta/"+strings.TrimPrefix(k, "state/")]; !ok && !strings.HasPrefix(s.args[0], "migration") {
				t.Errorf("after hastate %s: no meta key beside %s", strings.Join(s.args, " "), k)
			}
		}
	}

	// Refused: one exit code, the rule named, nothing written.
	consul.CreatePolicy(t, "other", `key_prefix "elsewhere/" { policy = "write" }`)
	other := consul.CreateToken(t, "another prefix", "other")
	before := consulKV(t, consul)
	for _, tc := range []struct {
		name, secret, rule string
	}{
		{"the read token", read.SecretID, `key_prefix "hastate/state/" { policy = "write" }`},
		{"no token", "", `key_prefix "hastate/" { policy = "list" }`},
		{"a token on another prefix", other.SecretID, `key_prefix "hastate/" { policy = "list" }`},
	} {
		op := h.Operator("--allow-unknown")
		if tc.secret != "" {
			op.Env = append(op.Env, "CONSUL_HTTP_TOKEN="+tc.secret)
		}
		for _, args := range [][]string{{"drain", "web/s3", "--reason", "refused"}, {"drain", "api/*"}, {"migration", "start"}} {
			out := op.RunExit(t, 5, args...)
			rule := tc.rule
			if args[0] == "migration" && tc.secret == read.SecretID {
				rule = `key_prefix "hastate/config/" { policy = "write" }`
			}
			if !strings.Contains(out, "permission denied") || !strings.Contains(out, rule) || !strings.Contains(out, "nothing was written") {
				t.Errorf("%s: hastate %s: %s\nwant permission denied naming %s and nothing written", tc.name, strings.Join(args, " "), out, rule)
			}
			if tc.secret != "" && strings.Contains(out, tc.secret) {
				t.Errorf("%s: the output names the secret", tc.name)
			}
		}
	}
	if after := consulKV(t, consul); !maps.Equal(before, after) {
		t.Errorf("refused writes changed Consul: before %v, after %v", before, after)
	}
}
