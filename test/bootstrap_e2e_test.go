package test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hastate/hastate/internal/testenv"
)

// bootstrapLine is what a replica logs when it bootstraps a new cluster.
const bootstrapLine = `"msg":"raft bootstrapped"`

// logCount counts the lines of the replica's log (all its runs) holding s.
func (h *Hastate) logCount(t testing.TB, s string) int {
	t.Helper()
	return len(h.logLines(t, s))
}

// oneCluster waits until every replica is in one raft cluster: the same
// leader and term on all, three members each, and the same KV content.
func oneCluster(t *testing.T, hs []*Hastate) (leader string, term uint64) {
	t.Helper()
	var last string
	testenv.Eventually(t, 30*time.Second, func() error {
		c0, err := hs[0].clusterInfo()
		if err != nil {
			return err
		}
		for _, h := range hs {
			c, err := h.clusterInfo()
			if err != nil {
				return err
			}
			last = fmt.Sprintf("%s: leader %q term %d members %d digest %.12s", h.NodeID, c.LeaderID, c.Term, len(c.Members), c.KVDigest)
			if c.LeaderID == "" || c.LeaderID != c0.LeaderID || c.Term != c0.Term || len(c.Members) != len(hs) || c.KVDigest != c0.KVDigest || !c.HoldsState {
				return fmt.Errorf("not one cluster yet: %s (%s: leader %q term %d)", last, hs[0].NodeID, c0.LeaderID, c0.Term)
			}
		}
		leader, term = c0.LeaderID, c0.Term
		return nil
	})
	return leader, term
}

// stopAll stops every replica with SIGTERM.
func stopAll(t *testing.T, hs ...*Hastate) {
	t.Helper()
	for _, h := range hs {
		if code, took := h.Stop(t); code != 0 {
			t.Fatalf("%s exited with %d after SIGTERM (took %s)", h.NodeID, code, took)
		}
	}
}

// TestE2ESplitBrainRefused: replicas with no raft state never form a
// second cluster from one --peers list (real processes over real TCP).
//
//  1. All three stopped; two lose their disks and start while the third,
//     which holds the cluster, is still down. They do not bootstrap and
//     say, in /-/readiness, their log and a metric, which peer they wait
//     for. The third starts: one cluster, one leader, one term, its state.
//  2. All three stopped; one loses its disk; all start: the empty one
//     joins the two that hold state.
//  3. All three stopped; two lose their disks and reach the third through
//     a link that delays every answer by 2s: the slow peer is waited for,
//     not taken for an empty one. One cluster.
func TestE2ESplitBrainRefused(t *testing.T) {
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	hs := NewCluster(t, 3, HastateOptions{ConsulAddr: consul.Addr()})
	fn := newFaultNet()
	slow := fn.Link(t, "slow-n3", hs[2].RaftAddr)
	StartAll(t, hs...)
	// No HAProxy polls be_sb: the typo guard is lifted by name.
	op := hs[0].Operator("--allow-unknown")
	op.Run(t, "drain", "be_sb/web1")
	for _, h := range hs {
		h.WaitAnswer(t, "be_sb/web1", "drain")
	}
	holder, empty := hs[2], hs[:2]
	bootstraps := func(h *Hastate) int { return h.logCount(t, bootstrapLine) }

	// 1. The holder is down while the empty ones start.
	stopAll(t, hs...)
	// Written while the cluster is down: no replica can be asked.
	hs[0].Operator("--allow-unknown", "--allow-no-replica").Run(t, "maint", "be_sb/web2")
	before := map[*Hastate]int{}
	for _, h := range empty {
		loseDisk(t, h)
		before[h] = bootstraps(h)
		h.Start(t)
	}
	started := time.Now()
	for _, h := range empty {
		testenv.Eventually(t, 15*time.Second, func() error {
			code, body, err := h.get("/-/readiness")
			return testenv.Expect(err == nil && code == 503 && strings.Contains(string(body), "waiting for "+holder.NodeID+" unreachable"),
				"%s: /-/readiness %d %s %v does not say it waits for %s", h.NodeID, code, body, err, holder.NodeID)
		})
		if v := h.Metric(t, `hastate_raft_bootstrap_waiting{peer="`+holder.NodeID+`"}`); v != 1 {
			t.Errorf("%s: hastate_raft_bootstrap_waiting{peer=%q} = %v, want 1", h.NodeID, holder.NodeID, v)
		}
		if !h.LogContains(t, `"waiting_for":["`+holder.NodeID+`"]`) {
			t.Errorf("%s does not log that it waits for %s", h.NodeID, holder.NodeID)
		}
	}
	consistently(t, 5*time.Second, func() bool {
		for _, h := range empty {
			if c, err := h.clusterInfo(); err != nil || c.Term != 0 || c.LeaderID != "" || bootstraps(h) != before[h] {
				return false
			}
		}
		return true
	}, func() string {
		return "a replica with an empty data dir bootstrapped or elected while the peer holding the cluster was down"
	})
	_, rd := empty[0].Readiness(t)
	t.Logf("1: two empty replicas waited %s without bootstrapping; readiness: %q", time.Since(started).Round(time.Millisecond), rd.Detail)
	holder.Start(t)
	for _, h := range hs {
		h.WaitReady(t)
		h.WaitAnswer(t, "be_sb/web2", "maint")
	}
	leader, term := oneCluster(t, hs)
	for _, h := range empty {
		if n := bootstraps(h); n != before[h] {
			t.Errorf("1: %s bootstrapped (%d times)", h.NodeID, n-before[h])
		}
	}
	t.Logf("1: the holder started: one cluster, leader %s, term %d on all three", leader, term)

	// 2. One empty replica, two holding state, all started at once.
	stopAll(t, hs...)
	lost := hs[0]
	loseDisk(t, lost)
	before[lost] = bootstraps(lost)
	StartAll(t, hs...)
	leader, term = oneCluster(t, hs)
	if n := bootstraps(lost); n != before[lost] {
		t.Errorf("2: %s with an empty data dir bootstrapped", lost.NodeID)
	}
	if got := lost.Answers(t, "be_sb/web1", "be_sb/web2"); got["be_sb/web1"] != "drain" || got["be_sb/web2"] != "maint" {
		t.Errorf("2: %s answers %v", lost.NodeID, got)
	}
	t.Logf("2: the empty replica joined the two holding state: leader %s, term %d on all three", leader, term)

	// 3. The holder answers slowly: 2s on every answer to the empty ones.
	// Its own dials to them are refused until the end, so that only their
	// probes can tell them that it holds the cluster (else its first vote
	// request would, and the probe's timeout would not matter).
	stopAll(t, hs...)
	if _, err := slow.p.Toxics.AddToxicJson(strings.NewReader(`{"name":"slow","type":"latency","stream":"downstream","attributes":{"latency":2000}}`)); err != nil {
		t.Fatal(err)
	}
	var back []*link
	var dial []string
	for _, h := range empty {
		l := fn.Link(t, "n3-to-"+h.NodeID, h.RaftAddr)
		l.Cut()
		back = append(back, l)
		dial = append(dial, h.NodeID+"="+l.Addr)
	}
	holder.AddArgs("--raft-dial", strings.Join(dial, ","))
	holder.Start(t) // alone it has no quorum, and it cannot reach the others
	const timedOut, found = "did not answer within", "a peer holds the cluster: not bootstrapping"
	seen := map[*Hastate][2]int{}
	for _, h := range empty {
		loseDisk(t, h)
		before[h] = bootstraps(h)
		seen[h] = [2]int{h.logCount(t, timedOut), h.logCount(t, found)}
		h.AddArgs("--raft-dial", holder.NodeID+"="+slow.Addr)
		h.Start(t)
	}
	slowAt := time.Now()
	for _, h := range empty {
		testenv.Eventually(t, 40*time.Second, func() error {
			return testenv.Expect(h.logCount(t, found) > seen[h][1], "%s did not find that the slow peer holds the cluster", h.NodeID)
		})
		if h.logCount(t, timedOut) == seen[h][0] {
			t.Errorf("3: %s never timed out on the slow peer: the test did not test a slow answer", h.NodeID)
		}
		if n := bootstraps(h); n != before[h] {
			t.Errorf("3: %s bootstrapped although the slow peer holds the cluster", h.NodeID)
		}
	}
	t.Logf("3: both empty replicas timed out on the slow peer, then found it holds the cluster (%s); neither bootstrapped",
		time.Since(slowAt).Round(time.Millisecond))
	for _, l := range back {
		l.Heal(t)
	}
	leader, term = oneCluster(t, hs)
	for _, h := range empty {
		if n := bootstraps(h); n != before[h] {
			t.Errorf("3: %s bootstrapped", h.NodeID)
		}
	}
	if err := slow.p.Toxics.RemoveToxic(t.Context(), "slow"); err != nil {
		t.Fatal(err)
	}
	for _, h := range hs {
		h.WaitReady(t)
	}
	t.Logf("3: with a peer answering in 2s: one cluster, leader %s, term %d on all three", leader, term)
}
