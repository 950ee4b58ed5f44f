package test

import (
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/internal/testenv"
)

// A cluster-wide read whose peer answers span several chunks, through real
// processes: with --peer-read-chunk 7, a replica reads a peer's 60 polls
// of 12 servers in 12 summaries (whole servers, 5 polls each) for
// /v1/state and `hastate status`, and in 9 chunks of polls for
// /v1/pollers. Every server is counted as polled and told by its 5
// HAProxy sources; one source that also polled a server through the
// replica asked (a load balancer's failover) counts once there.
func TestE2EPollersPeerReadInChunks(t *testing.T) {
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	hs := StartCluster(t, 3, HastateOptions{ConsulAddr: consul.Addr(), Args: []string{"--peer-read-chunk", "7"}})
	n1, n2 := hs[0], hs[1]
	// status warns (on stderr, in the output read here) until a leader
	// mirrored Consul.
	testenv.Eventually(t, 15*time.Second, func() error {
		var v api.StateView
		n2.GetJSON(t, "/v1/state", &v)
		return testenv.Expect(v.KV.Synced && v.KV.Warning == "", "n2 does not report KV synced yet")
	})
	const sources, servers = 5, 12
	pollFleet(t, n1.AgentAddr, sources, servers, 2, "ready 100%\n")
	// The failover: source 0 asks n2 for the first server too.
	var buf [64]byte
	for range 2 {
		if line, err := sourceDial(fleetSource(0), n2.AgentAddr, []byte(fleetServer(0)+"\n"), buf[:]); err != nil || string(line) != "ready 100%\n" {
			t.Fatalf("%s asking n2 for %s: %q, %v", fleetSource(0), fleetServer(0), line, err)
		}
	}

	check := func(rows []api.ServerState) error {
		if len(rows) != servers {
			return fmt.Errorf("%d servers, want %d", len(rows), servers)
		}
		for i, r := range rows {
			if name := r.Backend + "/" + r.Server; name != fleetServer(i) || r.Polled != sources || r.Told != sources {
				return fmt.Errorf("row %d: %s polled by %d, told %d; want %s polled and told by %d", i, name, r.Polled, r.Told, fleetServer(i), sources)
			}
		}
		return nil
	}
	var v api.StateView
	n2.GetJSON(t, "/v1/state?scope=cluster", &v)
	if err := check(v.Servers); err != nil {
		t.Fatalf("/v1/state?scope=cluster on n2: %v", err)
	}
	for _, a := range v.Replicas {
		if !a.Answered {
			t.Fatalf("/v1/state?scope=cluster on n2: replica %s did not answer: %s", a.ID, a.Error)
		}
	}
	var rows []api.ServerState
	out := n2.Operator().Run(t, "status", "-o", "json")
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("status -o json: %v\n%s", err, out)
	}
	if err := check(rows); err != nil {
		t.Fatalf("hastate status -o json through n2: %v", err)
	}

	// /v1/pollers pages (limit 25) over chunks of 7: every poll once.
	seen := map[string]int{}
	after := ""
	for page := 0; ; page++ {
		var pv api.PollersView
		n2.GetJSON(t, "/v1/pollers?scope=cluster&limit=25&after="+url.QueryEscape(after), &pv)
		for _, p := range pv.Pollers {
			seen[p.Backend+"/"+p.Server+" "+p.HAProxy+" "+p.Replica]++
		}
		if pv.Next == "" {
			break
		}
		if page > 10 {
			t.Fatalf("more than 10 pages of 25 for %d polls", sources*servers+1)
		}
		after = pv.Next
	}
	if len(seen) != sources*servers+1 {
		t.Fatalf("/v1/pollers?scope=cluster on n2: %d distinct polls, want %d", len(seen), sources*servers+1)
	}
	for k, n := range seen {
		if n != 1 || (strings.HasSuffix(k, " n2") != (k == fleetServer(0)+" "+fleetSource(0)+" n2")) {
			t.Fatalf("/v1/pollers?scope=cluster on n2: %q listed %d times (polls: %v)", k, n, seen)
		}
	}
}
