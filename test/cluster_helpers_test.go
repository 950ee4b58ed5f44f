package test

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/hastate/hastate/internal/testenv"
)

// Helpers of the three-replica tests (cluster_e2e_test.go). Unlike the
// harness's, the ones that take no testing.TB are safe in goroutines and
// against replicas that are down.

// kvPrefix is the harness's default --kv-prefix.
const kvPrefix = "hastate/"

// stateKey is the Consul key of backend/server.
func stateKey(server string) string { return kvPrefix + "state/" + server }

// others returns hs without x.
func others(hs []*Hastate, x *Hastate) []*Hastate {
	var out []*Hastate
	for _, h := range hs {
		if h != x {
			out = append(out, h)
		}
	}
	return out
}

func nodeIDs(hs []*Hastate) []string {
	var ids []string
	for _, h := range hs {
		ids = append(ids, h.NodeID)
	}
	return ids
}

// clusterInfo is Cluster without a testing.TB.
func (h *Hastate) clusterInfo() (ClusterInfo, error) {
	var c ClusterInfo
	code, body, err := h.get("/v1/cluster")
	if err != nil {
		return c, err
	}
	if code != http.StatusOK {
		return c, fmt.Errorf("GET /v1/cluster: HTTP %d: %s", code, body)
	}
	return c, json.Unmarshal(body, &c)
}

// raftState reads hastate_raft_state from /-/metrics: "leader", "follower",
// "candidate" or "shutdown". It is cheaper than /v1/cluster, which asks
// every peer for its status.
func (h *Hastate) raftState() (string, error) { return h.raftStateWith(httpClient) }

// raftStateWith is raftState with another client (a shorter timeout).
func (h *Hastate) raftStateWith(c *http.Client) (string, error) {
	code, body, err := h.getWith(c, "/-/metrics")
	if err != nil {
		return "", err
	}
	if code != http.StatusOK {
		return "", fmt.Errorf("GET /-/metrics: HTTP %d", code)
	}
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		if s, ok := strings.CutPrefix(sc.Text(), `hastate_raft_state{state="`); ok {
			if st, val, ok := strings.Cut(s, `"} `); ok && val == "1" {
				return st, nil
			}
		}
	}
	return "", errors.New("/-/metrics has no hastate_raft_state sample at 1")
}

// firstLeader polls hs every 10ms until one of them says it leads and
// returns it and when that was first seen.
func firstLeader(t testing.TB, timeout time.Duration, hs ...*Hastate) (*Hastate, time.Time) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var seen []string
	for time.Now().Before(deadline) {
		seen = seen[:0]
		for _, h := range hs {
			st, err := h.raftState()
			if st == "leader" {
				return h, time.Now()
			}
			seen = append(seen, fmt.Sprintf("%s:%s%v", h.NodeID, st, errOrEmpty(err)))
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("none of %v became raft leader within %s: %v", nodeIDs(hs), timeout, seen)
	return nil, time.Time{}
}

func errOrEmpty(err error) string {
	if err == nil {
		return ""
	}
	return "(" + err.Error() + ")"
}

// probeKind classifies one agent-check round trip.
type probeKind int

const (
	probeAnswered   probeKind = iota // one LF-terminated line
	probeRefused                     // nothing listens: connection refused, or reset while dialling
	probeUnanswered                  // connected, then closed or reset without an answer
	probeFailed                      // anything else: timeout, malformed answer
)

// probeAgent does what HAProxy's agent-check does: connect, send
// "backend/server\n", read one line until the close. It is Probe without a
// testing.TB.
func probeAgent(addr, server string) (probeKind, string, error) {
	start := time.Now()
	c, err := net.DialTimeout("tcp", addr, probeTimeout)
	if err != nil {
		// A listener closing while the handshake is in flight resets
		// it instead of refusing it: both mean nobody listens any more,
		// and HAProxy treats both as an unreachable agent (last state
		// kept).
		if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) {
			return probeRefused, "", err
		}
		return probeFailed, "", err
	}
	defer c.Close()
	_ = c.SetDeadline(start.Add(probeTimeout))
	if _, err := io.WriteString(c, server+"\n"); err != nil {
		if errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
			return probeUnanswered, "", err
		}
		return probeFailed, "", err
	}
	b, err := io.ReadAll(c)
	switch {
	case bytes.HasSuffix(b, []byte("\n")) && bytes.Count(b, []byte("\n")) == 1:
		// HAProxy takes the agent's line at its LF, whether the agent
		// then closes or not (src/tcpcheck.c,
		// tcpcheck_agent_expect_reply): a replica paused right after it
		// wrote the line answered that check, although the read here
		// then times out.
		return probeAnswered, string(bytes.TrimSuffix(b, []byte("\n"))), nil
	case err != nil && len(b) == 0 && errors.Is(err, syscall.ECONNRESET):
		return probeUnanswered, "", err
	case err != nil:
		return probeFailed, string(b), err
	case len(b) == 0:
		return probeUnanswered, "", errors.New("closed without an answer")
	}
	return probeFailed, string(b), fmt.Errorf("answer %q is not one LF-terminated line", b)
}

// answerPoll is the pause between two probes of one replica in
// waitAllAnswer.
const answerPoll = time.Millisecond

// waitAllAnswer polls every replica in its own loop, answerPoll apart,
// until it answers want for server and returns the latest of the times
// they first did.
func waitAllAnswer(hs []*Hastate, server, want string, timeout time.Duration) (time.Time, error) {
	deadline := time.Now().Add(timeout)
	seen := make([]time.Time, len(hs))
	errs := make([]error, len(hs))
	var wg sync.WaitGroup
	for i, h := range hs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var last string
			for time.Now().Before(deadline) {
				kind, ans, err := probeAgent(h.AgentAddr, server)
				if kind == probeAnswered && ans == want {
					seen[i] = time.Now()
					return
				}
				last = fmt.Sprintf("%q %v", ans, errOrEmpty(err))
				// A pause between probes keeps the measuring from loading
				// the replicas it measures (a probe is a connection; three
				// loops without one made thousands a second on two cores).
				// It can only make the measured time longer, by up to it.
				time.Sleep(answerPoll)
			}
			errs[i] = fmt.Errorf("%s never answered %q for %s within %s; last %s", h.NodeID, want, server, timeout, last)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return time.Time{}, err
	}
	return slices.MaxFunc(seen, time.Time.Compare), nil
}

// probeCounts is what the probes against one replica saw.
type probeCounts struct {
	OK         int       // the expected answer
	Wrong      int       // another answer: never acceptable
	Refused    int       // connection refused (or reset while dialling)
	Unanswered int       // closed or reset without an answer
	Failed     int       // timeouts, malformed answers, other errors
	LastOK     time.Time // when the last correctly answered probe began
	FirstBad   time.Time // when the first probe that was not OK ended
	LastBad    time.Time
	Bad        []string // the first few non-OK outcomes, for messages
}

func (c probeCounts) bad() int { return c.Wrong + c.Refused + c.Unanswered + c.Failed }

func (c probeCounts) String() string {
	return fmt.Sprintf("ok=%d wrong=%d refused=%d unanswered=%d failed=%d", c.OK, c.Wrong, c.Refused, c.Unanswered, c.Failed)
}

// probers ask replicas for one server in a loop, as HAProxy fleets do
// through the load balancer, and count what they are told.
type probers struct {
	server, want string
	stop         chan struct{}
	wg           sync.WaitGroup

	mu     sync.Mutex
	counts map[string]*probeCounts // by node ID
}

// startProbers starts perReplica goroutines per replica, each probing about
// every 5ms; the answer must be want throughout.
func startProbers(hs []*Hastate, perReplica int, server, want string) *probers {
	p := &probers{server: server, want: want, stop: make(chan struct{}), counts: map[string]*probeCounts{}}
	for _, h := range hs {
		p.counts[h.NodeID] = &probeCounts{}
		for range perReplica {
			p.wg.Add(1)
			go p.run(h)
		}
	}
	return p
}

func (p *probers) run(h *Hastate) {
	defer p.wg.Done()
	tickUntil(p.stop, 5*time.Millisecond, func() { p.probe(h) })
}

// probe asks h once and counts the outcome.
func (p *probers) probe(h *Hastate) {
	began := time.Now()
	kind, ans, err := probeAgent(h.AgentAddr, p.server)
	now := time.Now()
	p.mu.Lock()
	c := p.counts[h.NodeID]
	var bad string
	switch {
	case kind == probeAnswered && ans == p.want:
		c.OK++
		// When the probe began: the listener was open at some point
		// after that, whereas a refused probe ended (now) after the
		// listener had closed.
		c.LastOK = began
	case kind == probeAnswered:
		c.Wrong++
		bad = fmt.Sprintf("wrong answer %q (want %q)", ans, p.want)
	case kind == probeRefused:
		c.Refused++
		bad = fmt.Sprintf("refused: %v", err)
	case kind == probeUnanswered:
		c.Unanswered++
		bad = fmt.Sprintf("unanswered: %v", err)
	default:
		c.Failed++
		bad = fmt.Sprintf("failed: %q %v", ans, err)
	}
	if bad != "" {
		if c.FirstBad.IsZero() {
			c.FirstBad = now
		}
		c.LastBad = now
		if len(c.Bad) < 5 {
			c.Bad = append(c.Bad, now.Format("15:04:05.000")+" "+bad)
		}
	}
	p.mu.Unlock()
}

// tickUntil calls f every d until done is closed.
func tickUntil(done <-chan struct{}, d time.Duration, f func()) {
	tick := time.NewTicker(d)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return
		case <-tick.C:
		}
		f()
	}
}

// Total is the number of probes made so far.
func (p *probers) Total() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, c := range p.counts {
		n += c.OK + c.bad()
	}
	return n
}

// Stop stops the probes and returns the counts by node ID.
func (p *probers) Stop() map[string]probeCounts {
	close(p.stop)
	p.wg.Wait()
	out := map[string]probeCounts{}
	for id, c := range p.counts {
		out[id] = *c
	}
	return out
}

// waitProbes waits until n more probes were made: proof that the probes ran
// during what came before.
func (p *probers) waitProbes(t testing.TB, n int) {
	t.Helper()
	want := p.Total() + n
	testenv.Eventually(t, 10*time.Second, func() error {
		return testenv.Expect(p.Total() >= want, "probes did not reach %d (at %d)", want, p.Total())
	})
}

// consulKV lists the prefix from Consul (a consistent read) with keys
// relative to it, skipping folder keys, as the leader's watch does.
func consulKV(t testing.TB, consul *testenv.Consul) map[string]string {
	t.Helper()
	pairs, _, err := consul.Client(t).KV().List(kvPrefix, &api.QueryOptions{RequireConsistent: true})
	if err != nil {
		t.Fatalf("consul: list %s: %v", kvPrefix, err)
	}
	kv := map[string]string{}
	for _, p := range pairs {
		rel, ok := strings.CutPrefix(p.Key, kvPrefix)
		if !ok || rel == "" || (strings.HasSuffix(rel, "/") && len(p.Value) == 0) {
			continue
		}
		kv[rel] = string(p.Value)
	}
	return kv
}

// kvDigest is the kv_digest of /v1/cluster (state.Digest): SHA-256 over
// the sorted lines %q=%q\n of key (relative to the prefix) and value, in
// hex. It is written out here, not imported, so that the test checks the
// replicas against Consul independently of the code under test. A replica's
// kv_digest equals kvDigest(consulKV()) when it mirrors Consul exactly.
func kvDigest(kv map[string]string) string {
	h := sha256.New()
	for _, k := range slices.Sorted(maps.Keys(kv)) {
		fmt.Fprintf(h, "%q=%q\n", k, kv[k])
	}
	return hex.EncodeToString(h.Sum(nil))
}

// waitMirrorsConsul waits until every replica's kv_digest equals the digest
// of Consul's own listing of the prefix and returns that digest.
func waitMirrorsConsul(t testing.TB, timeout time.Duration, consul *testenv.Consul, hs ...*Hastate) string {
	t.Helper()
	var want string
	var got []string
	testenv.Eventually(t, timeout, func() error {
		want = kvDigest(consulKV(t, consul))
		got = got[:0]
		same := true
		for _, h := range hs {
			c, err := h.clusterInfo()
			got = append(got, fmt.Sprintf("%s:%.12s(keys %d, applied %d)%s", h.NodeID, c.KVDigest, c.KVKeys, c.AppliedIndex, errOrEmpty(err)))
			same = same && err == nil && c.KVDigest == want
		}
		return testenv.Expect(same, "replicas do not mirror Consul (digest %.12s): %v", want, got)
	})
	return want
}

// kvDiff lists the state keys whose value h serves in /v1/state differs
// from want (KV relative to the prefix), for failure messages.
func kvDiff(t testing.TB, h *Hastate, want map[string]string) []string {
	t.Helper()
	var v stateView
	h.GetJSON(t, "/v1/state", &v)
	got := map[string]string{}
	for _, r := range append(v.Servers, v.InvalidKeys...) {
		if r.Key != "" {
			got[r.Key] = r.Value
		}
	}
	var diff []string
	for k, w := range want {
		if g, ok := got[k]; !ok || g != w {
			diff = append(diff, fmt.Sprintf("%s: %q (present %v), want %q", k, g, ok, w))
		}
	}
	for k, g := range got {
		if _, ok := want[k]; !ok {
			diff = append(diff, fmt.Sprintf("%s: %q, want absent", k, g))
		}
	}
	slices.Sort(diff)
	return diff
}

// stateServers returns /v1/state's server rows and invalid keys as JSON,
// to compare replicas.
func stateServers(t testing.TB, h *Hastate) string {
	t.Helper()
	var v stateView
	h.GetJSON(t, "/v1/state", &v)
	// Who polled this replica is its own; the rest is the cluster's.
	for i := range v.Servers {
		v.Servers[i].Polled, v.Servers[i].Told = 0, 0
	}
	b, err := json.Marshal(struct {
		Servers, Invalid []stateRow
	}{v.Servers, v.InvalidKeys})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// answerFor is the agent answer for a valid state value (DESIGN.md); ""
// (no key) means ready.
func answerFor(t testing.TB, value string) string {
	t.Helper()
	switch v := strings.ToLower(strings.TrimSpace(value)); {
	case v == "" || v == "ready":
		return "ready 100%"
	case v == "drain" || v == "maint":
		return v
	case strings.HasSuffix(v, "%"):
		return "ready " + v
	}
	t.Fatalf("answerFor: %q is not a value these tests write", value)
	return ""
}

// durations summarises a sample of durations.
type durations []time.Duration

func (d durations) quantile(q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

func (d durations) min() time.Duration { return d.quantile(0) }
func (d durations) max() time.Duration { return d.quantile(1) }

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
