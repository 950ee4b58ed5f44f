package cluster

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc64"
	"maps"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hastate/hastate/internal/testenv"
	"github.com/hastate/hastate/state"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type testNode struct {
	opts Options
	*Node
}

func startNode(t *testing.T, o Options) *testNode {
	t.Helper()
	o.Registerer = prometheus.NewRegistry()
	o.HeartbeatTimeout = cmp.Or(o.HeartbeatTimeout, 300*time.Millisecond)
	o.ElectionTimeout = cmp.Or(o.ElectionTimeout, 300*time.Millisecond)
	n, err := New(o)
	if err != nil {
		t.Fatalf("start node %s: %v", o.ID, err)
	}
	tn := &testNode{opts: o, Node: n}
	t.Cleanup(func() { _ = n.Shutdown(context.Background()) })
	return tn
}

// startLeader starts a one-node cluster on loopback (o's ID, addresses and
// data dir are filled in when empty) and waits until it leads.
func startLeader(t *testing.T, o Options) *testNode {
	t.Helper()
	if o.BindAddr == "" {
		o.BindAddr = fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
		o.Advertise = o.BindAddr
	}
	if o.ID == "" {
		o.ID = "n1"
	}
	if o.DataDir == "" {
		o.DataDir = t.TempDir()
	}
	n := startNode(t, o)
	testenv.Eventually(t, 5*time.Second, func() error { return testenv.Expect(n.IsLeader(), "single node never became leader") })
	return n
}

func answer(n *Node, req string) string {
	i := strings.IndexByte(req, '/')
	return string(n.Snapshot().Lookup([]byte(req), i))
}

func TestSingleNodeAppliesAndSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	o := Options{ID: "n1", BindAddr: addr, Advertise: addr, DataDir: dir}
	n := startNode(t, o)

	if n.Snapshot() != nil {
		t.Fatal("a fresh node must hold no state (nil snapshot) so that it withholds answers")
	}
	if ok, _ := n.Ready(); ok {
		t.Fatal("a fresh node must not be ready")
	}
	testenv.Eventually(t, 5*time.Second, func() error { return testenv.Expect(n.IsLeader(), "single node never became leader") })

	ctx := context.Background()
	// An empty prefix still gives the replica state.
	if err := n.ApplyKV(ctx, 5, map[string]string{}); err != nil {
		t.Fatal(err)
	}
	if got := answer(n.Node, "web/a"); got != "ready 100%\n" {
		t.Fatalf("answer after empty sync = %q", got)
	}
	testenv.Eventually(t, 2*time.Second, func() error { ok, _ := n.Ready(); return testenv.Expect(ok, "not ready after sync") })

	before := n.raft.LastIndex()
	if err := n.ApplyKV(ctx, 6, map[string]string{}); err != nil {
		t.Fatal(err)
	}
	if n.raft.LastIndex() != before {
		t.Fatal("an unchanged KV read must not write a raft entry")
	}
	kv := map[string]string{"state/web/a": "drain", "state/web/*": "maint", "state/api/x": "25%", "state/api/y": "bogus"}
	if err := n.ApplyKV(ctx, 7, kv); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"web/a": "drain\n", "web/b": "maint\n", "api/x": "ready 25%\n", "api/y": "", "api/z": "ready 100%\n"}
	for req, w := range want {
		if got := answer(n.Node, req); got != w {
			t.Errorf("%s: answer %q, want %q", req, got, w)
		}
	}
	if got := n.Info().KVIndex; got != 7 {
		t.Errorf("kv index %d, want 7", got)
	}

	// Force a snapshot, then one more entry after it, so that a restart
	// needs both the snapshot and the log.
	if err := n.raft.Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	kv["state/web/a"] = "ready"
	if err := n.ApplyKV(ctx, 8, kv); err != nil {
		t.Fatal(err)
	}
	if err := n.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := n.Shutdown(ctx); err != nil {
		t.Fatalf("second Shutdown: %v", err)
	}

	n2 := startNode(t, o)
	testenv.Eventually(t, 5*time.Second, func() error {
		ok, _ := n2.Ready()
		return testenv.Expect(ok, "restarted node not ready without any KV sync")
	})
	want["web/a"] = "ready 100%\n"
	for req, w := range want {
		if got := answer(n2.Node, req); got != w {
			t.Errorf("after restart %s: answer %q, want %q", req, got, w)
		}
	}
}

func TestThreeNodesReplicateAndHandOverOnShutdown(t *testing.T) {
	ports := []int{testenv.FreePort(t), testenv.FreePort(t), testenv.FreePort(t)}
	var peers []Peer
	for i, p := range ports {
		host := "127.0.0.1"
		if i == 2 {
			host = "localhost" // a host name, resolved at dial time
		}
		peers = append(peers, Peer{ID: fmt.Sprintf("n%d", i), Address: fmt.Sprintf("%s:%d", host, p)})
	}
	nodes := make([]*testNode, 3)
	for i := range nodes {
		nodes[i] = startNode(t, Options{ID: peers[i].ID, BindAddr: fmt.Sprintf("127.0.0.1:%d", ports[i]), Advertise: peers[i].Address, Peers: peers, DataDir: t.TempDir()})
	}
	leader := func() *testNode {
		for _, n := range nodes {
			if n.IsLeader() {
				return n
			}
		}
		return nil
	}
	testenv.Eventually(t, 10*time.Second, func() error { return testenv.Expect(leader() != nil, "no leader elected") })
	l := leader()
	for _, n := range nodes {
		if n != l {
			if err := n.ApplyKV(context.Background(), 1, nil); !errors.Is(err, ErrNotLeader) {
				t.Fatalf("ApplyKV on follower %s: %v, want ErrNotLeader", n.opts.ID, err)
			}
		}
	}
	l = applyOnLeader(t, nodes, 3, map[string]string{"state/web/a": "drain"})
	for _, n := range nodes {
		testenv.Eventually(t, 5*time.Second, func() error {
			return testenv.Expect(answer(n.Node, "web/a") == "drain\n", "%s never answered drain", n.opts.ID)
		})
		testenv.Eventually(t, 5*time.Second, func() error { ok, _ := n.Ready(); return testenv.Expect(ok, "%s not ready", n.opts.ID) })
	}
	info := l.Info()
	if len(info.Members) != 3 || info.State != "leader" || info.LeaderID != l.opts.ID {
		t.Fatalf("leader info: %+v", info)
	}

	old := l
	if err := old.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Leadership was handed over before the old leader stopped: a survivor
	// leads right away, without waiting for an election timeout.
	testenv.Eventually(t, 2*time.Second, func() error {
		return testenv.Expect(leaderOf(othersThan(nodes, old)) != nil, "no survivor became leader")
	})
	applyOnLeader(t, othersThan(nodes, old), 4, map[string]string{"state/web/a": "maint"})
	for _, n := range nodes {
		if n != old {
			testenv.Eventually(t, 5*time.Second, func() error {
				return testenv.Expect(answer(n.Node, "web/a") == "maint\n", "%s never answered maint", n.opts.ID)
			})
		}
	}
}

func TestParsePeers(t *testing.T) {
	tests := []struct {
		in      string
		want    int
		wantErr string
	}{
		{"", 0, ""},
		{"a=h:1", 1, ""},
		{"a=h-0.svc:9779, b=10.0.0.1:9779,c=[::1]:9779", 3, ""},
		{"a=h", 0, "host:port"},
		{"h:1", 0, "id=host:port"},
		{"a=h:1,a=g:1", 0, "twice"},
	}
	for _, tt := range tests {
		got, err := ParsePeers(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParsePeers(%q) error %v, want %q", tt.in, err, tt.wantErr)
			}
			continue
		}
		if err != nil || len(got) != tt.want {
			t.Errorf("ParsePeers(%q) = %v, %v", tt.in, got, err)
		}
	}
}

func TestOptionsValidate(t *testing.T) {
	_, err := New(Options{ID: "x", BindAddr: ":0", Advertise: "x:1", DataDir: t.TempDir(), Peers: []Peer{{ID: "y", Address: "y:1"}}})
	if err == nil || !strings.Contains(err.Error(), "not in --peers") {
		t.Fatalf("node missing from peers: %v", err)
	}
	if _, err := New(Options{ID: "x", BindAddr: ":0", DataDir: t.TempDir()}); err == nil {
		t.Fatal("missing advertise accepted")
	}
}

// A follower restarted behind the leader is not ready until it has applied
// what the leader had applied: readiness means "serves what the cluster
// serves", so a load balancer must not send it probes before.
func TestRestartedFollowerReadyOnlyOnceCaughtUp(t *testing.T) {
	nodes := startCluster(t, nil)
	testenv.Eventually(t, 10*time.Second, func() error { return testenv.Expect(leaderOf(nodes) != nil, "no leader") })
	ctx := context.Background()
	kv := map[string]string{}
	l := applyOnLeader(t, nodes, 1, kv)
	var f *testNode
	for _, n := range nodes {
		testenv.Eventually(t, 5*time.Second, func() error { ok, _ := n.Ready(); return testenv.Expect(ok, "%s not ready", n.opts.ID) })
		if n != l {
			f = n
		}
	}
	if err := f.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 200 {
		kv[fmt.Sprintf("state/web/s%03d", i%50)] = fmt.Sprintf("%d%%", i)
		l = applyOnLeader(t, othersThan(nodes, f), uint64(i+2), kv)
	}
	want, digest := l.fsm.Index(), l.Info().KVDigest

	r := startNode(t, f.opts)
	// Polled every millisecond, not with eventually (20ms): the state is
	// checked at the first moment the node says it is ready.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if ok, _ := r.Ready(); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("restarted %s not ready after 10s: %+v", r.opts.ID, r.Info())
		}
		time.Sleep(time.Millisecond)
	}
	if got := r.fsm.Index(); got < want {
		t.Fatalf("restarted %s ready at state index %d, behind the leader's %d", r.opts.ID, got, want)
	}
	if got := r.Info().KVDigest; got != digest {
		lkv, rkv := l.fsm.KV(), r.fsm.KV()
		var diff []string
		for k, v := range lkv {
			if rkv[k] != v {
				diff = append(diff, fmt.Sprintf("%s=%q (leader %q)", k, rkv[k], v))
			}
		}
		t.Fatalf("restarted %s ready with kv_digest %.12s, want the leader's %.12s; %d keys differ: %v", r.opts.ID, got, digest, len(diff), diff)
	}
}

// A version 2 snapshot (before the FSM's state index) restores with the
// raft snapshot's index as the state index, so readiness still works after
// an upgrade.
func TestVersion2SnapshotTakesTheRaftSnapshotIndex(t *testing.T) {
	n := startLeader(t, Options{})
	o, dir := n.opts, n.opts.DataDir
	ctx := context.Background()
	if err := n.ApplyKV(ctx, 1, map[string]string{"state/web/a": "drain"}); err != nil {
		t.Fatal(err)
	}
	if err := n.raft.Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	if err := n.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}

	// Rewrite the snapshot as version 2 wrote it: no "index".
	metas, err := filepath.Glob(filepath.Join(dir, "snapshots", "*", "meta.json"))
	if err != nil || len(metas) != 1 {
		t.Fatalf("snapshots: %v %v", metas, err)
	}
	statePath := filepath.Join(filepath.Dir(metas[0]), "state.bin")
	var data map[string]any
	readJSON(t, statePath, &data)
	delete(data, "index")
	data["version"] = 2
	body := writeJSON(t, statePath, data)
	var meta map[string]any
	readJSON(t, metas[0], &meta)
	sum := crc64.New(crc64.MakeTable(crc64.ECMA))
	sum.Write(body)
	meta["CRC"], meta["Size"] = sum.Sum(nil), len(body)
	writeJSON(t, metas[0], meta)
	snapIndex := uint64(meta["Index"].(float64))

	r := startNode(t, o)
	if got := r.fsm.Index(); got != snapIndex {
		t.Fatalf("state index after restoring a version 2 snapshot: %d, want the snapshot's raft index %d", got, snapIndex)
	}
	if got := answer(r.Node, "web/a"); got != "drain\n" {
		t.Fatalf("answer after restoring a version 2 snapshot: %q", got)
	}
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func writeJSON(t *testing.T, path string, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestApplyReadComparesOnlyWhatChanged: a read that says what changed since
// the read the mirror holds is compared on those keys only (a change costs
// what it touches); one whose base is not the mirror's is compared in full,
// so a stale or foreign base can never leave a difference unapplied.
func TestApplyReadComparesOnlyWhatChanged(t *testing.T) {
	n := startLeader(t, Options{})
	ctx := context.Background()
	kv := map[string]string{"state/web/a": "drain", "state/web/b": "maint", "state/api/x": "25%"}
	if err := n.ApplyKV(ctx, 5, kv); err != nil {
		t.Fatal(err)
	}
	// Based on the read at 5: only the keys listed are compared. The
	// unlisted difference (api/x) shows that the rest is taken as held.
	next := map[string]string{"state/web/a": "ready", "state/web/c": "drain", "state/api/x": "50%"}
	if err := n.ApplyRead(ctx, state.KVRead{Index: 6, KV: next, Base: 5, Changed: []string{"state/web/a", "state/web/b", "state/web/c"}}); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"state/web/a": "ready", "state/web/c": "drain", "state/api/x": "25%"}
	if got := n.KV(); !maps.Equal(got, want) {
		t.Fatalf("after a read based on the mirror's: %v, want %v (only the changed keys compared)", got, want)
	}
	// Based on a read the mirror does not hold (4): compared in full.
	if err := n.ApplyRead(ctx, state.KVRead{Index: 7, KV: next, Base: 4, Changed: []string{"state/web/a"}}); err != nil {
		t.Fatal(err)
	}
	if got := n.KV(); !maps.Equal(got, next) {
		t.Fatalf("after a read on another base: %v, want %v (compared in full)", got, next)
	}
	if got := answer(n.Node, "api/x"); got != "ready 50%\n" {
		t.Errorf("api/x answers %q, want ready 50%%", got)
	}
}

// A New that fails after raft started (here: its metrics are already
// registered) stops what it started, last first: raft, the transport (the
// port can be bound again) and the log store (the data dir opens again).
// TestMain checks that no goroutine is left.
func TestNewFailingLateStopsWhatItStarted(t *testing.T) {
	reg := prometheus.NewRegistry()
	options := func() Options {
		addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
		return Options{ID: "n1", BindAddr: addr, Advertise: addr, DataDir: t.TempDir(), Registerer: reg}
	}
	first, err := New(options())
	if err != nil {
		t.Fatal(err)
	}
	o := options()
	if _, err := New(o); err == nil || !strings.Contains(err.Error(), "register metrics") {
		t.Fatalf("New with the metrics registered already = %v, want the registration error", err)
	}
	_ = first.Shutdown(context.Background())
	ln, err := net.Listen("tcp", o.BindAddr)
	if err != nil {
		t.Fatalf("the failed New left its raft port bound: %v", err)
	}
	ln.Close()
	n, err := New(o) // the same port and data dir
	if err != nil {
		t.Fatalf("the failed New left its port or data dir held: %v", err)
	}
	if err := n.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := n.Shutdown(context.Background()); err != nil {
		t.Errorf("second Shutdown = %v", err)
	}
}
