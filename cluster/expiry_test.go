package cluster

import (
	"testing"
	"time"

	"github.com/hastate/hastate/internal/testenv"
)

// The leader expires a state whose "until" passed: every replica then
// answers as if the key were absent, with no KV write.
func TestLeaderExpiresStatesOnEveryReplica(t *testing.T) {
	nodes := startCluster(t, nil)
	testenv.Eventually(t, 10*time.Second, func() error { return testenv.Expect(leaderOf(nodes) != nil, "no leader") })
	until := time.Now().Add(time.Second).UTC().Format(time.RFC3339)
	kv := map[string]string{"state/web/a": `{"state":"drain","until":"` + until + `"}`, "state/web/b": "maint"}
	applyOnLeader(t, nodes, 1, kv)
	for _, n := range nodes {
		testenv.Eventually(t, 5*time.Second, func() error {
			return testenv.Expect(answer(n.Node, "web/a") == "drain\n", "%s never answered drain", n.opts.ID)
		})
	}
	for _, n := range nodes {
		testenv.Eventually(t, 5*time.Second, func() error {
			return testenv.Expect(answer(n.Node, "web/a") == "ready 100%\n", "%s still answers %q after the until", n.opts.ID, answer(n.Node, "web/a"))
		})
		if a := answer(n.Node, "web/b"); a != "maint\n" {
			t.Errorf("%s: web/b %q, want maint", n.opts.ID, a)
		}
		if r := n.Snapshot().Resolve("web", "a"); r.Expired == nil {
			t.Errorf("%s does not mark web/a expired", n.opts.ID)
		}
	}
}
