package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hastate/hastate/internal/testenv"
	"github.com/hastate/hastate/internal/version"
	"github.com/hastate/hastate/state"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"go.uber.org/zap/zaptest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// The Consul client's pooled keep-alive connections.
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
	)
}

// startApp starts a one-node replica on loopback ports; set changes its
// options first.
func startApp(t *testing.T, consulAddr, id string, set ...func(*Options)) *App {
	t.Helper()
	a := newApp(t, consulAddr, id, set...)
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Stop(context.Background()) })
	return a
}

// newApp builds a replica on loopback ports without starting it.
func newApp(t *testing.T, consulAddr, id string, set ...func(*Options)) *App {
	t.Helper()
	raft := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	o := Options{
		NodeID: id, AgentAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", RaftAddr: raft, RaftAdvertise: raft,
		DataDir: t.TempDir(), ConsulAddr: consulAddr, Logger: zaptest.NewLogger(t),
	}
	for _, f := range set {
		f(&o)
	}
	a, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func ask(t *testing.T, a *App, req string) string {
	t.Helper()
	c, err := net.DialTimeout("tcp", a.AgentAddr().String(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := io.WriteString(c, req+"\n"); err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(c)
	return string(b)
}

func httpGet(t *testing.T, a *App, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + a.HTTPAddr().String() + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// Two replicas in one process, each with its own registry: nothing is
// shared through package state, and Stop is orderly and idempotent.
func TestTwoReplicasInOneProcess(t *testing.T) {
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	consul.Put(t, "hastate/state/web/a", "drain")
	a := startApp(t, consul.Addr(), "a")
	b := startApp(t, consul.Addr(), "b")
	for _, r := range []*App{a, b} {
		testenv.Eventually(t, 10*time.Second, func() error { return testenv.Expect(ask(t, r, "web/a") == "drain\n", "replica never answered drain") })
		code, body := httpGet(t, r, "/-/readiness")
		if code != 200 {
			t.Fatalf("readiness %d: %s", code, body)
		}
		_, metrics := httpGet(t, r, "/-/metrics")
		for _, m := range []string{"hastate_agent_checks_total", "hastate_kv_index", "hastate_raft_state", "hastate_build_info", "hastate_state_keys", "hastate_kv_last_success_timestamp_seconds"} {
			if !strings.Contains(metrics, m) {
				t.Errorf("metric %s missing", m)
			}
		}
		var ci struct {
			NodeID  string `json:"node_id"`
			State   string `json:"state"`
			Members []struct{ ID, Address string }
		}
		_, body = httpGet(t, r, "/v1/cluster")
		if err := json.Unmarshal([]byte(body), &ci); err != nil || ci.State != "leader" || len(ci.Members) != 1 {
			t.Fatalf("/v1/cluster: %v %s", err, body)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.Stop(ctx); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	// b is unaffected by a's stop.
	consul.Put(t, "hastate/state/web/a", "maint")
	testenv.Eventually(t, 10*time.Second, func() error {
		return testenv.Expect(ask(t, b, "web/a") == "maint\n", "b stopped following KV after a stopped")
	})
	// b stops in order too, twice, and its agent port is free again.
	agent := b.AgentAddr().String()
	for i := range 2 {
		if err := b.Stop(ctx); err != nil {
			t.Fatalf("b: Stop %d: %v", i+1, err)
		}
	}
	ln, err := net.Listen("tcp", agent)
	if err != nil {
		t.Fatalf("b's agent port is still bound after Stop: %v", err)
	}
	ln.Close()
}

func TestOptionsValidate(t *testing.T) {
	for _, tt := range []struct {
		o    Options
		want string
	}{
		{Options{DataDir: "x"}, "--node-id"},
		{Options{NodeID: "x"}, "--data-dir"},
		{Options{NodeID: "x", DataDir: "d", KVPrefix: "nope"}, "end with '/'"},
		{Options{NodeID: "x", DataDir: "d", PollersMax: -1}, "--pollers-max -1 is negative"},
		{Options{NodeID: "x", DataDir: "d", Ramp: state.RampPolicy{Start: 10, Duration: 48 * time.Hour}}, "ramp flags: invalid ramp policy: duration"},
		{Options{NodeID: "x", DataDir: "d", HTTPReadTimeout: -1}, "HTTPReadTimeout -1ns is negative"},
		// cluster.CheckLeaderlessGrace, the one check (issue 27.18), before anything starts.
		{Options{NodeID: "x", DataDir: "d", LeaderlessGrace: -time.Second}, "--leaderless-grace -1s is negative"},
	} {
		if _, err := New(tt.o); !errors.Is(err, ErrInvalidOptions) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("New(%+v) = %v, want ErrInvalidOptions mentioning %q", tt.o, err, tt.want)
		}
	}
}

// Drain keeps the replica answering probes while readiness fails, for the
// shutdown delay; a cancelled context (a second signal) cuts it short.
func TestDrainAnswersWhileReadinessFails(t *testing.T) {
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	consul.Put(t, "hastate/state/web/a", "drain")
	raft := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	const delay = 600 * time.Millisecond
	a, err := New(Options{
		NodeID: "d", AgentAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", RaftAddr: raft, RaftAdvertise: raft,
		DataDir: t.TempDir(), ConsulAddr: consul.Addr(), Logger: zaptest.NewLogger(t), ShutdownDelay: delay,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Stop(context.Background()) })
	testenv.Eventually(t, 10*time.Second, func() error { return testenv.Expect(ask(t, a, "web/a") == "drain\n", "never answered drain") })

	start := time.Now()
	drained := make(chan struct{})
	go func() { // owned here: the test waits for it below
		defer close(drained)
		a.PrepareStop(context.Background())
	}()
	testenv.Eventually(t, delay/2, func() error {
		code, _ := httpGet(t, a, "/-/readiness")
		return testenv.Expect(code == 503, "readiness did not fail while draining")
	})
	if code, body := httpGet(t, a, "/-/readiness"); !strings.Contains(body, "shutting down") {
		t.Errorf("readiness while draining: %d %s; want a body that says it is shutting down", code, body)
	}
	if got := ask(t, a, "web/a"); got != "drain\n" {
		t.Errorf("answer while draining: %q, want the current one", got)
	}
	<-drained
	if took := time.Since(start); took < delay {
		t.Errorf("Drain returned after %s, before the shutdown delay %s", took, delay)
	}
	if err := a.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}

	// A cancelled context ends the delay at once.
	b, err := New(Options{
		NodeID: "e", AgentAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", RaftAddr: raft, RaftAdvertise: raft,
		DataDir: t.TempDir(), ConsulAddr: consul.Addr(), Logger: zaptest.NewLogger(t), ShutdownDelay: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Stop(context.Background()) })
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start = time.Now()
	b.PrepareStop(ctx)
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("Drain with a cancelled context took %s, want it cut short", took)
	}
}

// hastate_build_info says which build runs: version, revision, Go version.
func TestBuildInfoMetric(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := New(Options{NodeID: "a", DataDir: t.TempDir(), ConsulAddr: "127.0.0.1:1", Registry: reg}); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	b := version.Get()
	want := map[string]string{"version": b.Version, "revision": b.Revision, "goversion": b.GoVersion}
	for _, mf := range mfs {
		if mf.GetName() != "hastate_build_info" {
			continue
		}
		got := map[string]string{}
		for _, l := range mf.GetMetric()[0].GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("hastate_build_info labels %v, want %v", got, want)
		}
		return
	}
	t.Fatal("hastate_build_info not registered")
}
