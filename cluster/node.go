package cluster

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/hastate/hastate/api"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"github.com/hastate/hastate/state"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// Errors returned by Node.
var (
	// ErrNotLeader: a write was attempted on a follower. Only the leader
	// applies KV changes; the caller should stop its leader duty.
	ErrNotLeader = errors.New("not the raft leader")
	// ErrShutdown: the node is shut down.
	ErrShutdown = errors.New("raft node shut down")
)

// LeaderDuty is work that runs only on the leader: it is started once the
// leader's FSM has caught up (a barrier) and its context is cancelled when
// leadership is lost or the node shuts down. It must return promptly then.
// An error returned before that means this node cannot do the duty: it
// hands leadership to another voter and, while it still leads, tries the
// duty again after a pause.
type LeaderDuty func(ctx context.Context) error

// Options configure a Node. Required: ID, BindAddr, Advertise, DataDir.
type Options struct {
	ID        string
	BindAddr  string // e.g. ":9779"
	Advertise string // host:port peers dial; a DNS name is fine
	// Peers is the initial configuration used when the node has no raft
	// state. Empty: a one-node cluster of this node.
	Peers []Peer
	// DialOverride dials the listed peers (by ID) at another address than
	// the one in the raft configuration, e.g. through a local proxy or a
	// sidecar. Peers not listed are dialled at their configured address.
	DialOverride map[string]string
	DataDir      string
	// TLS, when set, is used for both the raft listener and dials. It must
	// require and verify client certificates: build it with MutualTLS.
	// Nil: plain TCP (a multi-node cluster warns at start).
	TLS *tls.Config
	// MaxConnsPerIP and MaxConns cap the inbound connections open on the
	// raft port from one remote address and in total; a connection over a
	// cap is closed at once and counted. IdentifyTimeout is how long a new
	// connection has to complete the TLS handshake and send its kind byte.
	// Zero: DefaultMaxConnsPerIP (64), DefaultMaxConns (1024),
	// DefaultIdentifyTimeout (3s).
	MaxConnsPerIP   int
	MaxConns        int
	IdentifyTimeout time.Duration

	Logger     *zap.Logger           // nil: no logs
	Registerer prometheus.Registerer // nil: metrics not registered
	LeaderDuty LeaderDuty            // nil: none
	// ConsulHealth reports this node's own Consul reachability. Followers
	// report it to the leader over the raft port; a leader whose Consul has
	// been unreachable for KVFailoverAfter hands leadership to a follower
	// that can reach it. nil: always reachable (no failover).
	ConsulHealth func() ConsulHealth
	// Ramp is the base undrain ramp policy; <prefix>config/ramp in the
	// mirrored KV overrides it. Zero: no ramps.
	Ramp state.RampPolicy
	// PeerQueries are answered to other members over the raft port (see
	// QueryPeers), e.g. "pollers" for /v1/pollers?scope=cluster.
	PeerQueries map[string]func() any
	// Now is the clock (nil: time.Now); ramps start at the leader's time.
	Now func() time.Time
	// KVFailoverAfter (0: 30s; negative: never) is how long the leader's
	// Consul may be unreachable before it hands over leadership.
	KVFailoverAfter time.Duration

	ApplyTimeout      time.Duration // 0: 5s
	SnapshotInterval  time.Duration // 0: 2m
	SnapshotThreshold uint64        // 0: 1024 entries
	// HeartbeatTimeout and ElectionTimeout (0: 1s each) bound failover time.
	HeartbeatTimeout time.Duration
	ElectionTimeout  time.Duration
}

func (o *Options) validate() error {
	switch {
	case o.ID == "":
		return errors.New("cluster: node ID is empty: set --node-id")
	case o.BindAddr == "":
		return errors.New("cluster: raft bind address is empty: set --raft-addr")
	case o.Advertise == "":
		return errors.New("cluster: raft advertise address is empty: set --raft-advertise")
	case o.DataDir == "":
		return errors.New("cluster: data dir is empty: set --data-dir")
	}
	if len(o.Peers) > 0 {
		found := false
		for _, p := range o.Peers {
			found = found || p.ID == o.ID
		}
		if !found {
			return fmt.Errorf("cluster: node ID %q is not in --peers: list every replica, this one included", o.ID)
		}
	}
	if err := o.validatePort(); err != nil {
		return err
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	o.Ramp = o.Ramp.WithDefaults()
	if err := o.Ramp.Validate(); err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	if o.KVFailoverAfter == 0 {
		o.KVFailoverAfter = 30 * time.Second
	}
	if o.ApplyTimeout == 0 {
		o.ApplyTimeout = 5 * time.Second
	}
	if o.SnapshotInterval == 0 {
		o.SnapshotInterval = 2 * time.Minute
	}
	if o.SnapshotThreshold == 0 {
		o.SnapshotThreshold = 1024
	}
	if o.HeartbeatTimeout == 0 {
		o.HeartbeatTimeout = time.Second
	}
	if o.ElectionTimeout == 0 {
		o.ElectionTimeout = time.Second
	}
	return nil
}

// Node is one hastate raft replica.
type Node struct {
	opts      Options
	log       *zap.Logger
	raft      *raft.Raft
	fsm       *fsm
	store     *raftboltdb.BoltStore
	transport *raft.NetworkTransport
	stream    *streamLayer
	metrics   *metrics
	observer  *raft.Observer

	caughtUp      atomic.Bool
	lastBadPolicy atomic.Pointer[string]
	kvState

	stop     chan struct{}
	wg       sync.WaitGroup
	stopOnce sync.Once
	stopErr  error
}

// New opens (or creates) the node's raft state in DataDir and starts raft.
// A node with no raft state bootstraps with Options.Peers; every node may do
// so with the same list.
func New(o Options) (*Node, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(o.DataDir, 0o750); err != nil {
		return nil, fmt.Errorf("cluster: data dir %s: %w", o.DataDir, err)
	}
	n := &Node{opts: o, log: o.Logger, stop: make(chan struct{})}
	n.started = time.Now()
	n.leaderSeen.Store(n.started.UnixNano())
	// The metrics exist before raft starts: the FSM reports into them as
	// soon as raft applies an entry.
	n.metrics = newMetrics(n)
	n.fsm = newFSM()
	n.fsm.stepped = func(k int) { n.metrics.rampSteps.Add(float64(k)) }
	n.fsm.lag = func(d time.Duration) { n.metrics.entryLag.Observe(d.Seconds()) }
	n.fsm.rejected = func(err error) {
		n.metrics.applyErrors.Inc()
		n.log.Error("raft entry not applied as written; every replica skips it the same way (report this with the entry's index)", zap.Error(err))
	}

	store, err := raftboltdb.NewBoltStore(filepath.Join(o.DataDir, "raft.db"))
	if err != nil {
		return nil, fmt.Errorf("cluster: open raft log %s: %w (is another hastate using this --data-dir?)", filepath.Join(o.DataDir, "raft.db"), err)
	}
	n.store = store
	hlog := newHCLog(o.Logger, "raft")
	snaps, err := raft.NewFileSnapshotStoreWithLogger(o.DataDir, 3, hlog)
	if err != nil {
		store.Close()
		return nil, fmt.Errorf("cluster: snapshot store in %s: %w", o.DataDir, err)
	}
	sl, err := newStreamLayer(streamConfig{
		Bind: o.BindAddr, Advertise: o.Advertise, TLS: o.TLS, Status: n.peerStatus, Queries: o.PeerQueries,
		Log: o.Logger.Named("transport"), Metrics: n.metrics.port, Peers: len(o.Peers),
		MaxConnsPerIP: o.MaxConnsPerIP, MaxConns: o.MaxConns, IdentifyTimeout: o.IdentifyTimeout,
	})
	if err != nil {
		store.Close()
		return nil, fmt.Errorf("cluster: %w", err)
	}
	n.stream = sl
	n.transport = raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream: sl, MaxPool: 3, Timeout: 5 * time.Second, Logger: hlog,
		ServerAddressProvider: newDialOverride(o),
	})

	notify := make(chan bool, 16)
	cfg := raft.DefaultConfig()
	cfg.LocalID = raft.ServerID(o.ID)
	cfg.Logger = hlog
	cfg.NotifyCh = notify
	cfg.HeartbeatTimeout = o.HeartbeatTimeout
	cfg.ElectionTimeout = o.ElectionTimeout
	cfg.LeaderLeaseTimeout = o.HeartbeatTimeout / 2
	cfg.SnapshotInterval = o.SnapshotInterval
	cfg.SnapshotThreshold = o.SnapshotThreshold
	cfg.TrailingLogs = 4096
	// Followers learn that an entry is committed from the leader's next
	// AppendEntries; sending one within 10ms keeps every replica within
	// milliseconds of the leader's answer (a ramp step must not be seen
	// on one replica long before the others).
	cfg.CommitTimeout = 10 * time.Millisecond

	hasState, err := raft.HasExistingState(store, store, snaps)
	if err != nil {
		n.closeStores()
		return nil, fmt.Errorf("cluster: read raft state in %s: %w", o.DataDir, err)
	}
	r, err := raft.NewRaft(cfg, n.fsm, store, store, snaps, n.transport)
	if err != nil {
		n.closeStores()
		return nil, fmt.Errorf("cluster: start raft: %w", err)
	}
	n.raft = r
	// A snapshot older than version 3 does not carry the FSM's index; the
	// snapshot's own raft index is as good.
	if v, err := strconv.ParseUint(r.Stats()["last_snapshot_index"], 10, 64); err == nil && v > 0 {
		n.fsm.index.CompareAndSwap(0, v)
	}
	if !hasState {
		servers := []raft.Server{{ID: raft.ServerID(o.ID), Address: raft.ServerAddress(o.Advertise), Suffrage: raft.Voter}}
		if len(o.Peers) > 0 {
			servers = servers[:0]
			for _, p := range o.Peers {
				servers = append(servers, raft.Server{ID: raft.ServerID(p.ID), Address: raft.ServerAddress(p.Address), Suffrage: raft.Voter})
			}
		}
		// Identical bootstraps on several nodes are fine; an error here
		// only means another node's configuration arrived first.
		if err := r.BootstrapCluster(raft.Configuration{Servers: servers}).Error(); err != nil && !errors.Is(err, raft.ErrCantBootstrap) {
			n.log.Warn("raft bootstrap", zap.Error(err))
		}
		n.log.Info("raft bootstrapped", zap.Int("servers", len(servers)))
	}

	if o.Registerer != nil {
		if err := o.Registerer.Register(n.metrics); err != nil {
			_ = r.Shutdown().Error()
			n.closeStores()
			return nil, fmt.Errorf("cluster: register metrics: %w", err)
		}
	}
	obs := make(chan raft.Observation, 16)
	n.observer = raft.NewObserver(obs, false, func(o *raft.Observation) bool {
		_, ok := o.Data.(raft.LeaderObservation)
		return ok
	})
	r.RegisterObserver(n.observer)

	sl.serveQueries()
	n.wg.Add(4)
	go n.leadershipLoop(notify)
	go n.observeLoop(obs)
	go n.catchUpLoop()
	go n.leaderReportLoop()
	return n, nil
}

// Snapshot returns the current serving snapshot (nil while the node holds
// no state). It never blocks.
func (n *Node) Snapshot() *state.Snapshot { return n.fsm.serving.Load() }

// KV returns a copy of the mirrored KV content (keys relative to the prefix).
func (n *Node) KV() map[string]string { return n.fsm.kv() }

// ApplyKV makes the replicated mirror equal kv, a full read of the prefix at
// Consul index index, as one raft entry holding only the differences. It
// writes nothing when nothing differs and the mirror already holds state.
// Only the leader may call it; others get ErrNotLeader.
func (n *Node) ApplyKV(ctx context.Context, index uint64, kv map[string]string) error {
	if n.raft.State() != raft.Leader {
		return ErrNotLeader
	}
	change, old, synced := n.fsm.diff(kv)
	if change.Empty() && synced {
		return nil
	}
	raw, ok := kv[RampConfigKey]
	policy := n.rampPolicy(raw, ok)
	res, raftIndex, err := n.apply(ctx, command{Type: cmdKV, KVIndex: index, Change: change, At: n.now(), Ramp: policy})
	if err != nil {
		return fmt.Errorf("cluster: apply KV change (%d set, %d deleted): %w", len(change.Set), len(change.Delete), err)
	}
	n.log.Info("kv change applied", append([]zap.Field{zap.Uint64("kv_index", index), zap.Uint64("raft_index", raftIndex),
		zap.Int("set", len(change.Set)), zap.Int("deleted", len(change.Delete))}, changeFields(change, old)...)...)
	n.logInvalid(change)
	n.logRampEvents(res.events)
	return nil
}

// apply writes one entry and waits until it is applied on this leader.
func (n *Node) apply(ctx context.Context, c command) (applyResult, uint64, error) {
	data, err := json.Marshal(c)
	if err != nil {
		return applyResult{}, 0, fmt.Errorf("encode entry: %w", err)
	}
	start := time.Now()
	timeout := n.opts.ApplyTimeout
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < timeout {
		timeout = time.Until(dl)
	}
	f := n.raft.Apply(data, timeout)
	if err := f.Error(); err != nil {
		if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) {
			return applyResult{}, 0, fmt.Errorf("%w: %v", ErrNotLeader, err)
		}
		return applyResult{}, 0, fmt.Errorf("%w (is the data dir's disk full or the quorum lost? the last applied state is still served)", err)
	}
	switch r := f.Response().(type) {
	case error:
		return applyResult{}, 0, r
	case applyResult:
		n.metrics.applyDuration.Observe(time.Since(start).Seconds())
		return r, f.Index(), nil
	}
	n.metrics.applyDuration.Observe(time.Since(start).Seconds())
	return applyResult{}, f.Index(), nil
}

func (n *Node) now() time.Time {
	if n.opts.Now != nil {
		return n.opts.Now()
	}
	return time.Now()
}

// rampPolicy is the policy in force for <prefix>config/ramp's value raw
// (ok: the key exists): the flags, overridden by the key when that
// parses. An invalid override is reported once per value and ignored.
func (n *Node) rampPolicy(raw string, ok bool) state.RampPolicy {
	if !ok {
		n.metrics.rampPolicyInvalid.Set(0)
		return n.opts.Ramp
	}
	p, err := state.ParseRampPolicy(raw, n.opts.Ramp)
	if err != nil {
		n.metrics.rampPolicyInvalid.Set(1)
		if prev := n.lastBadPolicy.Swap(&raw); prev == nil || *prev != raw {
			n.log.Warn("ignoring invalid ramp policy in KV; the --ramp-* flags apply (fix or delete the key)",
				zap.String("key", RampConfigKey), zap.String("value", cutValue(raw)), zap.Error(err))
		}
		return n.opts.Ramp
	}
	n.metrics.rampPolicyInvalid.Set(0)
	n.lastBadPolicy.Store(nil)
	return p
}

// RampConfigKey is the KV key, relative to the prefix, of the ramp policy
// override.
const RampConfigKey = "config/ramp"

func (n *Node) logRampEvents(events []state.RampEvent) {
	for _, e := range events {
		r := e.Ramp
		if e.Start {
			n.log.Info("ramp started", zap.String("target", e.Target), zap.String("reason", e.Reason),
				zap.Int("weight_percent", r.Weight), zap.Duration("duration", r.Policy.Duration),
				zap.Duration("interval", r.Policy.Interval), zap.Time("eta", r.ETA()))
			continue
		}
		n.log.Info("ramp ended", zap.String("target", e.Target), zap.String("reason", e.Reason),
			zap.Int("weight_percent", r.Weight), zap.Duration("ran_for", n.now().Sub(r.Started).Round(time.Millisecond)))
	}
}

// rampLoop is the leader's ramp engine: it writes a ramp entry whenever a
// ramp's schedule moves past its last applied step, and ends ramps that are
// done. A new leader runs the same loop on the ramps it finds in the FSM,
// so every ramp resumes from its recorded start and last weight.
func (n *Node) rampLoop(ctx context.Context) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ramps := n.fsm.ramps()
		if len(ramps) == 0 {
			continue
		}
		steps := state.NextSteps(ramps, n.now())
		if steps.Empty() {
			continue
		}
		res, _, err := n.apply(ctx, command{Type: cmdRamp, Steps: steps, At: n.now()})
		if err != nil {
			n.log.Warn("ramp step not applied; retrying", zap.Error(err))
			continue
		}
		n.logRampEvents(res.events)
	}
}

// leadershipLoop runs the leader duty while this node leads.
func (n *Node) leadershipLoop(notify <-chan bool) {
	defer n.wg.Done()
	var cur *runningDuty
	stopDuty := func() {
		if cur != nil {
			cur.stop()
			cur = nil
		}
	}
	defer stopDuty()
	for {
		select {
		case <-n.stop:
			return
		case leader := <-notify:
			switch {
			case !leader:
				n.log.Info("lost raft leadership")
				stopDuty()
			case cur == nil:
				n.log.Info("became raft leader")
				cur = startDuty(n.leaderDuty)
			}
		}
	}
}

// runningDuty is a leader duty goroutine and the way to stop it.
type runningDuty struct {
	cancel context.CancelFunc
	done   chan struct{}
}

func startDuty(f func(context.Context)) *runningDuty {
	ctx, cancel := context.WithCancel(context.Background())
	d := &runningDuty{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(d.done)
		f(ctx)
	}()
	return d
}

func (d *runningDuty) stop() {
	d.cancel()
	<-d.done
}

func (n *Node) leaderDuty(ctx context.Context) {
	// The FSM must hold every committed entry before the leader diffs
	// against it.
	for {
		err := n.raft.Barrier(n.opts.ApplyTimeout).Error()
		if err == nil {
			break
		}
		n.log.Warn("raft barrier on new leader failed; retrying", zap.Error(err))
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
	n.caughtUp.Store(true)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		n.rampLoop(ctx)
	}()
	go func() {
		defer wg.Done()
		n.expiryLoop(ctx)
	}()
	if n.opts.ConsulHealth != nil && n.opts.KVFailoverAfter > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n.kvFailoverLoop(ctx)
		}()
	}
	if n.opts.LeaderDuty != nil {
		n.runLeaderDuty(ctx)
	}
	wg.Wait()
}

// leaderDutyRetry is the pause before a leader that could not hand over
// tries its failed duty again.
const leaderDutyRetry = 5 * time.Second

// runLeaderDuty runs the wiring's duty until ctx ends; when the duty fails
// it hands leadership over, or retries it while this node still leads.
func (n *Node) runLeaderDuty(ctx context.Context) {
	for {
		err := n.opts.LeaderDuty(ctx)
		if err == nil || ctx.Err() != nil {
			return
		}
		n.metrics.dutyFailures.Inc()
		if n.voters() < 2 {
			n.log.Error("leader duty failed and no other replica can take over; retrying", zap.Error(err), zap.Duration("retry_in", leaderDutyRetry))
		} else {
			n.log.Error("leader duty failed; handing leadership to another replica", zap.Error(err))
			if terr := n.raft.LeadershipTransfer().Error(); terr != nil {
				n.log.Warn("leadership transfer after a failed leader duty failed; retrying the duty", zap.Error(terr), zap.Duration("retry_in", leaderDutyRetry))
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(leaderDutyRetry):
		}
	}
}

func (n *Node) peerStatus() api.PeerStatus {
	st := api.PeerStatus{ID: n.opts.ID, ConsulReachable: true, State: stateName(n.raft.State()), AppliedIndex: n.raft.AppliedIndex(), StateIndex: n.fsm.index.Load()}
	if lc := n.raft.LastContact(); !lc.IsZero() && n.raft.State() != raft.Leader {
		st.LastContact = time.Since(lc).Round(time.Millisecond).String()
	}
	if n.opts.ConsulHealth != nil {
		h := n.opts.ConsulHealth()
		st.ConsulReachable, st.ConsulChecked = h.Reachable, h.Checked
	}
	if n.raft.State() == raft.Leader {
		v := n.KVView()
		st.KVSynced, st.KVSyncAgeSeconds, st.KVSyncedIndex = v.Synced, v.SyncAgeSeconds, v.SyncedIndex
		// Read after the synced index: the state that holds it is
		// applied by the time the watch records it.
		st.StateIndex = n.fsm.index.Load()
	}
	return st
}

// PeerStatuses asks every member for its status over the raft port (this
// node answers for itself); members that do not answer within timeout are
// missing from the result.
func (n *Node) PeerStatuses(timeout time.Duration) map[string]api.PeerStatus {
	out := map[string]api.PeerStatus{n.opts.ID: n.peerStatus()}
	var mu sync.Mutex
	n.forEachPeer(func(s raft.Server) {
		if st, err := n.stream.queryStatus(n.dialAddress(s), timeout); err == nil {
			mu.Lock()
			out[string(s.ID)] = st
			mu.Unlock()
		}
	})
	return out
}

// PeerAnswer is one member's answer to a named query: Raw, or Err when it
// did not answer.
type PeerAnswer struct {
	Raw json.RawMessage
	Err error
}

// QueryPeers asks every other member for the answer to a named query
// (Options.PeerQueries on their side), in parallel, each within timeout.
// Every member of the configuration is in the result, those that did not
// answer with their error, so that a caller can say whom it missed.
func (n *Node) QueryPeers(name string, timeout time.Duration) map[string]PeerAnswer {
	out := map[string]PeerAnswer{}
	var mu sync.Mutex
	n.forEachPeer(func(s raft.Server) {
		raw, err := n.stream.query(n.dialAddress(s), name, timeout)
		mu.Lock()
		out[string(s.ID)] = PeerAnswer{Raw: raw, Err: err}
		mu.Unlock()
	})
	return out
}

// forEachPeer runs f for every other member of the configuration, in
// parallel, and waits for all of them.
func (n *Node) forEachPeer(f func(raft.Server)) {
	cf := n.raft.GetConfiguration()
	if cf.Error() != nil {
		return
	}
	var wg sync.WaitGroup
	for _, s := range cf.Configuration().Servers {
		if string(s.ID) == n.opts.ID {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(s)
		}()
	}
	wg.Wait()
}

func (n *Node) dialAddress(s raft.Server) string {
	if a, ok := n.opts.DialOverride[string(s.ID)]; ok {
		return a
	}
	return string(s.Address)
}

func (n *Node) observeLoop(obs <-chan raft.Observation) {
	defer n.wg.Done()
	for {
		select {
		case <-n.stop:
			return
		case o := <-obs:
			if lo, ok := o.Data.(raft.LeaderObservation); ok {
				n.metrics.leaderChanges.Inc()
				n.log.Info("raft leader changed", zap.String("leader_id", string(lo.LeaderID)), zap.String("leader_address", string(lo.LeaderAddr)))
			}
		}
	}
}

// catchUpLoop marks the node caught up once it serves everything a leader
// served when this node asked it, after start. The node's own commit index
// cannot tell: a follower caps it at its last log index, so a follower
// restarted behind the leader would look caught up before the leader sent
// it the entries it missed; and raft's applied index counts entries still
// queued for the FSM. So both sides compare the FSM's own index; the
// leader's comes over the raft port's status query.
func (n *Node) catchUpLoop() {
	defer n.wg.Done()
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	var leader raft.ServerID
	var target uint64 // the leader's state index; 0: not known yet
	for !n.caughtUp.Load() {
		select {
		case <-n.stop:
			return
		case <-t.C:
		}
		addr, id := n.raft.LeaderWithID()
		if id == "" || string(id) == n.opts.ID {
			continue // no leader, or this node leads (leaderDuty marks it)
		}
		if id != leader {
			leader, target = id, 0
		}
		if target == 0 {
			st, err := n.stream.queryStatus(n.dialAddress(raft.Server{ID: id, Address: addr}), 500*time.Millisecond)
			if err != nil || st.ID != string(id) || st.State != stateName(raft.Leader) || st.StateIndex == 0 {
				continue
			}
			target = st.StateIndex
		}
		if n.fsm.index.Load() >= target {
			n.caughtUp.Store(true)
		}
	}
	n.log.Info("raft caught up", zap.Uint64("state_index", n.fsm.index.Load()), zap.String("leader_id", string(leader)))
}

// Ready reports whether the replica holds state and has caught up with a
// leader since it started, with a human-readable detail either way.
func (n *Node) Ready() (bool, string) {
	_, _, synced := n.fsm.info()
	caught := n.caughtUp.Load()
	switch {
	case !synced:
		return false, "no state yet: waiting for a first KV sync through the raft leader (check Consul and the leader)"
	case !caught:
		return false, "holds state but has not caught up with a raft leader since start (check peers and the raft port)"
	}
	if w := n.KVView().Warning; w != "" {
		return true, "holds state and caught up with a leader; " + w
	}
	return true, "holds state and caught up with a leader"
}

// Info returns the node's view of the cluster.
func (n *Node) Info() api.ClusterInfo {
	addr, lid := n.raft.LeaderWithID()
	kvIndex, keys, synced := n.fsm.info()
	in := api.ClusterInfo{
		NodeID: n.opts.ID, State: stateName(n.raft.State()), LeaderID: string(lid), LeaderAddr: string(addr),
		AppliedIndex: n.raft.AppliedIndex(), StateIndex: n.fsm.index.Load(), CommitIndex: n.raft.CommitIndex(), Term: n.raft.CurrentTerm(),
		KVIndex: kvIndex, KVKeys: keys, KVDigest: n.fsm.digest(), HoldsState: synced, CaughtUp: n.caughtUp.Load(),
		KV: n.KVView(), LeaderlessSeconds: n.leaderless().Seconds(), Members: []api.MemberInfo{},
	}
	if lc := n.raft.LastContact(); !lc.IsZero() && in.State != "leader" {
		in.LastContact = time.Since(lc).Round(time.Millisecond).String()
	}
	if f := n.raft.GetConfiguration(); f.Error() == nil {
		statuses := n.PeerStatuses(time.Second)
		for _, s := range f.Configuration().Servers {
			m := api.MemberInfo{ID: string(s.ID), Address: string(s.Address), Suffrage: s.Suffrage.String(), Leader: s.ID == lid}
			if st, ok := statuses[string(s.ID)]; ok {
				m.Status = &st
			}
			in.Members = append(in.Members, m)
		}
	}
	return in
}

func stateName(s raft.RaftState) string {
	switch s {
	case raft.Leader:
		return "leader"
	case raft.Candidate:
		return "candidate"
	case raft.Follower:
		return "follower"
	default:
		return "shutdown"
	}
}

// IsLeader reports whether this node is the raft leader.
func (n *Node) IsLeader() bool { return n.raft.State() == raft.Leader }

// Shutdown hands leadership to another voter when this node leads (bounded
// by ctx), stops the leader duty, then stops raft and closes the stores.
// Safe to call more than once.
func (n *Node) Shutdown(ctx context.Context) error {
	n.stopOnce.Do(func() { n.stopErr = n.shutdown(ctx) })
	return n.stopErr
}

// HandOver transfers leadership to another voter when this node leads a
// cluster of several, and waits for the transfer or for ctx. The node stays
// a member: as a follower it keeps applying entries and serving. Shutdown
// calls it first; a replica about to stop can call it earlier.
func (n *Node) HandOver(ctx context.Context) {
	if n.raft.State() != raft.Leader || n.voters() < 2 {
		return
	}
	start := time.Now()
	f := n.raft.LeadershipTransfer()
	errc := make(chan error, 1)
	go func() { errc <- f.Error() }() // ends when raft resolves the future, at the latest at raft shutdown
	select {
	case err := <-errc:
		if err != nil {
			n.log.Warn("leadership transfer before shutdown failed; followers will elect a new leader after the election timeout", zap.Error(err))
		} else {
			n.log.Info("leadership transferred before shutdown", zap.Duration("took", time.Since(start)))
		}
	case <-ctx.Done():
		n.log.Warn("leadership transfer did not finish before the shutdown deadline")
	}
}

func (n *Node) shutdown(ctx context.Context) error {
	n.HandOver(ctx)
	close(n.stop)
	n.wg.Wait()
	n.raft.DeregisterObserver(n.observer)
	err := n.raft.Shutdown().Error()
	if n.opts.Registerer != nil {
		n.opts.Registerer.Unregister(n.metrics)
	}
	if cerr := n.closeStores(); err == nil {
		err = cerr
	}
	return err
}

func (n *Node) voters() int {
	f := n.raft.GetConfiguration()
	if f.Error() != nil {
		return 0
	}
	c := 0
	for _, s := range f.Configuration().Servers {
		if s.Suffrage == raft.Voter {
			c++
		}
	}
	return c
}

func (n *Node) closeStores() error {
	var err error
	if n.transport != nil {
		n.transport.CloseStreams()
		err = n.transport.Close()
	}
	if n.store != nil {
		if cerr := n.store.Close(); err == nil {
			err = cerr
		}
	}
	return err
}

// dialOverride maps server IDs to dial addresses; an error makes raft use
// the configured address. raft logs a warning for every error, and asks on
// every RPC (its own ID included), so the map holds every known server.
type dialOverride map[string]string

// newDialOverride returns nil (raft dials the configured addresses) without
// overrides; else the overrides on top of --peers and this node's own
// advertised address.
func newDialOverride(o Options) raft.ServerAddressProvider {
	if len(o.DialOverride) == 0 {
		return nil
	}
	d := dialOverride{o.ID: o.Advertise}
	for _, p := range o.Peers {
		d[p.ID] = p.Address
	}
	maps.Copy(d, o.DialOverride)
	return d
}

func (d dialOverride) ServerAddr(id raft.ServerID) (raft.ServerAddress, error) {
	if a, ok := d[string(id)]; ok {
		return raft.ServerAddress(a), nil
	}
	return "", fmt.Errorf("no dial override for %s", id)
}
