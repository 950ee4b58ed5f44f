package test

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hastate/hastate/internal/testenv"
)

// loseDisk kills the replica and empties its data dir, as a lost
// PersistentVolume does; the next Start has the same ID, ports and peers.
func loseDisk(t *testing.T, h *Hastate) {
	t.Helper()
	h.Kill()
	if err := os.RemoveAll(h.DataDir); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(h.DataDir, 0o750); err != nil {
		t.Fatal(err)
	}
}

// TestE2ELostDisk: a follower, then the leader, each restarted with an
// empty --data-dir (same ID, same peers), rejoin without bootstrapping a
// second cluster: the leader sends them what they lost, they are ready and
// answer the state, and every replica mirrors Consul.
func TestE2ELostDisk(t *testing.T) {
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	hs := StartCluster(t, 3, HastateOptions{ConsulAddr: consul.Addr()})
	op := hs[0].Operator("--allow-unknown") // no HAProxy polls
	op.Run(t, "drain", "be_ld/*")
	op.Run(t, "weight", "30%", "be_ld2/web1")
	for _, h := range hs {
		h.WaitAnswer(t, "be_ld/web1", "drain")
	}
	for _, role := range []string{"follower", "leader"} {
		leader := WaitLeader(t, 10*time.Second, hs...)
		lost := leader
		if role == "follower" {
			lost = others(hs, leader)[0]
		}
		loseDisk(t, lost)
		if role == "leader" {
			leader = WaitLeader(t, 15*time.Second, others(hs, lost)...)
		}
		term := leader.Cluster(t).Term
		// A change while it is gone: it must get it from the leader. The
		// lost replica cannot be asked: the write says so and goes on.
		leader.Operator("--allow-unknown", "--allow-no-replica").Run(t, "maint", "be_ld2/web2")
		restart := time.Now()
		lost.Start(t)
		lost.WaitReady(t)
		took := time.Since(restart)
		if got := lost.Answers(t, "be_ld/web7", "be_ld2/web1", "be_ld2/web2"); got["be_ld/web7"] != "drain" || got["be_ld2/web1"] != "ready 30%" || got["be_ld2/web2"] != "maint" {
			t.Errorf("%s %s with a lost disk answers %v", role, lost.NodeID, got)
		}
		if !lost.LogContains(t, "not bootstrapping") {
			t.Errorf("%s %s with an empty data dir did not log that it joins instead of bootstrapping", role, lost.NodeID)
		}
		if now := WaitLeader(t, 10*time.Second, hs...); now != leader || now.Cluster(t).Term != term {
			t.Errorf("the rejoin changed the leader (%s, term %d; was %s, term %d)", now.NodeID, now.Cluster(t).Term, leader.NodeID, term)
		}
		if n := len(lost.Cluster(t).Members); n != 3 {
			t.Errorf("%s sees %d members after the rejoin, want 3", lost.NodeID, n)
		}
		waitMirrorsConsul(t, 10*time.Second, consul, hs...)
		op.Run(t, "clear", "be_ld2/web2")
		if _, err := waitAllAnswer(hs, "be_ld2/web2", "ready 100%", 10*time.Second); err != nil {
			t.Fatalf("after the %s's rejoin: %v", role, err)
		}
		t.Logf("%s %s lost its disk: restarted empty, ready and caught up in %s; leader %s kept term %d", role, lost.NodeID, took.Round(time.Millisecond), leader.NodeID, term)
	}
}

// TestE2EQuorumLostForGood runs docs/runbook.md "Quorum lost for good".
// Two of three replicas are gone with their disks: the survivor has no
// quorum, withholds every answer and fails readiness (HAProxy keeps its
// state). Step 1: start the two lost replicas with empty data dirs; they
// join the survivor, which leads with its state (its ramps included) and
// reads Consul. Step 2, for when no replica survives with its disk: stop
// all, empty every data dir, start all; the new cluster's state comes from
// Consul, and ramps in progress are lost (a ramping server is answered at
// its KV state, ready 100%, at once).
func TestE2EQuorumLostForGood(t *testing.T) {
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	hs := StartCluster(t, 3, HastateOptions{ConsulAddr: consul.Addr(), Args: []string{
		"--ramp-duration", "10m", "--ramp-interval", "1s", "--ramp-start", "10%"}})
	op := hs[0].Operator("--allow-unknown") // no HAProxy polls
	op.Run(t, "drain", "be_q/web1", "be_q/web2")
	for _, h := range hs {
		h.WaitAnswer(t, "be_q/web2", "drain")
	}
	op.Run(t, "ready", "be_q/web1") // starts a 10-minute ramp
	for _, h := range hs {
		h.WaitAnswer(t, "be_q/web1", "ready 10%")
	}

	survivor := hs[0]
	for _, h := range hs[1:] {
		loseDisk(t, h)
	}
	lostAt := time.Now()
	testenv.Eventually(t, 15*time.Second, func() error {
		if kind, ans, err := probeAgent(survivor.AgentAddr, "be_q/web2"); kind != probeUnanswered {
			return fmt.Errorf("the survivor without quorum still answers: %v %q %v", kind, ans, err)
		}
		return nil
	})
	withheld := time.Since(lostAt)
	// It answers nothing from the loss (no leader confirms it); past
	// --leaderless-grace it also fails readiness.
	testenv.Eventually(t, 15*time.Second, func() error {
		if code, rd := survivor.Readiness(t); code != 503 {
			return fmt.Errorf("the survivor without quorum: /-/readiness %d %q, want 503", code, rd.Detail)
		}
		return nil
	})
	unready := time.Since(lostAt)

	// Step 1: the lost replicas come back empty and join the survivor.
	// Written while the cluster is down: no replica can confirm it applied
	// Consul's index, so the write waits half its --timeout, says so, and
	// goes on.
	survivor.Operator("--allow-unknown", "--allow-no-replica").Run(t, "maint", "be_q/web3")
	for _, h := range hs[1:] {
		h.Start(t)
	}
	step1 := time.Now()
	for _, h := range hs {
		h.WaitReady(t)
	}
	// Ready is caught up with the leader, which may not have read the
	// write made while the cluster was down yet: wait for it.
	for _, h := range hs {
		testenv.Eventually(t, 10*time.Second, func() error {
			got := h.Answers(t, "be_q/web1", "be_q/web2", "be_q/web3")
			return testenv.Expect(got["be_q/web2"] == "drain" && got["be_q/web3"] == "maint" && got["be_q/web1"] != "ready 100%" && got["be_q/web1"] != "",
				"step 1: %s answers %v; want web1 still ramping, web2 drain, web3 maint", h.NodeID, got)
		})
	}
	waitMirrorsConsul(t, 10*time.Second, consul, hs...)
	back1 := time.Since(step1)

	// Step 2: nothing survives; the state comes back from Consul. One
	// replica cannot be started at all (its node is gone): the other two
	// wait for it, naming it, and bootstrap only once told that it is gone
	// for good (--bootstrap-without, the procedure's explicit step). It
	// joins them when it comes back, empty.
	for _, h := range hs {
		loseDisk(t, h)
	}
	step2 := time.Now()
	gone, rest := hs[2], hs[:2]
	for _, h := range rest {
		h.Start(t)
	}
	for _, h := range rest {
		testenv.Eventually(t, 15*time.Second, func() error {
			code, body, err := h.get("/-/readiness")
			return testenv.Expect(err == nil && code == 503 && strings.Contains(string(body), "waiting for "+gone.NodeID),
				"step 2: %s: /-/readiness %d %s %v does not say it waits for %s", h.NodeID, code, body, err, gone.NodeID)
		})
	}
	for _, h := range rest {
		h.Kill()
		h.Use("", "--bootstrap-without", gone.NodeID)
	}
	StartAll(t, rest...)
	for _, h := range rest {
		if !h.LogContains(t, `"without":["`+gone.NodeID+`"]`) {
			t.Errorf("step 2: %s does not log that it bootstrapped without %s", h.NodeID, gone.NodeID)
		}
		h.Use("") // the flag is removed once the cluster is back
	}
	gone.Start(t)
	gone.WaitReady(t)
	for _, h := range hs {
		got := h.Answers(t, "be_q/web1", "be_q/web2", "be_q/web3")
		if got["be_q/web1"] != "ready 100%" || got["be_q/web2"] != "drain" || got["be_q/web3"] != "maint" {
			t.Errorf("step 2: %s answers %v; want web1 ready 100%% (its ramp is lost), web2 drain, web3 maint", h.NodeID, got)
		}
	}
	waitMirrorsConsul(t, 10*time.Second, consul, hs...)
	if n := len(gone.Cluster(t).Members); n != 3 {
		t.Errorf("step 2: %s sees %d members, want 3", gone.NodeID, n)
	}
	t.Logf("quorum lost: the survivor answered nothing %s after the loss, failed readiness %s after it; step 1 (two empty replicas join the survivor) ready in %s; step 2 (all data cleared, one replica gone: --bootstrap-without) ready from Consul in %s",
		withheld.Round(time.Millisecond), unready.Round(time.Millisecond), back1.Round(time.Millisecond), time.Since(step2).Round(time.Millisecond))
}
