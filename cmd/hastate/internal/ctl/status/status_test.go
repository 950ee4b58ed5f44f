package status

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/fleet"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/internal/ctltest"
	"github.com/hastate/hastate/state"
)

// Issue 15.12: the value grammar is said once, not on every invalid row;
// UNTIL and a ramp's ETA have seconds and a zone; an expired row shows
// when it expired, and names the key in PROBLEM. Issue 15.3: 0% counts as
// out.
func TestStatusTable(t *testing.T) {
	until := time.Date(2026, 12, 1, 15, 4, 5, 0, time.UTC)
	bad := func(v string) string {
		_, err := state.ParseValue(v)
		return err.Error()
	}
	rows := []api.ServerState{
		{Backend: "w", Server: "a", Answer: "drain", Kind: api.KindDrain, Until: &until, Desired: "drain"},
		{Backend: "w", Server: "b", Answer: "ready 100%", Kind: api.KindReady, Weight: 100, Expired: "state/w/b", ExpiredAt: &until},
		{Backend: "w", Server: "c", Answer: "drain", Kind: api.KindDrain, Error: bad("drian"), Valid: false},
		{Backend: "w", Server: "d", Answer: "", Kind: api.KindWithheld, Withheld: true, Error: bad("300%")},
		{Backend: "w", Server: "e", Answer: "ready 0%", Kind: api.KindWeight, Weight: 0},
		{Backend: "w", Server: "f", Answer: "ready 40%", Kind: api.KindRamping, Weight: 40,
			Ramping: &api.RampProgress{WeightPercent: 40, ETA: until}},
		{Backend: "w", Server: "*", Answer: "maint", Kind: api.KindMaint},
	}
	var out strings.Builder
	if err := (Report{Rows: rows}).WriteTable(&out); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	if n := strings.Count(s, state.ValidForms); n != 1 {
		t.Errorf("the value grammar appears %d times, want once:\n%s", n, s)
	}
	stamp := regexp.QuoteMeta(until.Local().Format("Jan 2 15:04:05 MST"))
	for _, want := range []string{
		`(?m)^w +a +drain .*` + stamp,
		// Issue 35: an expired key is shown as expired, not as a problem,
		// and named once with the command that removes it.
		`(?m)^w +b .*expired ` + stamp + ` +0/0 *$`, // nothing in PROBLEM
		"(?m)^1 expired key \\(--for passed: hastate treats it as absent\\): state/w/b; `hastate clear --expired` removes it$",
		`(?m)^w +c .*invalid value "drian": not a known state`,
		`(?m)^w +e .*at 0%: HAProxy shows it as DRAIN`,
		`(?m)^w +f .*40% \(eta ` + regexp.QuoteMeta(until.Local().Format("15:04:05 MST")) + `\)`,
		`(?m)^2 of 6 servers in rotation \(of which 1 ramping\); out: 2 drain, 1 at 0% \(HAProxy shows DRAIN\), 1 withheld and never told \(HAProxy keeps its own state\)$`,
		`(?m)^w +d +\(withheld: HAProxy keeps its own state, never told\)`,
	} {
		if !regexp.MustCompile(want).MatchString(s) {
			t.Errorf("status table without %s:\n%s", want, s)
		}
	}
	if strings.Contains(s, "expired: state/") {
		t.Errorf("an expired row shows the key where the time belongs:\n%s", s)
	}
}

// Issue 27.3: a withheld server is answered nothing, so HAProxy keeps what
// it was last told: status says that answer and counts the server there.
func TestStatusCountsWithheldByWhatHAProxyKeeps(t *testing.T) {
	rows := []api.ServerState{
		{Backend: "w", Server: "a", Answer: "drain", Kind: api.KindDrain},
		{Backend: "w", Server: "b", Kind: api.KindWithheld, Withheld: true, Keeps: "ready 100%", Weight: 100, Polled: 2},
		{Backend: "w", Server: "c", Kind: api.KindWithheld, Withheld: true, Keeps: "drain", Polled: 2},
		{Backend: "w", Server: "d", Answer: "ready 100%", Kind: api.KindReady, Weight: 100},
	}
	var out strings.Builder
	if err := (Report{Rows: rows}).WriteTable(&out); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	for _, want := range []string{
		`(?m)^w +b +\(withheld: HAProxy keeps ready 100%\)`,
		`(?m)^w +c +\(withheld: HAProxy keeps drain\)`,
		`(?m)^2 of 4 servers in rotation; out: 2 drain; 2 withheld: HAProxy keeps the last answer it was told, counted there$`,
	} {
		if !regexp.MustCompile(want).MatchString(s) {
			t.Errorf("status table without %s:\n%s", want, s)
		}
	}
}

// Issue 27.12: the hint to delete a key no selector can name has the
// prefix when the command knows it.
func TestUnnamableKeyHintHasThePrefix(t *testing.T) {
	var out strings.Builder
	rep := Report{Prefix: "hastate/", InvalidKeys: []api.ServerState{{Key: "state/web/a/b", Source: "state/web/a/b", Error: "invalid key"}}}
	if err := rep.WriteTable(&out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "consul kv delete 'hastate/state/web/a/b'") {
		t.Errorf("status lists a nested key without its delete command:\n%s", out.String())
	}
}

// Issue 37 follow-up: status says which replicas cannot mirror Consul,
// and that nothing written to Consul is served when none can.
func TestMirrorWarning(t *testing.T) {
	member := func(id string, v *api.MirrorVerdict) api.MemberInfo {
		return api.MemberInfo{ID: id, Status: &api.PeerStatus{ID: id, ConsulReachable: true, Mirror: v}}
	}
	ok := &api.MirrorVerdict{Reason: api.MirrorOK}
	other := &api.MirrorVerdict{Reason: api.MirrorOtherCluster, Detail: "cluster ID b, recorded a"}
	denied := &api.MirrorVerdict{Reason: api.MirrorTokenCannotRead}
	silent := api.MemberInfo{ID: "n9"} // did not answer: not counted
	for _, c := range []struct {
		name    string
		members []api.MemberInfo
		want    string // a regexp; "" for no warning
	}{
		{"all can", []api.MemberInfo{member("n1", ok), member("n2", ok), silent}, ""},
		{"one cannot", []api.MemberInfo{member("n1", ok), member("n2", other), silent},
			`^1 replica cannot mirror Consul \(n2: other_cluster: cluster ID b, recorded a\): as leader it would apply nothing, and hands leadership to a replica that can; see docs/runbook.md`},
		{"none can", []api.MemberInfo{member("n1", denied), member("n2", other), silent},
			`^no replica can mirror Consul \(n1: token_cannot_read; n2: other_cluster: .*\): the leader applies nothing, so what is written to Consul is not served`},
	} {
		got := mirrorWarning(api.ClusterInfo{Members: c.members})
		if (c.want == "") != (got == "") || (c.want != "" && !regexp.MustCompile(c.want).MatchString(got)) {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}

// statusWarnings is what status.Read warns of, reading a replica whose
// /v1/cluster is ci and whose /v1/state is v.
func statusWarnings(t *testing.T, ci api.ClusterInfo, v *api.StateView) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/cluster":
			_ = json.NewEncoder(w).Encode(ci)
		case "/v1/haproxies":
			_ = json.NewEncoder(w).Encode(api.HAProxiesView{Recorded: true})
		default:
			_ = json.NewEncoder(w).Encode(v)
		}
	}))
	defer srv.Close()
	r, err := fleet.NewReplica(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	var warn strings.Builder
	if _, err := Read(context.Background(), Options{Replica: r, Warn: &warn}); err != nil {
		t.Fatalf("status: %v, want the table", err)
	}
	return warn.String()
}

// Issue 45: with Consul stopped, status printed two warnings, one of ~900
// characters repeating "dial tcp ... connection refused" per replica and
// pointing to "A replica cannot mirror Consul". One warning: the sync's
// age, that no replica reaches Consul (each distinct error once), and the
// runbook's "Consul is down".
func TestStatusWithConsulDownWarnsOnce(t *testing.T) {
	v := ctltest.Fleet()
	v.KV.Warning = "Consul not synced for 40s: the leader hs1 cannot read it"
	refused := "dial tcp 127.0.0.1:8500: connect: connection refused"
	ci := api.ClusterInfo{NodeID: "hs1", State: "leader", LeaderID: "hs1"}
	for _, id := range []string{"hs1", "hs2", "hs3"} {
		ci.Members = append(ci.Members, api.MemberInfo{ID: id, Status: &api.PeerStatus{Mirror: &api.MirrorVerdict{Reason: api.MirrorConsulUnreachable, Detail: refused}}})
	}
	warn := statusWarnings(t, ci, v)
	if n := strings.Count(warn, "warning:"); n != 1 || strings.Count(warn, refused) != 1 || !strings.Contains(warn, `see docs/runbook.md, "Consul is down"`) ||
		strings.Contains(warn, "A replica cannot mirror Consul") || !strings.Contains(warn, "Consul not synced for 40s") {
		t.Errorf("status with Consul down warns:\n%s\nwant one warning, the error once, pointing to \"Consul is down\"", warn)
	}
	// One replica cut off from Consul is not "Consul is down".
	ci.Members[1].Status = &api.PeerStatus{Mirror: &api.MirrorVerdict{Reason: api.MirrorOK}}
	ci.Members[2].Status = &api.PeerStatus{Mirror: &api.MirrorVerdict{Reason: api.MirrorOK}}
	v.KV.Warning = ""
	if warn := statusWarnings(t, ci, v); strings.Contains(warn, "Consul is down") || !strings.Contains(warn, "A replica cannot mirror Consul") {
		t.Errorf("status with one replica cut off from Consul warns:\n%s", warn)
	}
}

// Issue 45: status straight to the replica that survived a lost quorum
// showed a normal table, a Consul warning and "the replicas that are up
// decide". It says first what the status page says: no raft leader, what
// HAProxy does meanwhile, the runbook section; and nothing that pretends
// the replicas that are up decide.
func TestStatusSaysThereIsNoLeaderFirst(t *testing.T) {
	v := ctltest.Fleet()
	v.KV.Warning = "Consul not synced for 40s: the leader has not reported"
	v.Replicas = []api.ReplicaAnswer{{ID: "n1", Error: "dial tcp 127.0.0.1:1: connection refused"}, {ID: "n2", Error: "dial tcp 127.0.0.1:2: connection refused"}, {ID: "n3", Answered: true}}
	ci := api.ClusterInfo{NodeID: "n3", State: "candidate", LeaderlessSeconds: 30, Withholding: []string{"leaderless"}}
	warn := statusWarnings(t, ci, v)
	first, _, _ := strings.Cut(warn, "\n")
	if !strings.HasPrefix(first, "warning: no raft leader: replica n3 has known no leader for 30s (the cluster has lost its quorum") ||
		!strings.Contains(first, "HAProxy keeps each server's last state") || !strings.Contains(first, fleet.RunbookNoLeader) {
		t.Errorf("status does not say first that there is no leader:\n%s", warn)
	}
	if s := warn; strings.Contains(s, "the replicas that are up decide") || strings.Contains(s, "Consul not synced") {
		t.Errorf("status without a leader says what is not so (the replicas that are up decide, Consul is to blame):\n%s", s)
	}
}
