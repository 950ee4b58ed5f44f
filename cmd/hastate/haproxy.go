package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/hastate/hastate/cmd/hastate/internal/ctl"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/fleet"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/haproxy"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/write"
	"github.com/spf13/cobra"
)

// HAProxy's own view through Prometheus: wait --idle, maint --drain-first,
// verify and status --haproxy.

// promFlags are the flags of the commands that read HAProxy's exporter
// series from Prometheus.
type promFlags struct {
	url                                    string
	proxyLabel, serverLabel, instanceLabel string
	maxAge                                 time.Duration
}

const promHelp = `HAProxy's view comes from Prometheus (--prometheus, HASTATE_PROMETHEUS_URL),
which scrapes HAProxy's built-in exporter (http-request use-service
prometheus-exporter) on every HAProxy: haproxy_server_current_sessions,
haproxy_server_status and haproxy_server_weight, labelled by proxy (the
backend), server and instance (the HAProxy). A sample older than
--max-sample-age proves nothing: "cannot confirm", exit 4.`

func (p *promFlags) add(c *cobra.Command) {
	f := c.Flags()
	f.StringVar(&p.url, "prometheus", "", "the Prometheus that scrapes HAProxy's exporter, http://host:port (HASTATE_PROMETHEUS_URL)")
	_ = f.SetAnnotation("prometheus", envName, []string{"HASTATE_PROMETHEUS_URL"})
	f.StringVar(&p.proxyLabel, "proxy-label", haproxy.DefaultProxyLabel, "label of HAProxy's series that names the backend")
	f.StringVar(&p.serverLabel, "server-label", haproxy.DefaultServerLabel, "label of HAProxy's series that names the server")
	f.StringVar(&p.instanceLabel, "instance-label", haproxy.DefaultInstanceLabel, "label that names the HAProxy instance; its host must be the address HAProxy's agent checks come from")
	f.DurationVar(&p.maxAge, "max-sample-age", haproxy.DefaultMaxSampleAge, "a newer sample than this is needed from every HAProxy instance (a few scrape intervals; 0: the default)")
}

func (p *promFlags) options() haproxy.PrometheusOptions {
	return haproxy.PrometheusOptions{URL: p.url, ProxyLabel: p.proxyLabel, ServerLabel: p.serverLabel,
		InstanceLabel: p.instanceLabel, MaxSampleAge: p.maxAge}
}

func (p *promFlags) prometheus() (*haproxy.Prometheus, error) {
	return haproxy.NewPrometheus(p.options())
}

// waitIdle is the second half of `wait --idle`: after Wait, until HAProxy
// holds no session on the selected servers.
func waitIdle(ctx context.Context, prom *haproxy.Prometheus, g fleet.GateOptions, stdout io.Writer, args []string, start time.Time) error {
	fmt.Fprintf(g.Out, "every HAProxy was told (%s); waiting until HAProxy reports no session (Prometheus at %s)\n", time.Since(start).Round(time.Millisecond), prom.Addr())
	res, err := haproxy.WaitIdle(ctx, haproxy.IdleOptions{Prometheus: prom, Replica: g.Replica, Selectors: g.Selectors, Out: g.Out})
	if err != nil {
		return fmt.Errorf("after %s: %w (%s)", time.Since(start).Round(time.Millisecond), err, res)
	}
	fmt.Fprintf(stdout, "idle: every HAProxy polling %s was told the current answer and reports no session (%s; %s)\n",
		strings.Join(args, " "), time.Since(start).Round(time.Millisecond), res)
	return nil
}

// drainFirst is `maint --drain-first`. Its steps take longer than one
// --timeout, so it runs under its own deadlines (DrainFirst's): --timeout
// bounds each write and the wait for maint to be told, --idle-timeout the
// wait for idle. SIGINT or SIGTERM stops it, saying what it left.
func drainFirst(c *cobra.Command, w *writeFlags, pf *promFlags, idleTimeout time.Duration, stdout io.Writer, args []string) error {
	timeout, err := c.Flags().GetDuration("timeout")
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.WithoutCancel(c.Context()), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	req, err := w.request("maint", args)
	if err != nil {
		return err
	}
	m := write.MaintDrainFirst{
		Write: req,
		Value: func(st string) (string, error) {
			return write.Value(st, write.ValueOptions{Reason: w.reason, By: w.by, Ramp: w.ramp, For: w.forDur, Now: time.Now()})
		},
		Timeout: timeout, IdleTimeout: idleTimeout, Targets: strings.Join(args, " "), Out: stdout,
	}
	if pf.url != "" {
		if m.Prometheus, err = pf.prometheus(); err != nil {
			return err
		}
	}
	return m.Run(ctx)
}

func verifyCmd(stdout io.Writer) *cobra.Command {
	var addr, output string
	var pf promFlags
	var cf consulFlags
	c := &cobra.Command{
		Use:   "verify <selector>...",
		Short: "Compare what HAProxy reports (through Prometheus) with what hastate told it",
		Long: `Compare what HAProxy reports (through Prometheus) with what hastate told it.

verify compares, for each selected server on each HAProxy instance, the status
and weight HAProxy reports with what hastate answers and last told that
HAProxy, and names every disagreement: a state set over the admin socket
(the agent cannot clear it), an HAProxy whose agent check is disabled or
does not reach hastate, one not told yet, a scrape too old to tell.

` + promHelp + `

The exporter does not publish a server's configured weight, so "ready N%"
is checked as UP with a weight above 0, "ready 0%" as weight 0.

It first waits until the replica has applied every write made to Consul
before it started (as wait does), so it compares with the latest answers.
Right after a write, an HAProxy that has not asked since, or a sample
from before HAProxy applied the change, proves nothing either way: verify
reads again until a sample newer than the change can tell, for at most one
scrape interval past the change and the agent check that applies it
(bounded by --timeout), and then calls what it still cannot tell "cannot
confirm", never a disagreement.

Exit 0 when every HAProxy agrees; 1 naming every disagreement; 4 when all it
finds is what it cannot confirm (Prometheus or a replica unreadable, samples
too old, a change too new for the samples); 3 when the selector matches no
server.`,
		Example: `  HASTATE_PROMETHEUS_URL=http://prometheus:9090 hastate verify 'canary_*/*'
  hastate verify main_web/gke-cny-web --prometheus prometheus:9090 -o json`,
		Args: argCount(cobra.MinimumNArgs(1), "at least one <backend>/<server> selector"),
		RunE: func(c *cobra.Command, args []string) error {
			if output != "table" && output != "json" {
				return fmt.Errorf("%w: -o %q: want table or json", ctl.ErrUsage, output)
			}
			g, err := gate(cf, addr, args)
			if err != nil {
				return err
			}
			prom, err := pf.prometheus()
			if err != nil {
				return err
			}
			rep, err := haproxy.VerifyWait(c.Context(), haproxy.VerifyOptions{Prometheus: prom, Replica: g.Replica, Selectors: g.Selectors, Gate: &g})
			if err != nil {
				return err
			}
			if output == "json" {
				enc := json.NewEncoder(stdout)
				enc.SetIndent("", "  ")
				err = enc.Encode(rep)
			} else {
				err = rep.WriteTable(stdout)
			}
			if err != nil {
				return err
			}
			if err := rep.Err(); err != nil {
				return err
			}
			fmt.Fprintf(stdout, "ok: every HAProxy agrees with hastate (%s)\n", rep.Summary())
			return nil
		},
	}
	cf.add(c)
	replicaFlag(c, &addr)
	pf.add(c)
	c.Flags().StringVarP(&output, "output", "o", "table", "table|json")
	return c
}

// drainFirstFlags are maint's --drain-first, --idle-timeout and the
// Prometheus flags they use.
type drainFirstFlags struct {
	on          bool
	idleTimeout time.Duration
	prom        promFlags
}

func (d *drainFirstFlags) add(c *cobra.Command) {
	c.Flags().BoolVar(&d.on, "drain-first", false, "drain first, wait until every HAProxy was told and holds no session (or --idle-timeout passes), then maint: ChatOps --disable")
	d.idleTimeout = write.DefaultIdleTimeout
	c.Flags().Var(ctl.DurationFlag{D: &d.idleTimeout, Name: "--idle-timeout"}, "idle-timeout", "with --drain-first: set maint after this long even if sessions remain")
	d.prom.add(c)
	c.Long += "\n\n--drain-first is ChatOps `canary --disable` in one command: drain; wait until\n" +
		"every HAProxy was told and reports no session on the servers (through\n" +
		"Prometheus), or until --idle-timeout passes; then maint. Each step is\n" +
		"printed; --timeout bounds each write and wait for maint, --idle-timeout the\n" +
		"wait for idle. Without --prometheus the idle timeout is waited out in full.\n" +
		"Interrupted (Ctrl-C), it says which state it left.\n\n" + promHelp
	c.Example += "\n  hastate maint canary_web/gke-cny-web --drain-first --idle-timeout 2m --reason \"kernel upgrade\"   # ChatOps --disable"
}
