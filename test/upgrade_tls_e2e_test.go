package test

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hastate/hastate/internal/testenv"
)

// readySampler samples how many replicas are ready, every 50ms, and adds
// up the time fewer than all of them were (the cluster without fault
// tolerance: one more loss would take the quorum) and the least it saw.
type readySampler struct {
	hs   []*Hastate
	stop chan struct{}
	done chan struct{}

	mu       sync.Mutex
	samples  int
	minReady int
	below    time.Duration // time with fewer than len(hs) ready
	noQuorum time.Duration // time with fewer than a majority ready
}

func startReadySampler(hs []*Hastate) *readySampler {
	s := &readySampler{hs: hs, stop: make(chan struct{}), done: make(chan struct{}), minReady: len(hs)}
	go func() {
		defer close(s.done)
		last := time.Now()
		for {
			select {
			case <-s.stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			n := 0
			for _, h := range hs {
				if ready(h) {
					n++
				}
			}
			now := time.Now()
			s.mu.Lock()
			s.samples++
			s.minReady = min(s.minReady, n)
			if n < len(hs) {
				s.below += now.Sub(last)
			}
			if n <= len(hs)/2 {
				s.noQuorum += now.Sub(last)
			}
			s.mu.Unlock()
			last = now
		}
	}()
	return s
}

func (s *readySampler) Stop() (samples, minReady int, below, noQuorum time.Duration) {
	close(s.stop)
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.samples, s.minReady, s.below, s.noQuorum
}

// TestE2EUpgradeWithCertificates is docs/deploy.md's "Upgrading from
// 0.14.0" and "Moving the raft CA" with processes: three replicas of the
// previous release (built from this repository's history) with raft TLS
// as its chart set it up (one CA, every replica's certificate and key in
// one Secret, mounted in every pod), then one replica at a time on this
// build with the same Secret (raftTLS.existingSecret, the docs' choice),
// then the move to a new CA in the docs' rollouts: a bundle of both CAs,
// the switch, the old CA out. Each rollout restarts the replicas one at a
// time, highest first, as the StatefulSet does, each pod with the files
// its revision mounts. All along every replica is probed for every server
// and its readiness sampled: no answer wrong, none withheld while ready,
// never fewer than two ready; the time with fewer than three ready (no
// fault tolerance) is reported.
func TestE2EUpgradeWithCertificates(t *testing.T) {
	prevVersion, prevCommit := previousRelease(t)
	oldBin := buildRelease(t, prevVersion, prevCommit)
	c := testenv.StartConsul(t, testenv.ConsulOptions{})
	hs := NewCluster(t, 3, HastateOptions{ConsulAddr: c.Addr()})

	// What a pod of each revision mounts: its certificate and key, and
	// ca.crt (the Secret's, or the bundle). The SAN is the host of
	// --peers (127.0.0.1 here), as the charts' certificates carry theirs.
	type files struct{ cert, key, ca []byte }
	issue := func(ca *testenv.CA, h *Hastate) (cert, key []byte) {
		cert, key, _ = ca.Leaf(t, h.NodeID+" "+ca.Cert.Subject.CommonName, time.Now().Add(90*24*time.Hour), "127.0.0.1")
		return cert, key
	}
	oldCA, newCA := testenv.NewCA(t, "t-hastate raft CA (chart 0.14.0)"), testenv.NewCA(t, "t-hastate-raft-ca (cert-manager)")
	bundle := append(append([]byte{}, oldCA.PEM...), newCA.PEM...)
	oldFiles, newFiles := map[string]files{}, map[string]files{}
	vols := map[string]*secretVolume{}
	for _, h := range hs {
		cert, key := issue(oldCA, h)
		oldFiles[h.NodeID] = files{cert, key, oldCA.PEM}
		cert, key = issue(newCA, h)
		newFiles[h.NodeID] = files{cert, key, newCA.PEM}
		vols[h.NodeID] = newSecretVolume(t)
		v := vols[h.NodeID]
		h.AddArgs("--raft-tls-cert", v.path("tls.crt"), "--raft-tls-key", v.path("tls.key"), "--raft-tls-ca", v.path("ca.crt"))
	}
	mountFiles := func(h *Hastate, f files) {
		vols[h.NodeID].update(t, map[string][]byte{"tls.crt": f.cert, "tls.key": f.key, "ca.crt": f.ca})
	}
	for _, h := range hs {
		mountFiles(h, oldFiles[h.NodeID])
		h.Use(oldBin)
	}
	StartAll(t, hs...)
	leader := WaitLeader(t, 20*time.Second, hs...)
	for _, h := range hs {
		h.WaitReady(t)
	}
	if got := leader.Metric(t, "hastate_raft_tls_enabled"); got != 1 {
		t.Fatalf("%s: hastate_raft_tls_enabled %v on %s, want raft TLS on", leader.NodeID, got, prevVersion)
	}

	// Desired state: a drain and a maint, written before the roll.
	op := hs[0].Operator("--allow-unknown")
	op.Run(t, "drain", "tls/web1")
	op.Run(t, "maint", "tls/web2")
	for _, h := range hs {
		h.WaitAnswer(t, "tls/web1", "drain")
		h.WaitAnswer(t, "tls/web2", "maint")
	}
	chk := startRollChecker(hs, map[string]expect{
		"tls/web1": fixed("drain"), "tls/web2": fixed("maint"), "tls/web3": fixed("ready 100%"),
	})
	sampler := startReadySampler(hs)
	chk.waitMore(t, 300)

	// rollout restarts every replica, highest ordinal first, on bin with
	// the files each one's new revision mounts, and waits until it is
	// ready and the three agree on the leader and the state.
	steps := 0
	const tlsRejected = `hastate_raft_conns_rejected_total{reason="tls"}`
	rejected := 0.0 // by replicas before they were restarted, and at the end
	rollout := func(name, bin string, mounted func(h *Hastate) files) {
		t.Helper()
		start := time.Now()
		for _, h := range slices.Backward(hs) {
			rejected += h.Metric(t, tlsRejected)
			if code, took := h.Stop(t); code != 0 {
				t.Fatalf("%s: %s exited %d after SIGTERM (%s)", name, h.NodeID, code, took)
			}
			mountFiles(h, mounted(h))
			h.Use(bin)
			h.Start(t)
			h.WaitReady(t)
			steps++
			var last string
			testenv.Eventually(t, 30*time.Second, holds(func() bool {
				c0 := hs[0].Cluster(t)
				for _, o := range hs {
					c := o.Cluster(t)
					last = fmt.Sprintf("%s: leader %q members %d digest %.12s; %s: leader %q members %d digest %.12s",
						hs[0].NodeID, c0.LeaderID, len(c0.Members), c0.KVDigest, o.NodeID, c.LeaderID, len(c.Members), c.KVDigest)
					if c.LeaderID == "" || c.LeaderID != c0.LeaderID || len(c.Members) != len(hs) || c.KVDigest != c0.KVDigest {
						return false
					}
				}
				return true
			}, func() string {
				return fmt.Sprintf("%s, %s restarted: the replicas do not agree: %s", name, h.NodeID, last)
			}))
			// Checks of the cluster as this restart left it, before the next.
			chk.waitMore(t, 300)
		}
		t.Logf("%s: every replica restarted and ready, the three agree (%s)", name, time.Since(start).Round(100*time.Millisecond))
	}

	// Upgrading from 0.14.0, the Secret kept: same files, this build.
	rollout("upgrade from "+prevVersion+", raftTLS.existingSecret kept", "", func(h *Hastate) files { return oldFiles[h.NodeID] })
	// Moving the raft CA, step 2: every pod trusts both, presents the old.
	rollout("CA move: trust bundle of both CAs", "", func(h *Hastate) files {
		f := oldFiles[h.NodeID]
		f.ca = bundle
		return f
	})
	// Step 3: the switch, the same bundle.
	rollout("CA move: cert-manager's certificates, same bundle", "", func(h *Hastate) files {
		f := newFiles[h.NodeID]
		f.ca = bundle
		return f
	})
	// Step 4: the old CA out.
	rollout("CA move: the old CA out", "", func(h *Hastate) files { return newFiles[h.NodeID] })

	samples, minReady, below, noQuorum := sampler.Stop()
	checked, wrong, withheld, unconfirmed, bad := chk.Stop()
	t.Logf("%d restarts in 4 rollouts: %v raft connections refused at the TLS handshake; %d answers checked, %d wrong, %d withheld while ready, %d unconfirmed (leadership moving); "+
		"readiness sampled %d times: at least %d of 3 ready at every sample, %s with fewer than 3 ready (no fault tolerance), %s with fewer than 2",
		steps, rejected, checked, wrong, withheld, unconfirmed, samples, minReady, below.Round(100*time.Millisecond), noQuorum.Round(100*time.Millisecond))
	if checked < 100 {
		t.Errorf("only %d answers checked", checked)
	}
	if wrong != 0 || withheld != 0 {
		t.Errorf("%d wrong, %d withheld while ready: %v", wrong, withheld, bad)
	}
	if unconfirmed > checked/20 {
		t.Errorf("%d of %d checks unconfirmed: more than leadership moving explains: %v", unconfirmed, checked, bad)
	}
	if minReady < 2 || noQuorum > 0 {
		t.Errorf("fewer than 2 replicas ready at some point (least %d, %s): a rollout step cost the quorum", minReady, noQuorum)
	}
	for _, h := range hs {
		if n := h.caCount(t); n != 1 {
			t.Errorf("%s trusts %d CAs after the old one went out, want 1", h.NodeID, n)
		}
		rejected += h.Metric(t, tlsRejected)
	}
	if rejected != 0 {
		t.Errorf("%v raft connections refused at the TLS handshake: some step presented a CA a peer did not trust", rejected)
	}
}

// waitMore waits until n more answers of ready replicas were checked.
func (c *rollChecker) waitMore(t *testing.T, n int) {
	t.Helper()
	c.mu.Lock()
	from := c.checked
	c.mu.Unlock()
	testenv.Eventually(t, 30*time.Second, func() error {
		c.mu.Lock()
		defer c.mu.Unlock()
		return testenv.Expect(c.checked >= from+n, "%d answers checked since, want %d", c.checked-from, n)
	})
}
