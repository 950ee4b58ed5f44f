package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/hastate/hastate/cmd/hastate/internal/ctl"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/fleet"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/haproxy"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/status"
	"github.com/spf13/cobra"
)

// replicaFlag adds --addr, the replica that reads ask; bindEnv sets it
// from HASTATE_ADDR.
func replicaFlag(c *cobra.Command, addr *string) {
	c.Flags().StringVar(addr, "addr", "http://127.0.0.1:9778", "a replica's HTTP address, http://host:port or host:port (HASTATE_ADDR)")
}

// argCount is a cobra argument check (cobra.RangeArgs, MinimumNArgs) whose
// failure is a usage error (exit 2) saying what the arguments are (want).
func argCount(check cobra.PositionalArgs, want string) cobra.PositionalArgs {
	return func(c *cobra.Command, args []string) error {
		if err := check(c, args); err != nil {
			return usageError(c, fmt.Errorf("want %s (%v)", want, err))
		}
		return nil
	}
}

// liveHelp says what a replica that is down means for the gates and the
// writes.
const liveHelp = `With a replica down, the replicas that are up decide: the cluster records
which HAProxy nodes exist, and the command passes once every HAProxy that
polled in the last minute was seen by a live replica (a dead replica's
HAProxy nodes reach the live ones once the load balancer drops it, and
their next agent check is seen). It exits 4 only while some HAProxy is seen
by none, naming it (docs/deploy.md, "A lost replica and your pipelines").`

func usageError(c *cobra.Command, err error) error {
	return fmt.Errorf("%w: %v (see %s --help)", ctl.ErrUsage, err, c.CommandPath())
}

func statusCmd(stdout io.Writer) *cobra.Command {
	var addr, output, prefix string
	var withHAProxy bool
	var pf promFlags
	c := &cobra.Command{
		Use:   "status [<selector>...]",
		Short: "Show desired state and the answer each server gets, over the whole cluster",
		Long: `Show desired state and the answer each server gets, over the whole cluster.

status lists every server the cluster knows (KV keys and what HAProxy polled,
over every replica) with its answer, since when, and how many of the HAProxy
nodes polling it were told that answer, then counts the servers in and out
of rotation (drain, maint and 0% are out; a withheld server, answered
nothing, counts by what HAProxy keeps: the last answer it was told, shown
in its ANSWER cell). Selectors are read as
in every command (backend alone is backend/*); one that matches nothing
exits 3 and lists the known backends. Warnings (Consul not in sync, a
replica that did not answer) go to stderr.

--haproxy adds what HAProxy itself reports, read from Prometheus, against
what it was told (the column of hastate verify, which explains each).`,
		Example: `  hastate status
  HASTATE_ADDR=hastate.internal:9778 hastate status 'canary_*/*'
  hastate status canary_web -o json
  hastate status canary_web --haproxy --prometheus http://prometheus:9090`,
		Args: cobra.ArbitraryArgs,
		RunE: func(c *cobra.Command, args []string) error {
			if output != "table" && output != "json" {
				return fmt.Errorf("%w: -o %q: want table or json", ctl.ErrUsage, output)
			}
			o := status.Options{Warn: c.ErrOrStderr(), Prefix: prefix}
			var err error
			if len(args) > 0 {
				if o.Selectors, err = ctl.ParseSelectors(args); err != nil {
					return err
				}
			}
			if o.Replica, err = fleet.NewReplica(addr); err != nil {
				return err
			}
			if withHAProxy {
				po := pf.options()
				o.HAProxy = &po
			}
			rep, err := status.Read(c.Context(), o)
			if err != nil {
				return err
			}
			if output == "json" {
				return rep.WriteJSON(stdout)
			}
			return rep.WriteTable(stdout)
		},
	}
	replicaFlag(c, &addr)
	c.Flags().StringVar(&prefix, "kv-prefix", "hastate/", "Consul KV prefix the state is expected under (also HASTATE_KV_PREFIX): a replica that reads another prefix is warned about")
	c.Flags().StringVarP(&output, "output", "o", "table", "table|json")
	c.Flags().BoolVar(&withHAProxy, "haproxy", false, "add a column with what HAProxy reports through Prometheus, as hastate verify compares it")
	pf.add(c)
	return c
}

func waitCmd(stdout io.Writer) *cobra.Command {
	var cf consulFlags
	var addr string
	var settled, idle bool
	var pf promFlags
	c := &cobra.Command{
		Use:   "wait <selector>...",
		Short: "Wait until every HAProxy polling the selected servers was told their current answer",
		Long: `Wait until every HAProxy polling the selected servers was told their current answer.

wait reads Consul's current index for the prefix, waits until the replica has
applied at least that index (every write made before wait started is in),
then until every HAProxy that polled a selected server in the last minute,
on any replica, was last told that server's current answer. A manual probe
(hastate probe, nc) is not an HAProxy and is not waited for. With --settled
it also waits until no selected server is ramping or expires (--for) before
--timeout runs out.

With --idle it then waits until every HAProxy reports no current session on
each selected server, in a sample scraped after every HAProxy was told,
naming the servers and HAProxy instances that still hold sessions.
` + promHelp + `

A server whose answer every replica withholds (its key is invalid and has
no last valid value) is not told anything: wait fails at once for it,
naming the key and the fix, in precheck's words and with its exit code (1).

Exit 0 when done; 1 on timeout, naming what lags (an HAProxy, a ramp,
sessions), or at once for a withheld answer; 3 when a selector matches no
server; 4 when it cannot confirm (no raft leader, an HAProxy seen by no
replica that answers, which it names, a replica that has not applied
Consul's index of the prefix, Consul or Prometheus unreadable). Before anything it checks that the replica reads the same KV
prefix of the same Consul.

` + liveHelp,
		Example: `  hastate drain 'canary_*/*' --reason deploy && hastate wait 'canary_*/*' --timeout 1m
  hastate ready canary_web && hastate wait canary_web --settled --timeout 10m   # until the ramp is done
  hastate wait canary_web/gke-cny-web --idle --timeout 10m --prometheus http://prometheus:9090`,
		Args: argCount(cobra.MinimumNArgs(1), "at least one <backend>/<server> selector"),
		RunE: func(c *cobra.Command, args []string) error {
			g, err := gate(cf, addr, args)
			if err != nil {
				return err
			}
			g.Out, g.Notes, g.Settled = c.ErrOrStderr(), c.ErrOrStderr(), settled
			var prom *haproxy.Prometheus
			if idle {
				if prom, err = pf.prometheus(); err != nil {
					return err
				}
			}
			start := time.Now()
			if err := fleet.Wait(c.Context(), g); err != nil {
				return fmt.Errorf("after %s: %w", time.Since(start).Round(time.Millisecond), err)
			}
			if idle {
				return waitIdle(c.Context(), prom, g, stdout, args, start)
			}
			what := "was told the current answer"
			if settled {
				what += ", and nothing selected ramps or is about to expire"
			}
			fmt.Fprintf(stdout, "every HAProxy polling %s %s (%s)\n", strings.Join(args, " "), what, time.Since(start).Round(time.Millisecond))
			return nil
		},
	}
	cf.add(c)
	replicaFlag(c, &addr)
	c.Flags().BoolVar(&settled, "settled", false, "also wait until no selected server is ramping or expires before --timeout runs out")
	c.Flags().BoolVar(&idle, "idle", false, "also wait until HAProxy reports no current session on each selected server (through Prometheus)")
	pf.add(c)
	return c
}

// gate reads the selectors, Consul and the replica of wait and precheck.
func gate(cf consulFlags, addr string, args []string) (fleet.GateOptions, error) {
	sels, err := ctl.ParseSelectorsIn(cf.prefix, args)
	if err != nil {
		return fleet.GateOptions{}, err
	}
	w, err := cf.writer()
	if err != nil {
		return fleet.GateOptions{}, err
	}
	r, err := fleet.NewReplica(addr)
	if err != nil {
		return fleet.GateOptions{}, err
	}
	return fleet.GateOptions{Consul: w.Client, ConsulAddr: w.Addr, Prefix: w.Prefix, Replica: r, Selectors: sels}, nil
}

func precheckCmd(stdout io.Writer) *cobra.Command {
	var cf consulFlags
	var addr string
	c := &cobra.Command{
		Use:   "precheck <selector>...",
		Short: "Exit 0 only if every selected server is ready or in maint (the deploy contract)",
		Long: `Exit 0 only if every selected server is ready or in maint (the deploy contract).

precheck first waits until the replica has applied every write made to Consul
before it started, and out of a replica's start-up (bounded by --timeout),
then checks the deploy pipeline's contract over the whole cluster: servers
that are ready or in maint pass; a drained server, a server at 0% (HAProxy
shows it as DRAIN), a ramp in progress, a server whose answer every replica
withholds (an invalid key with no last valid value: it is told nothing) and
anything it cannot confirm (no raft leader, an HAProxy seen by no replica
that answers, Consul not in sync) block. It counts servers, never
backend-wide keys.

Exit 0: deploy; 1: blocked (something selected is drained, at 0%, ramping
or withheld, the key and its fix named; the reasons on stderr); 3: a
selector matches no server; 4: cannot confirm (no raft leader, said at once
once the replica has given up on one, an HAProxy seen by no replica that
answers, a replica that has not applied Consul's latest index, Consul
unreadable, a KV prefix the replica does not read): a pipeline tells
"drained on purpose" from "hastate is broken".

` + liveHelp,
		Example: `  hastate precheck 'canary_*/*' && ./deploy.sh
  hastate precheck canary_web --timeout 30s`,
		Args: argCount(cobra.MinimumNArgs(1), "at least one <backend>/<server> selector"),
		RunE: func(c *cobra.Command, args []string) error {
			g, err := gate(cf, addr, args)
			if err != nil {
				return err
			}
			g.Notes = c.ErrOrStderr()
			n, blocking, err := fleet.Precheck(c.Context(), g)
			if err != nil {
				return err
			}
			if len(blocking) > 0 {
				verb := "block"
				if len(blocking) == 1 {
					verb = "blocks"
				}
				return ctl.Errorf(ctl.ErrNotDone, "blocked: %d of %s %s the deploy:\n  %s", len(blocking), plural(n, "selected server", "selected servers"), verb, strings.Join(blocking, "\n  "))
			}
			fmt.Fprintf(stdout, "ok: %s, each ready or in maint\n", plural(n, "selected server", "selected servers"))
			return nil
		},
	}
	cf.add(c)
	replicaFlag(c, &addr)
	return c
}

func plural(n int, one, many string) string {
	return fmt.Sprintf("%d %s", n, pluralWord(n, one, many))
}

// pluralWord is one when n is 1, else many.
func pluralWord(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

func probeCmd(stdout io.Writer) *cobra.Command {
	var addr string
	c := &cobra.Command{
		Use:   "probe <backend>/<server>",
		Short: "Send one agent check as HAProxy does and print the answer",
		Long: `Send one agent check as HAProxy does and print the answer.

probe connects to an agent port, sends "<backend>/<server>\n" as HAProxy's
agent-send does, and prints the one-line answer. It is never counted as an
HAProxy (it does not make a server known, nor count in "told", nor is it
waited for). It exits 1 when no answer comes: refused, closed without a line
(the answer is withheld), or timed out.`,
		Example: `  hastate probe canary_web/gke-cny-web
  hastate probe canary_web/gke-cny-web --addr 10.0.0.9:9777 --timeout 2s   # through the load balancer`,
		Args: argCount(cobra.ExactArgs(1), "one <backend>/<server>"),
		RunE: func(c *cobra.Command, args []string) error {
			sel, err := ctl.ParseSelector(args[0])
			if err != nil {
				return err
			}
			answer, err := fleet.Probe(c.Context(), addr, sel)
			if err != nil {
				return err
			}
			fmt.Fprintln(stdout, answer)
			return nil
		},
	}
	c.Flags().StringVar(&addr, "addr", fleet.DefaultAgentAddr, "agent-check address, host:port (HASTATE_PROBE_ADDR)")
	// HASTATE_ADDR is the replicas' HTTP address, not the agent port.
	_ = c.Flags().SetAnnotation("addr", envName, []string{"HASTATE_PROBE_ADDR"})
	return c
}
