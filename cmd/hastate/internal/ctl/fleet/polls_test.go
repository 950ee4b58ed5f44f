package fleet_test

import (
	"testing"
	"time"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/fleet"
)

func TestLatestPollsCountsHAProxyNotProbes(t *testing.T) {
	now := time.Now()
	pv := api.PollersView{Pollers: []api.Poll{
		{HAProxy: "10.0.0.1", Backend: "web", Server: "a", LastAsked: now.Add(-time.Second), Answer: "drain", Count: 40, Replica: "r1"},
		{HAProxy: "10.0.0.1", Backend: "web", Server: "a", LastAsked: now.Add(-2 * time.Second), Answer: "ready 100%", Count: 40, Replica: "r2"},
		{HAProxy: "10.0.0.9", Backend: "web", Server: "a", LastAsked: now.Add(-30 * time.Second), Count: 1, Replica: "r1"}, // nc
		{HAProxy: "10.0.0.1", Backend: "web", Server: "b", LastAsked: now, Count: 40},
	}}
	got := fleet.LatestPolls(pv, map[string]bool{"web/a": true})
	if len(got) != 1 || got[[2]string{"web/a", "10.0.0.1"}].Answer != "drain" {
		t.Fatalf("%+v: want the latest poll of 10.0.0.1 for web/a only", got)
	}
}
