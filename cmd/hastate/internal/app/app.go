// Package app wires one hastate replica: the raft node, the Consul watcher
// that runs as the leader's duty, the agent-check server and the HTTP
// server. It owns their start order and their stop order. cmd/hastate and
// the tests start replicas through it.
package app

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	consul "github.com/hashicorp/consul/api"
	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/cluster"
	"github.com/hastate/hastate/cluster/leader"
	"github.com/hastate/hastate/cluster/raftport"
	"github.com/hastate/hastate/internal/lifecycle"
	"github.com/hastate/hastate/internal/version"
	"github.com/hastate/hastate/kvsync"
	"github.com/hastate/hastate/server"
	"github.com/hastate/hastate/state"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"go.uber.org/zap"
)

// Options configure a replica. Zero values get the defaults of DESIGN.md.
type Options struct {
	NodeID string // required
	// FeatureLevel caps the feature level this replica advertises (0: this
	// release's; see cluster.Options.MaxLevel).
	FeatureLevel  int
	AgentAddr     string // "": ":9777"
	HTTPAddr      string // "": ":9778"
	RaftAddr      string // "": ":9779"
	RaftAdvertise string // "": <NodeID>:<raft port>
	Peers         []cluster.Peer
	// RaftDial dials some peers at another address (see cluster.Options.DialOverride).
	RaftDial   map[string]string
	DataDir    string // required
	KVPrefix   string // "": "hastate/"
	ConsulAddr string // "": CONSUL_HTTP_ADDR, else 127.0.0.1:8500
	// ConsulTokenFile is the Consul token's file, read again every second
	// so that a rotated token (a Kubernetes Secret volume) needs no
	// restart; "": CONSUL_HTTP_TOKEN_FILE, else CONSUL_HTTP_TOKEN, else no
	// token (Consul's anonymous token).
	ConsulTokenFile string

	// BootstrapWithout: peers declared gone for good (cluster.Options).
	BootstrapWithout []string

	// AgentReadTimeout and AgentQuietPeriod tune the agent protocol (0: defaults).
	AgentReadTimeout time.Duration
	AgentQuietPeriod time.Duration
	// Ramp is the undrain ramp policy (flags); <prefix>config/ramp in KV
	// overrides it. The zero value means no ramps; cmd/hastate defaults
	// to state.DefaultRampPolicy().
	Ramp state.RampPolicy
	// KVFailoverAfter: a leader that cannot reach Consul this long hands
	// leadership to a follower that can (0: 30s; negative: never).
	KVFailoverAfter time.Duration
	// KVWait is the leader's blocking-query wait (0: DefaultKVWait; 1s to
	// Consul's 10m). The mirror counts as in sync only as of the watch's
	// last answer, so the sync age of a quiet prefix grows to about it;
	// and a proxy whose idle timeout is shorter fails every quiet query.
	KVWait time.Duration
	// LeaderlessGrace: a replica whose last contact with a raft leader is
	// older than this withholds every answer and fails readiness (0: 3s).
	LeaderlessGrace time.Duration
	// ConfirmTimeout: a check that no confirmation round (a read index from
	// the raft leader) confirms within this is answered nothing (0:
	// cluster.DefaultConfirmTimeout).
	// ConfirmWindow: how long a round waits for more checks to share it
	// (0: none). See cluster/DESIGN.md.
	ConfirmTimeout time.Duration
	ConfirmWindow  time.Duration
	// SnapshotInterval and SnapshotThreshold tune raft snapshots (0: 2m, 1024 entries).
	SnapshotInterval  time.Duration
	SnapshotThreshold uint64
	// RaftTLS, when set, secures the raft port with mutual TLS from files
	// the node re-reads every RaftTLSReloadInterval (0:
	// raftport.DefaultTLSReloadInterval).
	RaftTLS               *raftport.RaftTLS
	RaftTLSReloadInterval time.Duration
	// The HTTP server's limits, so that no client holds a connection of
	// --http-addr forever. HTTPReadTimeout bounds reading a request
	// (0: 10s); HTTPWriteTimeout bounds a request from the end of its
	// headers to the end of its answer (0: 30s: /v1/cluster and
	// /v1/pollers?scope=cluster ask the peers over the raft port, 2s each);
	// HTTPIdleTimeout closes a keep-alive connection that has been idle
	// this long (0: 60s); HTTPMaxHeaderBytes bounds the request headers
	// (0: 64 KiB).
	HTTPReadTimeout    time.Duration
	HTTPWriteTimeout   time.Duration
	HTTPIdleTimeout    time.Duration
	HTTPMaxHeaderBytes int
	// PollersMax bounds the (HAProxy, server) pairs this replica remembers
	// for /v1/pollers and `hastate wait`; new pairs beyond it are dropped
	// and counted (0: server.DefaultMaxPollers; negative is refused).
	PollersMax int
	// NoDesiredMetrics turns off hastate_desired_answer and
	// hastate_desired_changed_timestamp_seconds (--desired-metrics=false):
	// one series per server this replica knows (two for 10 minutes after
	// its answer changed), which the drift alerts join with HAProxy's
	// exporter. Zero: exported.
	NoDesiredMetrics bool
	// PeerReadChunk is the most polls one raft-port answer carries when
	// this replica reads a peer's poller table (0: 250,000 summarized
	// polls, 50,000 polls of /v1/pollers); a test lowers it to read a
	// small table in several chunks.
	PeerReadChunk int
	// ShutdownTimeout bounds Stop when its context has no deadline (0: 20s).
	ShutdownTimeout time.Duration
	// ShutdownDelay is how long PrepareStop keeps the replica answering probes
	// with readiness failing, so that a load balancer in front stops
	// sending probes here before the agent listener closes (0: none).
	ShutdownDelay time.Duration
	// ReadyWhileStopping keeps readiness passing during ShutdownDelay
	// (it still fails for every other reason). For Kubernetes with
	// externalTrafficPolicy Local: kube-proxy goes on forwarding to a
	// terminating pod only while it is serving (ready), and the node's
	// health check, which counts no terminating pod, takes the node out
	// of the load balancer meanwhile (KEP-1669). Off: readiness fails at
	// once, for load balancers that check /-/readiness themselves.
	ReadyWhileStopping bool

	Logger *zap.Logger // nil: no logs
	// Registry receives every metric of the replica (nil: a new one).
	Registry *prometheus.Registry
}

// DefaultKVWait is the leader's Consul blocking-query wait: short enough
// that a quiet prefix's sync age (the watch answers at least this often)
// stays below the 15s past which the KV view warns, and below common proxy
// idle timeouts (30-60s); each wait that ends costs one listing's bytes.
const DefaultKVWait = 10 * time.Second

// ErrInvalidOptions is what every error of New's validation Is: a flag
// (an Options field) is wrong, and the message names it and what to set.
// cmd/hastate exits 2 for it, as for any other usage error.
var ErrInvalidOptions = errors.New("invalid options")

// optionsError marks err as ErrInvalidOptions without changing its text.
type optionsError struct{ error }

func (e optionsError) Unwrap() error      { return e.error }
func (optionsError) Is(target error) bool { return target == ErrInvalidOptions }

// validate is the one place the replica's configuration is checked and its
// defaults are set: cmd/hastate only translates flags into Options.
func (o *Options) validate() error {
	if o.NodeID == "" {
		return errors.New("node id is empty: set --node-id")
	}
	if o.DataDir == "" {
		return errors.New("data dir is empty: set --data-dir to a persistent directory")
	}
	o.AgentAddr = cmp.Or(o.AgentAddr, ":9777")
	o.HTTPAddr = cmp.Or(o.HTTPAddr, ":9778")
	o.RaftAddr = cmp.Or(o.RaftAddr, ":9779")
	o.KVPrefix = cmp.Or(o.KVPrefix, "hastate/")
	if o.RaftAdvertise == "" {
		_, port, err := net.SplitHostPort(o.RaftAddr)
		if err != nil {
			return fmt.Errorf("--raft-addr %q: %w", o.RaftAddr, err)
		}
		o.RaftAdvertise = net.JoinHostPort(o.NodeID, port)
	}
	o.Ramp = o.Ramp.WithDefaults()
	if err := o.Ramp.Validate(); err != nil {
		return fmt.Errorf("ramp flags: %w", err)
	}
	if err := kvsync.CheckPrefix(o.KVPrefix); err != nil {
		return fmt.Errorf("--kv-prefix: %w", err)
	}
	o.KVWait = cmp.Or(o.KVWait, DefaultKVWait)
	if o.KVWait < time.Second || o.KVWait > 10*time.Minute {
		return fmt.Errorf("--kv-wait %s: want 1s to 10m (Consul's limit), e.g. %s", o.KVWait, DefaultKVWait)
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
	}
	o.ShutdownTimeout = cmp.Or(o.ShutdownTimeout, 20*time.Second)
	for _, d := range []struct {
		v    *time.Duration
		def  time.Duration
		name string
	}{
		{&o.HTTPReadTimeout, 10 * time.Second, "HTTPReadTimeout"},
		{&o.HTTPWriteTimeout, 30 * time.Second, "HTTPWriteTimeout"},
		{&o.HTTPIdleTimeout, 60 * time.Second, "HTTPIdleTimeout"},
	} {
		if *d.v < 0 {
			return fmt.Errorf("%s %s is negative: leave it 0 for %s", d.name, *d.v, d.def)
		}
		*d.v = cmp.Or(*d.v, d.def)
	}
	if o.HTTPMaxHeaderBytes < 0 {
		return fmt.Errorf("HTTPMaxHeaderBytes %d is negative: leave it 0 for 64 KiB", o.HTTPMaxHeaderBytes)
	}
	o.HTTPMaxHeaderBytes = cmp.Or(o.HTTPMaxHeaderBytes, 64<<10)
	if err := cluster.CheckLeaderlessGrace(o.LeaderlessGrace); err != nil {
		return err
	}
	if o.ConfirmWindow < 0 {
		return fmt.Errorf("--confirm-window %s is negative: set 0 (no wait) or a positive duration", o.ConfirmWindow)
	}
	if o.ConfirmTimeout < 0 || (o.ConfirmTimeout > 0 && o.ConfirmTimeout < time.Millisecond) {
		return fmt.Errorf("--confirm-timeout %s is too short for a round trip to the raft leader: set at least 1ms, e.g. %s", o.ConfirmTimeout, cluster.DefaultConfirmTimeout)
	}
	if o.PeerReadChunk < 0 {
		return fmt.Errorf("--peer-read-chunk %d is negative: set a positive number of polls, or 0 for the defaults", o.PeerReadChunk)
	}
	if o.PollersMax < 0 {
		return fmt.Errorf("--pollers-max %d is negative: set a positive number of (HAProxy, server) pairs, or 0 for %d", o.PollersMax, server.DefaultMaxPollers)
	}
	if o.FeatureLevel < 0 || o.FeatureLevel > state.MaxLevel {
		return fmt.Errorf("--feature-level %d: want 1 to %d, or 0 for this release's %d", o.FeatureLevel, state.MaxLevel, state.MaxLevel)
	}
	return nil
}

// App is one running replica.
type App struct {
	o      Options
	log    *zap.Logger
	consul *consul.Client
	token  *kvsync.Token // the token consul sends, re-read from its file
	kvm    *kvsync.Metrics
	node   *cluster.Node
	agent  *server.AgentServer
	http   *http.Server

	agentLn, httpLn net.Listener
	watcher         atomic.Pointer[kvsync.Watcher]
	probe           *kvsync.Probe
	consulID        atomic.Pointer[api.ConsulIdentity] // see readConsulIdentity
	// source is the mirror source this replica reads (nil until its
	// Consul's identity was first read); see identify.
	source atomic.Pointer[state.MirrorSource]
	// nodeRef is node, for the goroutines Start begins before it exists.
	nodeRef atomic.Pointer[cluster.Node]
	pollers *server.Pollers
	// stops holds the stop of every step Start took; Stop runs them
	// last-first (see Start for the order).
	stops    lifecycle.Stops
	serveWG  sync.WaitGroup // the goroutines Start began
	stopping atomic.Bool    // PrepareStop began: readiness fails
	// failed receives the error of a listener that stopped for another
	// reason than Stop (see Failed).
	failed chan error
	// newWatcher builds the leader's Consul watch (tests replace it).
	newWatcher func() (*kvsync.Watcher, error)
}

// New validates the options and builds the replica; Start runs it.
func New(o Options) (*App, error) {
	if err := o.validate(); err != nil {
		return nil, optionsError{err}
	}
	reg := o.Registry
	token, err := kvsync.NewToken(kvsync.TokenOptions{File: o.ConsulTokenFile, Logger: o.Logger.Named("consul-token"), Registerer: reg})
	if err != nil {
		return nil, optionsError{err}
	}
	consul, err := kvsync.NewTokenClient(o.ConsulAddr, token)
	if err != nil {
		return nil, fmt.Errorf("consul client for %q: %w (check --consul-addr / CONSUL_HTTP_ADDR and the CONSUL_* TLS variables)", o.ConsulAddr, err)
	}
	a := &App{o: o, log: o.Logger, consul: consul, token: token, failed: make(chan error, 2)}
	a.newWatcher = a.defaultWatcher
	if a.pollers, err = server.NewPollers(server.PollersOptions{Max: o.PollersMax, Registerer: reg}); err != nil {
		return nil, err
	}
	if !o.NoDesiredMetrics {
		// A replica that is not ready (no state, behind or cut off from
		// the leader) may hold a stale answer: it exports none, so that
		// the drift alerts read only the replicas in sync.
		reg.MustRegister(server.NewDesiredCollector(server.DesiredOptions{Pollers: a.pollers, Snapshot: func() *state.Snapshot {
			if n := a.nodeRef.Load(); n != nil {
				if ok, _ := n.Ready(); ok {
					return n.Snapshot()
				}
			}
			return nil
		}}))
	}
	build := version.Get()
	// The Go runtime's and the process's collectors are not metrics
	// promauto builds: they are registered as they are.
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	promauto.With(reg).NewGaugeFunc(prometheus.GaugeOpts{
		Name: "hastate_build_info", Help: "Per replica: build information (version, git revision, Go version); always 1.",
		ConstLabels: prometheus.Labels{"version": build.Version, "revision": build.Revision, "goversion": build.GoVersion},
	}, func() float64 { return 1 })
	a.kvm = kvsync.NewMetrics(reg)
	a.probe, err = kvsync.NewProbe(kvsync.ProbeOptions{Client: consul, Prefix: o.KVPrefix, Logger: o.Logger.Named("consul-probe"), Registerer: reg, Token: token})
	if err != nil {
		return nil, err
	}
	// The first stop registered runs last, after everything Start began.
	a.stops.Add("goroutines", func(context.Context) error {
		a.serveWG.Wait()
		a.log.Info("hastate stopped")
		return nil
	})
	return a, nil
}

// Start binds the listeners, starts raft and begins serving. Each step
// registers its stop; Stop runs them last-first, and so does a Start that
// fails half-way. The order of the steps is therefore the order of the
// stops reversed: the agent-check listener is bound first so that it
// closes last (HAProxy's probes are answered while HTTP and raft shut
// down); the HTTP server is served last so that it stops first.
func (a *App) Start(ctx context.Context) (err error) {
	defer func() {
		if err != nil {
			_ = a.Stop(context.Background())
		}
	}()
	bgCtx, stopBackground := context.WithCancel(context.Background())
	a.stops.Add("probe and pollers sweep", func(context.Context) error {
		stopBackground()
		return nil
	})
	a.serveWG.Add(5)
	go func() {
		defer a.serveWG.Done()
		_ = a.probe.Run(bgCtx)
	}()
	go func() {
		defer a.serveWG.Done()
		_ = a.token.Run(bgCtx, a.consul)
	}()
	go func() {
		defer a.serveWG.Done()
		a.logVerdict(bgCtx)
	}()
	go func() {
		defer a.serveWG.Done()
		a.readConsulIdentity(bgCtx)
	}()
	go func() {
		defer a.serveWG.Done()
		a.sweepPollers(bgCtx)
	}()

	a.agent, err = server.NewAgentServer(server.AgentOptions{
		Source: agentSource{a}, Logger: a.log.Named("agent"), Registerer: a.o.Registry,
		ReadTimeout: a.o.AgentReadTimeout, QuietPeriod: a.o.AgentQuietPeriod, Pollers: a.pollers,
	})
	if err != nil {
		return err
	}
	a.agentLn, err = server.ListenAgent(bgCtx, a.o.AgentAddr)
	if err != nil {
		return fmt.Errorf("agent listener %s: %w (is another process on --agent-addr?)", a.o.AgentAddr, err)
	}
	a.stops.Add("agent-check listener", func(ctx context.Context) error {
		// Shutdown closes the listener Serve was given; closing it here
		// too covers a Start that failed before Serve.
		return errors.Join(a.agent.Shutdown(ctx), closeListener(a.agentLn))
	})
	a.httpLn, err = net.Listen("tcp", a.o.HTTPAddr)
	if err != nil {
		return fmt.Errorf("http listener %s: %w (is another process on --http-addr?)", a.o.HTTPAddr, err)
	}
	a.stops.Add("HTTP listener", func(context.Context) error { return closeListener(a.httpLn) })
	a.node, err = cluster.New(cluster.Options{
		ID: a.o.NodeID, BindAddr: a.o.RaftAddr, Advertise: a.o.RaftAdvertise, Peers: a.o.Peers,
		DataDir: a.o.DataDir, Logger: a.log.Named("cluster"), Registerer: a.o.Registry,
		LeaderDuty: a.watchConsul, Version: version.Get().Version, MaxLevel: a.o.FeatureLevel, TLSFiles: a.o.RaftTLS, TLSReloadInterval: a.o.RaftTLSReloadInterval, DialOverride: a.o.RaftDial, BootstrapWithout: a.o.BootstrapWithout,
		PeerQueries: map[string]func() any{pollersQuery: func() any {
			return a.pollers.List(time.Now().Add(-server.PollerWindow))
		}},
		PeerArgQueries: map[string]func(json.RawMessage) any{server.PollsQuery: func(raw json.RawMessage) any {
			return a.pollers.AnswerPolls(raw, a.o.NodeID)
		}, server.PollSummaryQuery: a.pollers.AnswerSummary},
		Sightings: func() cluster.Sightings {
			now := time.Now()
			return a.pollers.Sightings(now.Add(-server.PollerWindow), now)
		},
		ConsulHealth: a.consulHealth, KVFailoverAfter: a.o.KVFailoverAfter, KVStaleAfter: max(cluster.DefaultKVStaleAfter, a.o.KVWait+a.o.KVWait/16+5*time.Second),
		SnapshotInterval: a.o.SnapshotInterval, SnapshotThreshold: a.o.SnapshotThreshold,
		Ramp: a.o.Ramp, LeaderlessGrace: a.o.LeaderlessGrace, ConfirmTimeout: a.o.ConfirmTimeout, ConfirmWindow: a.o.ConfirmWindow,
	})
	if err != nil {
		return err
	}
	a.nodeRef.Store(a.node)
	a.stops.Add("raft node", a.node.Shutdown)
	a.serveWG.Add(1)
	go func() {
		defer a.serveWG.Done()
		select {
		case err := <-a.node.ListenerFailed(): // its accept loop ended (not by Shutdown)
			a.fail("raft listener", err, nil)
		case <-bgCtx.Done():
		}
	}()
	promauto.With(a.o.Registry).NewGaugeFunc(prometheus.GaugeOpts{
		Name: "hastate_ready",
		Help: "Per replica: 1 when /-/readiness answers 200 (the replica holds state, has caught up with a raft leader since it started and since it was last cut off, its last contact with a leader is within --leaderless-grace, and it is not shutting down), else 0. A loss of Consul does not make it 0.",
	}, func() float64 {
		if ok, _ := (replica{a}).Ready(); ok {
			return 1
		}
		return 0
	})
	a.http = &http.Server{
		Handler: server.NewHTTPHandler(server.HTTPOptions{Replica: replica{a}, Gatherer: a.o.Registry, Logger: a.log.Named("http"),
			Pollers: a.pollers, NodeID: a.o.NodeID, Raw: a.node.Raw}),
		ReadHeaderTimeout: min(5*time.Second, a.o.HTTPReadTimeout),
		ReadTimeout:       a.o.HTTPReadTimeout,
		WriteTimeout:      a.o.HTTPWriteTimeout,
		IdleTimeout:       a.o.HTTPIdleTimeout,
		MaxHeaderBytes:    a.o.HTTPMaxHeaderBytes,
		ErrorLog:          zap.NewStdLog(a.log.Named("http")),
	}
	a.serveWG.Add(2)
	go func() {
		defer a.serveWG.Done()
		a.fail("agent-check listener", a.agent.Serve(a.agentLn), server.ErrServerClosed)
	}()
	go func() {
		defer a.serveWG.Done()
		a.fail("HTTP listener", a.http.Serve(a.httpLn), http.ErrServerClosed)
	}()
	a.stops.Add("HTTP server", a.http.Shutdown)
	a.log.Info("hastate started",
		zap.String("agent_addr", a.agentLn.Addr().String()), zap.String("http_addr", a.httpLn.Addr().String()),
		zap.String("raft_addr", a.o.RaftAddr), zap.String("raft_advertise", a.o.RaftAdvertise),
		zap.Int("peers", len(a.o.Peers)), zap.String("kv_prefix", a.o.KVPrefix), zap.String("data_dir", a.o.DataDir))
	return nil
}

// fail reports a listener's Serve that returned: unless it was stopped
// (closed), the replica can no longer do its job while it may still look
// ready, so Failed tells the owner to exit.
func (a *App) fail(what string, err, closed error) {
	if errors.Is(err, closed) {
		return
	}
	err = fmt.Errorf("%s stopped: %w", what, err)
	a.log.Error("a listener stopped while the replica runs; exiting so that it is restarted", zap.Error(err))
	select {
	case a.failed <- err:
	default:
	}
}

// Failed receives an error when a listener stops for another reason than
// Stop. The replica is then broken (it may still look ready), and its owner
// should Stop it and exit non-zero so that it is restarted.
func (a *App) Failed() <-chan error { return a.failed }

// watchConsul is the leader's duty: mirror the KV prefix into raft. It
// returns an error when the watch cannot be built, and the node then hands
// leadership to another replica.
func (a *App) watchConsul(ctx context.Context) error {
	w, err := a.newWatcher()
	if err != nil {
		return fmt.Errorf("cannot build the Consul watch: %w", err)
	}
	a.watcher.Store(w)
	defer a.watcher.Store(nil)
	a.log.Info("leader: watching Consul KV", zap.String("prefix", a.o.KVPrefix))
	_ = w.Run(ctx)
	a.log.Info("leader duty ended: Consul watch stopped")
	return nil
}

// KVBackoffMax caps the leader's wait between failed Consul reads:
// Consul is close by, so a recovery is seen within it (the README and the
// runbook say this figure; TestDocsSayTheCode holds them to it).
const KVBackoffMax = 5 * time.Second

func (a *App) defaultWatcher() (*kvsync.Watcher, error) {
	return kvsync.New(kvsync.Options{
		Client: a.consul, Prefix: a.o.KVPrefix, Sink: &adoptingSink{n: a.node, log: a.log.Named("adopt")}, Logger: a.log.Named("kvsync"), Metrics: a.kvm, Token: a.token,
		BackoffMax: KVBackoffMax, WaitTime: a.o.KVWait, Identify: a.identify,
	})
}

// pollersQuery is the peer query that returns a replica's pollers.
const pollersQuery = "pollers"

func (a *App) sweepPollers(ctx context.Context) {
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			a.pollers.Sweep(now.Add(-server.PollerWindow))
		}
	}
}

// consulHealth is this replica's view of Consul: its probe's, and on the
// leader also whether the watch is delivering. SyncedAt is the watch's own
// last answer (a blocking query answers at least every --kv-wait), never
// the probe's: a probe that succeeds while the watch is stuck would hide
// it. The probe (every 2s) is what notices a dead Consul fast.
func (a *App) consulHealth() leader.ConsulHealth {
	p := a.probe.Health()
	h := leader.ConsulHealth{Reachable: p.Reachable, FailingSince: p.FailingSince, Checked: p.Checked, Verdict: mirrorVerdict(p, a.consulID.Load()),
		Source: a.source.Load(), TokenProblem: p.TokenProblem}
	w := a.watcher.Load()
	if w == nil {
		return h
	}
	st := w.Status()
	if st.TokenProblem != nil {
		// The watch met it first (a listing it did not apply).
		h.TokenProblem = st.TokenProblem
	}
	switch {
	case st.ConsecutiveErrors > 0:
		if r := st.LastErrorReason; r != "" && r != api.MirrorOK && r != api.MirrorOtherCluster && r != api.MirrorOtherPrefix && h.Verdict.CanMirror() {
			// The watch knows better than the probe (the node itself
			// compares the source with the recorded one).
			h.Verdict = api.MirrorVerdict{Reason: r, Detail: st.LastError, Since: st.FailingSince}
		}
		// Consul answers the probe, but the watch fails to read or to
		// apply: the mirror is not in sync.
		h.Reachable = false
		if h.FailingSince.IsZero() || st.FailingSince.Before(h.FailingSince) {
			h.FailingSince = st.FailingSince
		}
		h.SyncedAt = st.LastSuccess
	case !st.LastSuccess.IsZero():
		h.SyncedAt, h.SyncedIndex = st.LastSuccess, st.SyncedIndex
	}
	return h
}

// mirrorVerdict is this replica's answer to "could it mirror Consul into
// raft?" (api.MirrorReason): the probe's verdict (Consul unreachable, not
// Consul, the token) first, since nothing else can be known without it;
// then its Consul's identity (id, the last read of it, nil before the
// first): a replica whose last identity read failed cannot tell which
// cluster it reads, its watch applies nothing (every read it would hand
// over needs its identity), so it must not report that it can mirror,
// or a leader would hand leadership to it, and it on, every
// --kv-failover-after, withholding all the while.
func mirrorVerdict(p kvsync.ProbeHealth, id *api.ConsulIdentity) api.MirrorVerdict {
	switch {
	case p.Verdict.Reason == "":
		return api.MirrorVerdict{Reason: api.MirrorConsulUnreachable, Detail: "not checked yet"}
	case p.Verdict.CanMirror() && id != nil && id.Error != "":
		return api.MirrorVerdict{Reason: api.MirrorConsulUnreachable, Since: id.FailingSince,
			Detail: "Consul answers the KV reads, but which Consul cluster it is cannot be read (" + id.Error +
				"): as leader this replica would apply nothing; check /v1/status/peers and /v1/connect/ca/roots on its Consul agent"}
	}
	return p.Verdict
}

// AgentAddr and HTTPAddr are the bound addresses (useful with port 0).
func (a *App) AgentAddr() net.Addr { return a.agentLn.Addr() }

// HTTPAddr is the bound HTTP address.
func (a *App) HTTPAddr() net.Addr { return a.httpLn.Addr() }

// Node is the raft node.
func (a *App) Node() *cluster.Node { return a.node }

// PrepareStop prepares the replica to stop while it keeps answering: readiness
// fails from now on, so load balancers take the replica out; a leader hands
// leadership over, so the cluster keeps following KV without an election;
// as a follower the replica keeps applying entries, so its answers stay
// current. PrepareStop then waits for ShutdownDelay, or until ctx ends (a second
// signal), and returns. Stop follows. Without a ShutdownDelay, PrepareStop does
// nothing: Stop hands leadership over itself.
func (a *App) PrepareStop(ctx context.Context) {
	if a.o.ShutdownDelay <= 0 {
		return
	}
	a.stopping.Store(true)
	readiness := "readiness fails"
	if a.o.ReadyWhileStopping {
		readiness = "readiness passes (--ready-while-stopping: the platform takes a terminating replica out)"
	}
	a.log.Info("shutdown delay: "+readiness+"; agent probes are answered, and raft followed, until it ends",
		zap.Duration("shutdown_delay", a.o.ShutdownDelay))
	a.node.HandOver(ctx)
	t := time.NewTimer(a.o.ShutdownDelay)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		a.log.Info("shutdown delay cut short")
	}
}

// Stop shuts the replica down in the reverse order of Start's steps: HTTP,
// then raft (a leader hands over leadership first), and the agent listener
// last, so probes keep being answered while raft shuts down; then the
// probe. Safe to call more than once.
func (a *App) Stop(ctx context.Context) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, a.o.ShutdownTimeout)
		defer cancel()
	}
	return a.stops.Stop(ctx)
}

// closeListener closes ln; one closed already (by its server's Shutdown)
// is no error.
func closeListener(ln net.Listener) error {
	if err := ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		return err
	}
	return nil
}

// replica adapts the App to server.Replica.
type replica struct{ a *App }

func (r replica) Snapshot() *state.Snapshot { return r.a.node.Snapshot() }

// agentSource is what the agent answers from: the node's Confirmed
// snapshot, once a confirmation round that began after the check arrived
// succeeded; nil (no answer: HAProxy keeps its state) while the node
// withholds or cannot confirm within --confirm-timeout.
type agentSource struct{ a *App }

var _ server.ArrivalSource = agentSource{}

func (s agentSource) Snapshot() *state.Snapshot { return s.a.node.Confirmed() }

// Arrived and SnapshotSince make agentSource a server.ArrivalSource: the
// confirmation of a check's answer may begin when its connection is
// accepted. A cluster.Arrival is one pointer: as an interface value it
// does not allocate.
func (s agentSource) Arrived() any { return s.a.node.Arrived() }

func (s agentSource) SnapshotSince(arrival any) *state.Snapshot {
	a, _ := arrival.(cluster.Arrival)
	return s.a.node.ConfirmedSince(a)
}

func (r replica) Ready() (bool, string) {
	if r.a.stopping.Load() && !r.a.o.ReadyWhileStopping {
		return false, "shutting down: load balancers should stop sending probes here; probes are still answered until the shutdown delay ends"
	}
	return r.a.node.Ready()
}
func (r replica) ClusterInfo() api.ClusterInfo {
	in := r.a.node.Info()
	in.KVPrefix, in.Consul = r.a.o.KVPrefix, r.a.consulID.Load()
	tok := r.a.token.State()
	tok.Problem = r.a.probe.Health().TokenProblem
	in.ConsulToken = &tok
	return in
}

// readConsulIdentity keeps the identity of the Consul cluster this replica
// reads for /v1/cluster (the CLI checks it before a write) and for the
// mirror verdict: read at start, again every 30s (2s while it fails,
// keeping the last identity read). The leader's watch also reads it
// before it applies (identify).
func (a *App) readConsulIdentity(ctx context.Context) {
	for {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := a.identify(rctx)
		cancel()
		next := 30 * time.Second
		if err != nil {
			next = 2 * time.Second
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(next):
		}
	}
}

// identify reads which Consul cluster this replica reads, keeps it for
// /v1/cluster and the verdict, and returns the mirror source (the watch's
// Identify). A failed read keeps the last identity, with the error.
func (a *App) identify(ctx context.Context) (state.MirrorSource, error) {
	id, err := kvsync.ReadIdentity(ctx, a.consul)
	ns, part := kvsync.Scope(a.o.ConsulAddr)
	ci := &api.ConsulIdentity{Datacenter: id.Datacenter, Cluster: id.Cluster, ClusterID: id.ClusterID, Namespace: ns, Partition: part}
	if err != nil {
		if last := a.consulID.Load(); last != nil {
			ci.Datacenter, ci.Cluster, ci.ClusterID = last.Datacenter, last.Cluster, last.ClusterID
		}
		ci.Error, ci.FailingSince = err.Error(), time.Now()
		if last := a.consulID.Load(); last != nil && last.Error != "" {
			ci.FailingSince = last.FailingSince
		}
		a.consulID.Store(ci)
		return state.MirrorSource{}, err
	}
	a.consulID.Store(ci)
	src := id.Source(a.o.KVPrefix, ns, part)
	if old := a.source.Swap(&src); old == nil || *old != src {
		a.log.Info("this replica's Consul", zap.Stringer("source", &src), zap.Stringer("recorded_in_raft", a.recordedSource()))
	}
	return src, nil
}

// logVerdict logs each change of this replica's mirror verdict: can it
// mirror Consul into raft if it leads, and why not.
func (a *App) logVerdict(ctx context.Context) {
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	var last api.MirrorReason
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n := a.nodeRef.Load()
		if n == nil {
			continue
		}
		v := n.MirrorVerdict()
		if v.Reason == last {
			continue
		}
		fields := []zap.Field{zap.String("reason", string(v.Reason)), zap.String("detail", v.Detail), zap.String("was", string(last)),
			zap.Stringer("source", a.source.Load()), zap.Stringer("recorded_in_raft", n.RecordedSource())}
		if v.CanMirror() {
			a.log.Info("this replica can mirror Consul", fields...)
		} else {
			a.log.Warn("this replica cannot mirror Consul: as leader it applies nothing and hands leadership to a replica that can", fields...)
		}
		last = v.Reason
	}
}

// recordedSource is the source recorded in raft (nil: none, or before
// the node runs).
func (a *App) recordedSource() *state.MirrorSource {
	if n := a.nodeRef.Load(); n != nil {
		return n.RecordedSource()
	}
	return nil
}

// PeerPollers asks the other replicas for their polls that q selects. A
// replica of a release before 0.15.0 does not know the query
// (server.PollsQuery): it is asked for every poll, and they are selected
// here.
func (r replica) PeerPollers(q server.PollsArg) ([]api.Poll, int, []api.ReplicaAnswer) {
	var out []api.Poll
	var answers []api.ReplicaAnswer
	total := 0
	for id, pa := range r.a.node.QueryPeersWith(server.PollsQuery, r.firstPollsChunk(q), peerPollsTimeout) {
		ans, err := r.restOfPolls(id, q, pa)
		if err != nil {
			answers = append(answers, api.ReplicaAnswer{ID: id, Error: err.Error()})
			continue
		}
		out = append(out, ans.Polls...)
		total += ans.Total
		answers = append(answers, api.ReplicaAnswer{ID: id, Answered: true})
	}
	return out, total, answers
}

// firstPollsChunk is what is asked first of each peer for q: a read of
// more polls than one chunk (or of every poll: no limit) is asked in
// chunks, each its own query, so that no answer over the raft port grows
// with the table or the page (1,000,000 pairs are about 150 MB of JSON).
func (r replica) firstPollsChunk(q server.PollsArg) server.PollsArg {
	if c := r.pollsChunk(); q.Limit == 0 || q.Limit > c {
		q.Limit = c
	}
	return q
}

// pollsChunk and summaryChunk are the most polls one answer of a peer
// carries (Options.PeerReadChunk).
func (r replica) pollsChunk() int   { return cmp.Or(r.a.o.PeerReadChunk, peerPollsChunk) }
func (r replica) summaryChunk() int { return cmp.Or(r.a.o.PeerReadChunk, peerSummaryChunk) }

// restOfPolls completes one peer's answer pa to firstPollsChunk(q) up to
// q.Limit polls (0: all): the chunks that follow, each after the last
// poll of the one before, until one comes short; or, from a release that
// does not know server.PollsQuery, every poll, selected here. Each poll
// names the peer.
func (r replica) restOfPolls(id string, q server.PollsArg, pa cluster.PeerAnswer) (*server.PollsAnswer, error) {
	next := r.firstPollsChunk(q)
	ans, err := decodeAnswer[server.PollsAnswer](pa)
	if err != nil || ans == nil {
		ans, err = r.olderPeerPolls(id, q)
	} else {
		for last := ans; err == nil && len(last.Polls) == next.Limit && (q.Limit == 0 || len(ans.Polls) < q.Limit); {
			next.After = api.PollCursor(last.Polls[len(last.Polls)-1])
			if q.Limit > 0 {
				next.Limit = min(next.Limit, q.Limit-len(ans.Polls))
			}
			if last, err = decodeAnswer[server.PollsAnswer](r.a.node.QueryPeerWith(id, server.PollsQuery, next, peerPollsTimeout)); err == nil && last == nil {
				err = fmt.Errorf("replica %s stopped answering %s", id, server.PollsQuery)
			}
			if err == nil {
				ans.Polls = append(ans.Polls, last.Polls...)
			}
		}
	}
	if err != nil {
		return nil, err
	}
	for i := range ans.Polls {
		ans.Polls[i].Replica = id
	}
	return ans, nil
}

// PeerSummaries asks the other replicas for the summary of their polls
// that q selects (server.PollSummaryQuery), each in chunks of at most
// peerSummaryChunk polls (whole servers), so that no answer over the raft
// port grows with the table. A replica that does not know the query (a
// release before it) is asked for its polls (PeerPollers' way), which
// are summarized here.
func (r replica) PeerSummaries(q server.SummaryArg) ([]server.PollSummary, []api.ReplicaAnswer) {
	var out []server.PollSummary
	var answers []api.ReplicaAnswer
	q.Limit = r.summaryChunk()
	for id, pa := range r.a.node.QueryPeersWith(server.PollSummaryQuery, q, peerPollsTimeout) {
		sums, err := r.restOfSummary(id, q, pa)
		if err != nil {
			answers = append(answers, api.ReplicaAnswer{ID: id, Error: err.Error()})
			continue
		}
		out = append(out, sums...)
		answers = append(answers, api.ReplicaAnswer{ID: id, Answered: true})
	}
	return out, answers
}

// restOfSummary completes one peer's answer pa to the first chunk q: the
// chunks that follow, or, from a release that does not know the query,
// its polls summarized here.
func (r replica) restOfSummary(id string, q server.SummaryArg, pa cluster.PeerAnswer) ([]server.PollSummary, error) {
	sum, err := decodeAnswer[server.PollSummary](pa)
	if err != nil || sum == nil {
		// A release that does not know the query answers null, or
		// resets the connection for the argument it did not read.
		pq := server.PollsArg{Selectors: q.Selectors}
		ans, err := r.restOfPolls(id, pq, r.a.node.QueryPeerWith(id, server.PollsQuery, r.firstPollsChunk(pq), peerPollsTimeout))
		if err != nil {
			return nil, err
		}
		return []server.PollSummary{server.SummarizePolls(ans.Polls, server.SummaryArg{Selectors: q.Selectors})}, nil
	}
	var out []server.PollSummary
	for ; err == nil && sum != nil; sum, err = decodeAnswer[server.PollSummary](r.a.node.QueryPeerWith(id, server.PollSummaryQuery, q, peerPollsTimeout)) {
		out = append(out, *sum)
		if sum.Next == "" {
			return out, nil
		}
		if len(out) >= maxSummaryChunks {
			return nil, fmt.Errorf("replica %s: more than %d chunks of %s (%d polls each)", id, maxSummaryChunks, server.PollSummaryQuery, q.Limit)
		}
		q.After = sum.Next
	}
	if err == nil {
		err = fmt.Errorf("replica %s stopped answering %s", id, server.PollSummaryQuery)
	}
	return nil, err
}

// peerPollsChunk is the most polls one answer to server.PollsQuery
// carries when every poll is read; peerSummaryChunk the most polls one
// answer to server.PollSummaryQuery carries (about 7 bytes each, some 2.5
// MB of JSON), maxSummaryChunks the most chunks read of one peer (far
// more than a table of --pollers-max pairs needs); peerPollsTimeout
// bounds each answer.
const (
	peerPollsChunk   = 50_000
	peerSummaryChunk = 250_000
	maxSummaryChunks = 1000
	peerPollsTimeout = 5 * time.Second
)

// decodeAnswer reads a peer's answer to a named query (server.PollsQuery,
// server.PollSummaryQuery); nil without an error: the peer does not know
// the query (a release before it). An answer that reads itself
// (server.PollSummary: 1 MB at 10,000 servers) is read in its one pass
// when it is in its own form; otherwise, as null or malformed, by
// encoding/json, which reports what is wrong with it.
func decodeAnswer[T any](pa cluster.PeerAnswer) (*T, error) {
	if pa.Err != nil {
		return nil, pa.Err
	}
	if fast := new(T); decodesItself(fast, pa.Raw) {
		return fast, nil
	}
	var ans *T
	err := json.Unmarshal(pa.Raw, &ans)
	return ans, err
}

// decodesItself reports whether v reads itself from line
// (raftport.LineDecoder) and did.
func decodesItself(v any, line []byte) bool {
	d, ok := v.(raftport.LineDecoder)
	return ok && d.DecodeJSONLine(line)
}

// olderPeerPolls asks one peer of an older release for every poll and
// selects q's.
func (r replica) olderPeerPolls(id string, q server.PollsArg) (*server.PollsAnswer, error) {
	pa := r.a.node.QueryPeer(id, pollersQuery, 2*time.Second)
	var ps []api.Poll
	err := pa.Err
	if err == nil {
		err = json.Unmarshal(pa.Raw, &ps)
	}
	if err != nil {
		return nil, err
	}
	for i := range ps {
		ps[i].Replica = id
	}
	rows, total := server.SelectPolls(ps, q)
	return &server.PollsAnswer{Polls: rows, Total: total}, nil
}

// Recorded is the cluster's record of which HAProxy nodes exist.
func (r replica) Recorded() (state.HAProxies, bool) { return r.a.node.HAProxies() }

// PeerSightings asks the other replicas which HAProxy sources they saw.
func (r replica) PeerSightings() (map[string]map[string]time.Time, []api.ReplicaAnswer) {
	seen, failed := r.a.node.PeerSightings()
	out := map[string]map[string]time.Time{}
	var answers []api.ReplicaAnswer
	for id, s := range seen {
		if id == r.a.o.NodeID {
			continue
		}
		out[id] = s
		answers = append(answers, api.ReplicaAnswer{ID: id, Answered: true})
	}
	for id, err := range failed {
		answers = append(answers, api.ReplicaAnswer{ID: id, Error: err.Error()})
	}
	return out, answers
}

// KVStatus is the Consul watch status; only the leader watches.
func (r replica) KVStatus() api.KVStatus {
	st := api.KVStatus{KVView: r.a.node.KVView(), Note: "followers serve their raft state; the leader watches Consul"}
	if w := r.a.watcher.Load(); w != nil && r.a.node.IsLeader() {
		ws := w.Status()
		st.Watching, st.Watch, st.Note = true, &ws, ""
	}
	if raw, err := r.a.node.RampPolicyProblem(); err != nil {
		st.RampPolicy = &api.InvalidConfig{Key: cluster.RampConfigKey, Value: raw, Error: err.Error(),
			Effect: "ignored: the --ramp-* flags apply (fix or delete the key)"}
	}
	return st
}
