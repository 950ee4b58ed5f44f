// Command hastate is the desired-state service for an HAProxy fleet:
// `hastate serve` runs a replica; the other commands are the operator's.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/hastate/hastate/cluster"
	"github.com/hastate/hastate/cluster/raftport"
	"github.com/hastate/hastate/cmd/hastate/internal/app"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl"
	"github.com/hastate/hastate/internal/version"
	"github.com/hastate/hastate/server"
	"github.com/hastate/hastate/state"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(operatorGCPercent) // serve sets its own
	}
	root := newRoot(stdout, stderr)
	root.SetArgs(args)
	if err := root.Execute(); err != nil {
		fmt.Fprintln(stderr, "hastate:", err)
		switch {
		case errors.Is(err, ctl.ErrUsage):
			return 2
		case errors.Is(err, ctl.ErrPermission):
			return 5
		case errors.Is(err, ctl.ErrNoMatch):
			return 3
		case errors.Is(err, ctl.ErrWrongReplica), errors.Is(err, ctl.ErrNotDone):
			return 1
		case errors.Is(err, ctl.ErrCannotConfirm):
			return 4
		}
		return 1
	}
	return 0
}

func newRoot(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "hastate",
		Short: "Desired state of HAProxy backend servers, served to HAProxy's agent-check",
		Long: `hastate mirrors <prefix>state/<backend>/<server> from Consul KV into a raft
cluster and answers HAProxy agent-check probes for the whole fleet.

A state key holds one plain word: ready | drain | maint | N% (0..256).
Reason, expiry and ramp live beside it in <prefix>meta/<backend>/<server>,
written by the same command (--reason, --for, --ramp).

Exit codes, the same for every command (the README's table):
  0  ok: done, written, or nothing blocks
  1  refused, blocked or not done: a guard refused a write, precheck found
     something drained, at 0%, ramping or withheld (an invalid key), wait
     timed out or found an answer withheld, verify or compare found a
     disagreement
  2  usage error: a flag, an argument, a value or a command that does not
     exist
  3  the selector matched nothing (a typo: the known backends are named)
  4  cannot confirm: hastate, Consul or Prometheus could not be read well
     enough to decide (no raft leader, no replica ready, an HAProxy seen by
     no live replica); gates and writes fail closed, so a pipeline tells
     "drained on purpose" (1) from "hastate is broken" (4)
  5  permission denied: Consul refused the command's token a read or a
     write it needs (the message names the ACL rule that would allow it;
     nothing was written)`,
		Version:       version.Get().String(),
		SilenceUsage:  true,
		SilenceErrors: true,
		// An unknown command is a usage error (exit 2), as cobra's own
		// check would make it exit 1.
		Args:                       cobra.ArbitraryArgs,
		SuggestionsMinimumDistance: 2,
		RunE: func(c *cobra.Command, args []string) error {
			if len(args) == 0 {
				return c.Help()
			}
			msg := fmt.Sprintf("unknown command %q", args[0])
			if s := c.SuggestionsFor(args[0]); len(s) > 0 {
				msg += "; did you mean " + strings.Join(s, " or ") + "?"
			}
			return usageError(c, errors.New(msg))
		},
	}
	root.SetVersionTemplate("{{.Version}}")
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(usageError)
	root.AddCommand(serveCmd(stderr), versionCmd(stdout))
	for _, st := range []string{"drain", "maint", "ready"} {
		root.AddCommand(withTimeout(setCmd(st, stdout)))
	}
	for _, c := range []*cobra.Command{weightCmd(stdout), clearCmd(stdout), migrateCmd(stdout), statusCmd(stdout), waitCmd(stdout), precheckCmd(stdout), verifyCmd(stdout), probeCmd(stdout)} {
		root.AddCommand(withTimeout(c))
	}
	root.AddCommand(migrationCmd(stdout), withTimeout(compareCmd(stdout)), withTimeout(adoptCmd(stdout)))
	return root
}

func versionCmd(stdout io.Writer) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version, git revision and Go version of this binary",
		Example: `  hastate version
  hastate --version`,
		Args: cobra.NoArgs,
		Run: func(*cobra.Command, []string) {
			fmt.Fprint(stdout, version.Get())
		},
	}
}

// withTimeout gives an operator command --timeout (and HASTATE_<FLAG> for
// its flags) and runs it under a context with that deadline, which bounds
// every call it makes to Consul, to a replica or to an agent port.
func withTimeout(c *cobra.Command) *cobra.Command {
	var timeout time.Duration
	timeout = ctl.DefaultTimeout
	c.Flags().Var(ctl.DurationFlag{D: &timeout, Name: "--timeout"}, "timeout", "give up after this long; bounds every call to Consul and to hastate")
	run := c.RunE
	c.RunE = func(c *cobra.Command, args []string) error {
		if err := bindEnv(c.Flags()); err != nil {
			return err
		}
		if timeout <= 0 {
			return fmt.Errorf("%w: --timeout %s: want a positive duration such as 10s", ctl.ErrUsage, timeout)
		}
		ctx, cancel := ctl.WithTimeout(c.Context(), timeout)
		defer cancel()
		c.SetContext(ctx)
		return run(c, args)
	}
	return c
}

// envName is the annotation of a flag whose variable is not
// HASTATE_<FLAG> (probe's --addr: HASTATE_ADDR is a replica's HTTP address).
const envName = "hastate-env"

// bindEnv sets every flag not given on the command line from its
// variable: HASTATE_<FLAG> (upper case, dashes as underscores), or the one
// its envName annotation names. This is the one place HASTATE_ADDR and the
// others are read.
func bindEnv(fs *pflag.FlagSet) error {
	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Changed || err != nil {
			return
		}
		name := "HASTATE_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if a := f.Annotations[envName]; len(a) == 1 {
			name = a[0]
		}
		if v, ok := os.LookupEnv(name); ok {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%s=%q: %w", name, v, e)
			}
		}
	})
	return err
}

func serveCmd(stderr io.Writer) *cobra.Command {
	host, _ := os.Hostname()
	var (
		o                      app.Options
		peers, logLevel, logF  string
		tlsCert, tlsKey, tlsCA string
		tlsPeerNames           []string
		raftDial               string
		rampStart              string
		desiredMetrics         bool
	)
	o.Ramp = state.DefaultRampPolicy()
	c := &cobra.Command{
		Use:   "serve",
		Short: "Run a hastate replica",
		Example: `  # one replica for development, Consul on 127.0.0.1:8500
  hastate serve --node-id dev --data-dir /tmp/hastate --raft-advertise 127.0.0.1:9779

  # replica 0 of three (every flag also reads HASTATE_<FLAG>, e.g. HASTATE_PEERS)
  hastate serve --node-id hastate-0 --raft-advertise hastate-0.hastate:9779 \
    --peers hastate-0=hastate-0.hastate:9779,hastate-1=hastate-1.hastate:9779,hastate-2=hastate-2.hastate:9779`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := bindEnv(cmd.Flags()); err != nil {
				return err
			}
			log, err := newLogger(logLevel, logF, stderr)
			if err != nil {
				return err
			}
			defer func() { _ = log.Sync() }()
			build := version.Get()
			log.Info("hastate starting", zap.String("version", build.Version), zap.String("revision", build.Revision),
				zap.String("goversion", build.GoVersion))
			if o.Peers, err = cluster.ParsePeers(peers); err != nil {
				return fmt.Errorf("%w: --peers: %v", ctl.ErrUsage, err)
			}
			o.NoDesiredMetrics = !desiredMetrics
			if o.Ramp.Start, err = state.ParsePercent(rampStart, 100); err != nil {
				return fmt.Errorf("%w: --ramp-start: %v", ctl.ErrUsage, err)
			}
			dial, err := cluster.ParsePeers(raftDial)
			if err != nil {
				return fmt.Errorf("%w: --raft-dial: %v", ctl.ErrUsage, err)
			}
			for _, p := range dial {
				if o.RaftDial == nil {
					o.RaftDial = map[string]string{}
				}
				o.RaftDial[p.ID] = p.Address
			}
			if o.RaftTLS, err = raftport.LoadRaftTLS(raftport.TLSFiles{Cert: tlsCert, Key: tlsKey, CA: tlsCA, PeerNames: tlsPeerNames}); err != nil {
				return fmt.Errorf("%w: %v", ctl.ErrUsage, err)
			}
			o.Logger = log.With(zap.String("node_id", o.NodeID))
			return serve(cmd.Context(), o)
		},
	}
	f := c.Flags()
	f.StringVar(&o.NodeID, "node-id", host, "raft server ID of this replica")
	f.StringVar(&o.AgentAddr, "agent-addr", ":9777", "agent-check listen address")
	f.StringVar(&o.HTTPAddr, "http-addr", ":9778", "HTTP listen address (health, metrics, API, status page)")
	f.StringVar(&o.RaftAddr, "raft-addr", ":9779", "raft listen address")
	f.StringVar(&o.RaftAdvertise, "raft-advertise", "", "host:port other replicas dial (default <node-id>:<raft port>)")
	f.StringVar(&peers, "peers", "", "initial cluster: id=host:port,... (empty: a one-node cluster)")
	f.StringSliceVar(&o.BootstrapWithout, "bootstrap-without", nil, "id,...: peers of --peers that are gone for good (docs/runbook.md \"Quorum lost for good\"): a replica with no raft state bootstraps without waiting for their answer; remove it once the cluster is back")
	f.StringVar(&raftDial, "raft-dial", "", "id=host:port,...: dial these peers at another address than --peers gives (a local proxy or sidecar)")
	f.StringVar(&o.DataDir, "data-dir", "/var/lib/hastate", "raft log and snapshots")
	f.StringVar(&o.KVPrefix, "kv-prefix", "hastate/", "Consul KV prefix; state lives under <prefix>state/")
	f.StringVar(&o.ConsulAddr, "consul-addr", "", "Consul HTTP address (default CONSUL_HTTP_ADDR, else 127.0.0.1:8500)")
	f.StringVar(&o.ConsulTokenFile, "consul-token-file", "", "file holding the Consul token, read again every second so a rotated token needs no restart (default CONSUL_HTTP_TOKEN_FILE, else the token CONSUL_HTTP_TOKEN holds)")
	f.StringVar(&rampStart, "ramp-start", "10%", "undrain ramp: weight of the first step")
	f.DurationVar(&o.Ramp.Duration, "ramp-duration", o.Ramp.Duration, "undrain ramp: time from --ramp-start to 100% (0: no ramp)")
	f.DurationVar(&o.Ramp.Interval, "ramp-interval", o.Ramp.Interval, "undrain ramp: time between steps (keep it >= HAProxy's agent-inter)")
	f.Float64Var(&o.Ramp.Aggression, "ramp-aggression", o.Ramp.Aggression, "undrain ramp curve: 1 linear, >1 faster early, <1 slower early (Envoy's aggression)")
	f.BoolVar(&o.Ramp.FromMaint, "ramp-from-maint", false, "also ramp servers that leave maint")
	f.DurationVar(&o.KVFailoverAfter, "kv-failover-after", 30*time.Second, "a leader that cannot reach Consul this long hands leadership to a follower that can (negative: never)")
	f.DurationVar(&o.KVWait, "kv-wait", app.DefaultKVWait, "the leader's Consul blocking-query wait, 1s to 10m (keep it below the idle timeout of any proxy between hastate and Consul; a quiet prefix shows a sync age up to about this)")
	f.DurationVar(&o.LeaderlessGrace, "leaderless-grace", cluster.DefaultLeaderlessGrace, "a replica whose last contact with a raft leader is older than this stops answering agent checks (HAProxy keeps its state) and fails readiness, until it has a leader again and has caught up")
	f.DurationVar(&o.ConfirmTimeout, "confirm-timeout", cluster.DefaultConfirmTimeout, "a check is answered only once this replica confirmed with the raft leader that it serves every change committed before the check arrived (a read index, batched); a check not confirmed within this is answered nothing (HAProxy keeps its state). Keep it well under HAProxy's agent-check timeout")
	f.DurationVar(&o.ConfirmWindow, "confirm-window", cluster.DefaultConfirmWindow, "how long a confirmation round waits for more checks to share it (0: none; see cluster/DESIGN.md for the measurements)")
	f.DurationVar(&o.SnapshotInterval, "snapshot-interval", 2*time.Minute, "how often raft checks whether to snapshot")
	f.Uint64Var(&o.SnapshotThreshold, "snapshot-threshold", 1024, "raft entries since the last snapshot that trigger a new one")
	f.BoolVar(&o.ReadyWhileStopping, "ready-while-stopping", false, "keep /-/readiness passing during --shutdown-delay (Kubernetes >= 1.28 with externalTrafficPolicy Local: kube-proxy keeps forwarding to a terminating pod that is ready while the load balancer's node health check, which counts no terminating pod, drains the node); off: readiness fails at SIGTERM, for load balancers that check /-/readiness themselves")
	f.DurationVar(&o.ShutdownDelay, "shutdown-delay", 0, "on SIGTERM, keep answering probes this long with readiness failing, so that a load balancer stops sending probes here first (e.g. its health check interval × unhealthy threshold); a second signal cuts it short")
	f.IntVar(&o.FeatureLevel, "feature-level", 0, fmt.Sprintf("highest feature level this replica advertises (0: this release's, %d); 1 on every replica while upgrading from 0.13.0 keeps rolling back with the data directories safe: level 2's features (a meta key's until and ramp) wait", state.MaxLevel))
	f.IntVar(&o.PollersMax, "pollers-max", server.DefaultMaxPollers, "most (HAProxy, server) pairs a replica remembers for /v1/pollers and for \"hastate wait\" (0: the default); probes of new pairs beyond it are counted in hastate_pollers_dropped_total")
	f.BoolVar(&desiredMetrics, "desired-metrics", true, "export hastate_desired_answer and hastate_desired_changed_timestamp_seconds: one series per server this replica knows (a key of its own, or polled by an HAProxy within 10 minutes), two for 10 minutes after its answer changed, labelled proxy and server as HAProxy's exporter, for the drift alerts; false saves those series (50,000 to 100,000 per replica at 50,000 servers: docs/metrics.md) and silences the drift alerts")
	f.IntVar(&o.PeerReadChunk, "peer-read-chunk", 0, "most polls one raft-port answer carries when a replica reads a peer's poller table (0: 250,000 summarized polls, 50,000 of /v1/pollers); for tests")
	_ = f.MarkHidden("peer-read-chunk")
	f.StringVar(&tlsCert, "raft-tls-cert", "", "PEM certificate of this replica for mutual TLS on the raft port")
	f.StringVar(&tlsKey, "raft-tls-key", "", "PEM key for --raft-tls-cert")
	f.StringVar(&tlsCA, "raft-tls-ca", "", "PEM CA that signed every replica's raft certificate (several while a CA is rotated)")
	f.StringSliceVar(&tlsPeerNames, "raft-tls-peer-names", nil, "name,...: a peer's raft certificate must carry one of these as a subject alternative name (*.domain: one label) besides being signed by --raft-tls-ca (default: the hosts of --peers and --raft-advertise)")
	f.DurationVar(&o.RaftTLSReloadInterval, "raft-tls-reload-interval", raftport.DefaultTLSReloadInterval, "how often the raft TLS files are re-read: a renewed certificate or CA bundle is used from the next handshake, without a restart")
	f.StringVar(&logLevel, "log-level", "info", "debug|info|warn|error")
	f.StringVar(&logF, "log-format", "json", "json|console")
	return c
}

// operatorGCPercent is the GOGC that the operator commands run with when
// the environment sets none. A command lives for a second or less and
// holds what it read until it exits: `status -o json` of 10,000 servers
// allocated 14 MB and held most of it, which Go's default collected three
// times (a quarter of the command's CPU, on the machine whose replicas
// answer checks); at 400 the heap may reach five times what the command
// holds (the collector starts at 16 MB, not 4), and the 7 MB it
// allocates now (api/statewire.go) are not collected at all.
const operatorGCPercent = 400

// defaultGCPercent is the GOGC that serve runs with when the environment
// sets none. A replica's heap is almost all long-lived state (the mirror
// and its serving snapshot) and the agent path does not allocate per
// request, so collecting at 50% growth instead of Go's 100% costs little
// CPU and keeps the footprint near 1.5 times the state, not twice it.
const defaultGCPercent = 50

func serve(ctx context.Context, o app.Options) error {
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(defaultGCPercent)
	}
	a, err := app.New(o) // checks the options (app.Options.validate)
	if errors.Is(err, app.ErrInvalidOptions) {
		return fmt.Errorf("%w: %w", ctl.ErrUsage, err)
	}
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := a.Start(ctx); err != nil {
		return err
	}
	select {
	case err := <-a.Failed():
		// A replica that cannot answer probes must not stay up looking
		// ready: exit non-zero so that it is restarted.
		sctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
		defer cancel()
		_ = a.Stop(sctx)
		return fmt.Errorf("%w; exiting so that the replica is restarted", err)
	case <-ctx.Done():
	}
	o.Logger.Info("signal received: shutting down (a leader hands over first; agent answers continue until raft is down)")
	// A second signal cuts the shutdown delay short.
	dctx, dstop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	a.PrepareStop(dctx)
	dstop()
	sctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	return a.Stop(sctx)
}

func newLogger(level, format string, w io.Writer) (*zap.Logger, error) {
	var lvl zapcore.Level
	if err := lvl.Set(level); err != nil {
		return nil, fmt.Errorf("%w: --log-level %q: want debug, info, warn or error", ctl.ErrUsage, level)
	}
	ec := zap.NewProductionEncoderConfig()
	ec.EncodeTime = zapcore.ISO8601TimeEncoder
	var enc zapcore.Encoder
	switch format {
	case "json":
		enc = zapcore.NewJSONEncoder(ec)
	case "console":
		enc = zapcore.NewConsoleEncoder(ec)
	default:
		return nil, fmt.Errorf("%w: --log-format %q: want json or console", ctl.ErrUsage, format)
	}
	core := zapcore.NewCore(enc, zapcore.Lock(zapcore.AddSync(w)), lvl)
	return zap.New(core).With(zap.String("ident", "hastate")), nil
}
