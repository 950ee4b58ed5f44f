package fleet

import (
	"fmt"
	"slices"
	"time"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl"
)

// RunbookNoLeader is the runbook section every command points to when the
// cluster has no raft leader.
const RunbookNoLeader = `docs/runbook.md, "HastateNoLeader"`

// NoLeader says what the status page says of a replica that knows no raft
// leader (ci.LeaderID empty): the cluster has lost its quorum (or is
// electing), nothing from Consul is applied, and HAProxy keeps each
// server's last state. It is ctl.ErrCannotConfirm (its words come first, as on the page); nil while the replica
// knows a leader. Settled is true once the replica itself has given up
// waiting for one (it withholds its answers as "leaderless", past
// --leaderless-grace): an ordinary election is over well before that, so
// a gate need not wait its whole --timeout for it.
func NoLeader(ci api.ClusterInfo) (settled bool, err error) {
	if ci.LeaderID != "" || ci.State == "leader" {
		return false, nil
	}
	during := ""
	if ci.LeaderlessSeconds > 0 {
		during = " for " + (time.Duration(ci.LeaderlessSeconds * float64(time.Second))).Round(time.Second).String()
	}
	settled = slices.Contains(ci.Withholding, "leaderless")
	what := "an election is under way, or the cluster lost its quorum"
	if settled {
		what = "the cluster has lost its quorum: two of three replicas down or cut off"
	}
	return settled, ctl.CannotConfirm(fmt.Errorf("no raft leader: replica %s has known no leader%s (%s); "+
		"no KV change and no ramp step is applied, every replica withholds its answers and HAProxy keeps each server's last state (the documented outage mode); "+
		"bring the missing replicas back: see %s", ci.NodeID, during, what, RunbookNoLeader))
}
