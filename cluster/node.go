package cluster

import (
	"cmp"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"github.com/hastate/hastate/cluster/confirm"
	"github.com/hastate/hastate/cluster/fsm"
	"github.com/hastate/hastate/cluster/leader"
	"github.com/hastate/hastate/cluster/raftport"
	"github.com/hastate/hastate/internal/lifecycle"
	"github.com/hastate/hastate/state"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

const (
	// commitTimeout is how long the leader's replication to a follower
	// idles before sending an AppendEntries anyway (raft waits between
	// it and twice it). Followers learn that an entry is committed only
	// from the leader's next AppendEntries, so this bounds how long a
	// change answered by the leader waits on the others: each change
	// reaches every replica within it of the leader, and a ramp step is
	// never seen on one replica long before the others. Each idle send
	// costs a few microseconds on both sides.
	commitTimeout = 3 * time.Millisecond
	// logCacheEntries is how many recent raft entries are kept decoded
	// (see fsm/logcache.go): replication reads the last few.
	logCacheEntries = 64
	// DefaultLeaderlessGrace is Options.LeaderlessGrace's default
	// (confirm.DefaultGrace).
	DefaultLeaderlessGrace = confirm.DefaultGrace
)

// Errors returned by Node, from its leader's duties.
var (
	// ErrNotLeader: a write was attempted on a follower. Only the leader
	// applies KV changes; the caller should stop its leader duty.
	ErrNotLeader = leader.ErrNotLeader
	// ErrAdoptRefused wraps every refusal of Adopt.
	ErrAdoptRefused = leader.ErrAdoptRefused
)

// Defaults of Options, from the parts that use them.
const (
	// DefaultConfirmTimeout is Options.ConfirmTimeout's default: how long a
	// check waits for its confirmation before it is answered nothing.
	DefaultConfirmTimeout = confirm.DefaultConfirmTimeout
	// DefaultConfirmWindow is Options.ConfirmWindow's default (none).
	DefaultConfirmWindow = confirm.DefaultConfirmWindow
	// RampConfigKey is the KV key, relative to the prefix, of the ramp
	// policy override.
	RampConfigKey = leader.RampConfigKey
)

// Options configure a Node. Required: ID, BindAddr, Advertise, DataDir.
type Options struct {
	ID        string
	BindAddr  string // e.g. ":9779"
	Advertise string // host:port peers dial; a DNS name is fine
	// Peers is the initial configuration used when the node has no raft
	// state. Empty: a one-node cluster of this node.
	Peers []Peer
	// BootstrapWithout lists peers (by ID) declared gone for good: a node
	// with no raft state bootstraps without waiting for their answer (see
	// bootstrap.go; docs/runbook.md "Quorum lost for good").
	BootstrapWithout []string
	// DialOverride dials the listed peers (by ID) at another address than
	// the one in the raft configuration, e.g. through a local proxy or a
	// sidecar. Peers not listed are dialled at their configured address.
	DialOverride map[string]string
	DataDir      string
	// TLS, when set, is used for both the raft listener and dials. It must
	// require and verify client certificates: build it with MutualTLS.
	// Nil: plain TCP (a multi-node cluster warns at start).
	TLS *tls.Config
	// TLSFiles, instead of TLS: mutual TLS from files (LoadRaftTLS) that
	// the node re-reads every TLSReloadInterval (0:
	// DefaultTLSReloadInterval), so that renewed certificates are used
	// without a restart; their expiry is exported. Unless TLSFiles pins
	// names, peers are pinned to the hosts of Peers and Advertise.
	TLSFiles          *raftport.RaftTLS
	TLSReloadInterval time.Duration
	// PortLimits cap the inbound connections of the raft port
	// (raftport.Limits; zero fields: its defaults).
	PortLimits raftport.Limits

	Logger     *zap.Logger           // nil: no logs
	Registerer prometheus.Registerer // nil: metrics not registered
	LeaderDuty leader.Duty           // nil: none
	// ConsulHealth reports this node's own Consul reachability. Followers
	// report it to the leader over the raft port; a leader whose Consul has
	// been unreachable for KVFailoverAfter hands leadership to a follower
	// that can reach it. nil: always reachable (no failover).
	ConsulHealth func() leader.ConsulHealth
	// Ramp is the base undrain ramp policy; <prefix>config/ramp in the
	// mirrored KV overrides it. Zero: no ramps.
	Ramp state.RampPolicy
	// PeerQueries are answered to other members over the raft port (see
	// QueryPeers), e.g. "pollers" for /v1/pollers?scope=cluster.
	PeerQueries map[string]func() any
	// PeerArgQueries are named queries that take an argument (JSON), e.g.
	// the pollers of the servers a selector matches (see QueryPeersWith).
	PeerArgQueries map[string]func(arg json.RawMessage) any
	// Sightings returns the HAProxy sources this replica's poller table
	// holds and when each last polled it (only sources that count as an
	// HAProxy, not a manual probe); the leader records them in raft (see
	// leader/haproxies.go). Nil: none.
	Sightings func() Sightings
	// HAProxySyncEvery is how often the leader records what the
	// replicas saw (0: state.HAProxySyncEvery).
	HAProxySyncEvery time.Duration
	// Now is the clock (nil: time.Now); ramps start at the leader's time.
	Now func() time.Time
	// KVFailoverAfter (0: 30s; negative: never) is how long the leader's
	// Consul may be unreachable before it hands over leadership.
	KVFailoverAfter time.Duration
	// KVStaleAfter (0: DefaultKVStaleAfter) is the sync age past which the
	// KV view warns although Consul is reachable. The leader's watch
	// answers at least every blocking wait, so keep it above that.
	KVStaleAfter time.Duration

	// Version is this build's release, reported to peers and in
	// /v1/cluster ("": not reported).
	Version string
	// MaxLevel caps the feature level the node advertises and applies (0:
	// state.MaxLevel): it withholds on a level entry above it. Operators
	// set 1 (serve --feature-level) to keep a rollback to 0.13.0 with the
	// data directories safe; tests use it to play an older release.
	MaxLevel int

	ApplyTimeout      time.Duration // 0: 5s
	SnapshotInterval  time.Duration // 0: 2m
	SnapshotThreshold uint64        // 0: 1024 entries
	// LeaderlessGrace (0: 3s) is how old this node's last contact with a
	// raft leader may grow before it withholds every answer and fails
	// readiness (see confirm/withhold.go); it answers again once it has a leader
	// and has caught up. Keep it above a failover (about 2s).
	LeaderlessGrace time.Duration
	// ConfirmTimeout (0: DefaultConfirmTimeout) is how long a check waits
	// for its confirmation (confirm/round.go) before it is answered nothing.
	ConfirmTimeout time.Duration
	// ConfirmWindow (0: DefaultConfirmWindow) is how long the confirmation
	// loop waits after the first check that wants a round before it starts
	// it, so that more checks share it.
	ConfirmWindow time.Duration
	// legacyReadIndex (tests) plays a release before the read-index query:
	// "readindex" and "ack" are answered null.
	legacyReadIndex bool
	// ackHedge (tests; 0: confirm's default) is how long the leader's
	// round waits for the voters it asked first before it asks the rest.
	ackHedge time.Duration
	// afterBarrier (tests) runs in the leader duty when raft's Barrier
	// returned, before its term is checked.
	afterBarrier func()
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
	case o.TLS != nil && o.TLSFiles != nil:
		return errors.New("cluster: Options.TLS and Options.TLSFiles are both set: give one")
	case o.TLSReloadInterval < 0:
		return fmt.Errorf("cluster: TLS reload interval %s is negative: set --raft-tls-reload-interval to a positive duration", o.TLSReloadInterval)
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
	for _, id := range o.BootstrapWithout {
		switch {
		case id == o.ID:
			return fmt.Errorf("cluster: --bootstrap-without %q names this replica: list the peers that are gone for good", id)
		case !slices.ContainsFunc(o.Peers, func(p Peer) bool { return p.ID == id }):
			return fmt.Errorf("cluster: --bootstrap-without %q is not in --peers", id)
		}
	}
	var err error
	if o.PortLimits, err = o.PortLimits.WithDefaults(); err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	if err := raftport.CheckTLS(o.TLS); err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	o.Ramp = o.Ramp.WithDefaults()
	if err := o.Ramp.Validate(); err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	o.KVFailoverAfter = cmp.Or(o.KVFailoverAfter, 30*time.Second)
	o.KVStaleAfter = cmp.Or(o.KVStaleAfter, DefaultKVStaleAfter)
	o.ApplyTimeout = cmp.Or(o.ApplyTimeout, 5*time.Second)
	o.SnapshotInterval = cmp.Or(o.SnapshotInterval, 2*time.Minute)
	o.SnapshotThreshold = cmp.Or(o.SnapshotThreshold, 1024)
	o.HeartbeatTimeout = cmp.Or(o.HeartbeatTimeout, time.Second)
	o.ElectionTimeout = cmp.Or(o.ElectionTimeout, time.Second)
	o.LeaderlessGrace = cmp.Or(o.LeaderlessGrace, DefaultLeaderlessGrace)
	o.ConfirmTimeout = cmp.Or(o.ConfirmTimeout, DefaultConfirmTimeout)
	if o.ConfirmTimeout < 0 {
		return fmt.Errorf("cluster: confirm timeout %s is negative: set --confirm-timeout to a positive duration, e.g. %s", o.ConfirmTimeout, DefaultConfirmTimeout)
	}
	if o.ConfirmWindow < 0 {
		return fmt.Errorf("cluster: confirm window %s is negative: use 0 for none", o.ConfirmWindow)
	}
	if err := CheckLeaderlessGrace(o.LeaderlessGrace); err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	return nil
}

// Node is one hastate raft replica: raft, wired to its parts (the raft
// port, the state machine, confirmed reads, the leader's duties), and the
// node's own view of the cluster (status, readiness, peer queries, the
// leader's KV report).
type Node struct {
	opts      Options
	log       *zap.Logger
	raft      *raft.Raft
	fsm       *fsm.FSM
	store     *raftboltdb.BoltStore
	transport *raft.NetworkTransport
	logs      raft.LogStore // the log store behind raft (its cache included)
	stream    *raftport.Layer
	reads     *confirm.Reads
	duties    *leader.Duties
	metrics   *metrics
	observer  *raft.Observer
	kvState

	// hadState: raft state was in --data-dir at start. bootDetail and
	// bootPeers say why a node without it does not bootstrap yet and
	// which peers it waits for (bootstrap.go); empty when it does not wait.
	hadState   bool
	bootMu     sync.Mutex
	bootDetail string
	bootPeers  []string

	stop    chan struct{}
	release chan struct{} // a large change was applied (see releaseLoop)
	wg      sync.WaitGroup
	// stops holds the stop of every step New took; Shutdown runs them
	// last-first, and so does a New that fails half-way.
	stops lifecycle.Stops
}

// New opens (or creates) the node's raft state in DataDir and starts raft.
// A node with no raft state bootstraps with Options.Peers; every node may do
// so with the same list. Each step registers its stop (n.stops), so a New
// that fails stops what it started, and Shutdown is the same list.
func New(o Options) (_ *Node, err error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(o.DataDir, 0o750); err != nil {
		return nil, fmt.Errorf("cluster: data dir %s: %w", o.DataDir, err)
	}
	if o.TLSFiles != nil {
		addrs := []string{o.Advertise}
		for _, p := range o.Peers {
			addrs = append(addrs, p.Address)
		}
		o.TLSFiles.PinDefault(addrs)
		o.TLS = o.TLSFiles.Config()
		if o.TLSReloadInterval == 0 {
			o.TLSReloadInterval = raftport.DefaultTLSReloadInterval
		}
	}
	n := &Node{opts: o, log: o.Logger, stop: make(chan struct{}), release: make(chan struct{}, 1)}
	defer func() {
		if err != nil {
			_ = n.stops.Stop(context.Background())
		}
	}()
	n.started = time.Now()
	n.leaderSeen.Store(n.started.UnixNano())
	// The metrics exist before raft starts: the FSM reports into them as
	// soon as raft applies an entry, and confirmed reads as soon as the
	// FSM advances.
	n.metrics = newMetrics(n)
	n.fsm = fsm.New(fsm.Options{
		MaxLevel:      o.MaxLevel,
		Stepped:       func(k int) { n.metrics.rampSteps.Add(float64(k)) },
		Lag:           func(d time.Duration) { n.metrics.entryLag.Observe(d.Seconds()) },
		Large:         n.noteLarge,
		Advanced:      func() { n.reads.Advanced() },
		NotUnderstood: func(err error) { n.reads.NotUnderstood(err) },
		Rejected: func(err error) {
			n.metrics.applyErrors.Inc()
			n.log.Error("raft entry not applied as written; every replica skips it the same way (report this with the entry's index)", zap.Error(err))
		},
	})

	store, err := raftboltdb.NewBoltStore(filepath.Join(o.DataDir, "raft.db"))
	if err != nil {
		return nil, fmt.Errorf("cluster: open raft log %s: %w (is another hastate using this --data-dir?)", filepath.Join(o.DataDir, "raft.db"), err)
	}
	n.store = store
	n.stops.Add("raft log store", func(context.Context) error { return store.Close() })
	logs := fsm.NewLogCache(logCacheEntries, store) // see fsm/logcache.go
	n.logs = logs
	hlog := newHCLog(o.Logger, "raft")
	snaps, err := raft.NewFileSnapshotStoreWithLogger(o.DataDir, 3, hlog)
	if err != nil {
		return nil, fmt.Errorf("cluster: snapshot store in %s: %w", o.DataDir, err)
	}
	sl, err := raftport.New(raftport.Config{
		Bind: o.BindAddr, Advertise: o.Advertise, TLS: o.TLS, Status: n.peerStatus, Queries: n.queries(), ArgQueries: o.PeerArgQueries, Lines: n.lineQueries(),
		Log: o.Logger.Named("transport"), Metrics: n.metrics.port, Peers: len(o.Peers), Limits: o.PortLimits,
	})
	if err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	n.stream = sl
	n.reads = confirm.New(confirm.Options{
		ID: o.ID, State: n.fsm, Log: logs, Transport: portTransport{sl}, Dial: n.dialServer,
		Timeout: o.ConfirmTimeout, Window: o.ConfirmWindow, Grace: o.LeaderlessGrace, AckHedge: o.ackHedge,
		Started: n.started, Logger: o.Logger,
	})
	n.transport = raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream: sl, MaxPool: 3, Timeout: 5 * time.Second, Logger: hlog,
		ServerAddressProvider: newDialOverride(o),
		// No pipelined replication: raft (v1.7.3) can deadlock it (see
		// raftport.NoPipelining).
		MaxRPCsInFlight: raftport.NoPipelining,
	})
	n.stops.Add("raft transport", func(context.Context) error {
		n.transport.CloseStreams()
		return n.transport.Close() // closes the stream layer's listener
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
	// Entries kept after a snapshot, for followers a little behind: four
	// snapshots' worth (4096 at the default threshold of 1024). A
	// follower further behind, or one whose disk was lost, installs the
	// leader's snapshot (a test lowers the threshold to make that happen).
	cfg.TrailingLogs = 4 * o.SnapshotThreshold
	cfg.CommitTimeout = commitTimeout

	hasState, err := raft.HasExistingState(store, store, snaps)
	if err != nil {
		return nil, fmt.Errorf("cluster: read raft state in %s: %w", o.DataDir, err)
	}
	// Raft dials through the patient transport (raftport/redial.go).
	trans := &raftport.PatientTransport{NetworkTransport: n.transport}
	r, err := raft.NewRaft(cfg, n.fsm, logs, store, snaps, trans)
	if err != nil {
		return nil, fmt.Errorf("cluster: start raft: %w", err)
	}
	n.raft = r
	trans.SetRaft(r)
	// After raft's Shutdown (the steps run last-first), before the store
	// closes: a heartbeat in flight may still save a term (heartbeat.go).
	n.stops.Add("raft heartbeats", func(context.Context) error { trans.StopHeartbeats(); return nil })
	n.stops.Add("raft", func(context.Context) error { return r.Shutdown().Error() })
	// A snapshot older than version 3 does not carry the FSM's index; the
	// snapshot's own raft index is as good.
	if v, err := strconv.ParseUint(r.Stats()["last_snapshot_index"], 10, 64); err == nil && v > 0 {
		n.fsm.StartIndex(v)
	}
	n.duties = leader.New(leader.Options{
		ID: o.ID, Raft: r, FSM: n.fsm, Peers: peers{n}, BarrierDone: n.reads.BarrierDone, ConsulHealth: o.ConsulHealth, Duty: o.LeaderDuty,
		Ramp: o.Ramp, Now: o.Now, ApplyTimeout: o.ApplyTimeout, KVFailoverAfter: o.KVFailoverAfter, HAProxySyncEvery: o.HAProxySyncEvery,
		Logger: o.Logger, AfterBarrier: o.afterBarrier,
	})
	n.hadState = hasState
	var servers []raft.Server // the configuration the bootstrap loop uses
	if !hasState {
		servers = []raft.Server{{ID: raft.ServerID(o.ID), Address: raft.ServerAddress(o.Advertise), Suffrage: raft.Voter}}
		if len(o.Peers) > 0 {
			servers = servers[:0]
			for _, p := range o.Peers {
				servers = append(servers, raft.Server{ID: raft.ServerID(p.ID), Address: raft.ServerAddress(p.Address), Suffrage: raft.Voter})
			}
		}
		if len(servers) > 1 {
			// A node of several asks its peers first (bootstrap.go); its
			// status query is served meanwhile.
			n.setBootstrapWait("no raft state: asking the peers of --peers whether one holds the cluster before bootstrapping", nil)
		} else {
			if err := r.BootstrapCluster(raft.Configuration{Servers: servers}).Error(); err != nil && !errors.Is(err, raft.ErrCantBootstrap) {
				n.log.Warn("raft bootstrap", zap.Error(err))
			}
			n.log.Info("raft bootstrapped", zap.Int("servers", 1))
			servers = nil
		}
	} else if len(o.BootstrapWithout) > 0 {
		n.log.Warn("--bootstrap-without is set but this replica holds raft state, so it does not bootstrap: remove the flag (left on, a replica whose disk is lost later would bootstrap without those peers)",
			zap.Strings("bootstrap_without", o.BootstrapWithout))
	}

	if o.Registerer != nil {
		if err := o.Registerer.Register(n.metrics); err != nil {
			return nil, fmt.Errorf("cluster: register metrics: %w", err)
		}
		n.stops.Add("metrics", func(context.Context) error {
			o.Registerer.Unregister(n.metrics)
			return nil
		})
	}
	obs := make(chan raft.Observation, 16)
	n.observer = raft.NewObserver(obs, false, func(o *raft.Observation) bool {
		_, ok := o.Data.(raft.LeaderObservation)
		return ok
	})
	r.RegisterObserver(n.observer)
	n.stops.Add("raft observer", func(context.Context) error {
		r.DeregisterObserver(n.observer)
		return nil
	})

	// Confirmed reads run before the port answers queries: a follower's
	// read-index request is answered by them.
	n.reads.Start(raftView{r})
	n.stops.Add("confirmed reads", func(context.Context) error {
		n.reads.Stop()
		return nil
	})
	sl.ServeQueries()
	if servers != nil {
		n.wg.Add(1)
		go n.bootstrap(r, servers) // see bootstrap.go: not while a peer may hold the cluster
	}
	if o.TLSFiles != nil {
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			o.TLSFiles.ReloadLoop(n.stop, o.TLSReloadInterval, n.log.Named("tls"))
		}()
	}
	n.wg.Add(4)
	go n.leadershipLoop(notify)
	go n.observeLoop(obs)
	go n.leaderReportLoop()
	go n.releaseLoop()
	n.stops.Add("node loops", func(context.Context) error {
		close(n.stop)
		n.wg.Wait()
		return nil
	})
	// Registered last, so it runs first: a leader hands over leadership
	// while everything above still runs.
	n.stops.Add("leadership hand-over", func(ctx context.Context) error {
		n.HandOver(ctx)
		return nil
	})
	return n, nil
}

// Snapshot returns the current serving snapshot (nil while the node holds
// no state). It never blocks.
func (n *Node) Snapshot() *state.Snapshot { return n.fsm.Serving() }

// Shutdown hands leadership to another voter when this node leads (bounded
// by ctx), stops the leader duty, then stops raft and closes the stores:
// the stops of New's steps, last-first. Safe to call more than once.
func (n *Node) Shutdown(ctx context.Context) error { return n.stops.Stop(ctx) }
