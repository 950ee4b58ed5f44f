package main

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/internal/ctl"
	"github.com/spf13/cobra"
)

// replicaFlag adds --addr, the replica that reads ask (HASTATE_ADDR).
func replicaFlag(c *cobra.Command, addr *string) {
	def := "http://127.0.0.1:9778"
	if a := os.Getenv("HASTATE_ADDR"); a != "" {
		def = a
	}
	c.Flags().StringVar(addr, "addr", def, "a replica's HTTP address, http://host:port or host:port (HASTATE_ADDR)")
}

// needArgs checks the number of arguments: at least min, at most max
// (0: any); want says what they are, for the usage error (exit 2).
func needArgs(min, max int, want string) cobra.PositionalArgs {
	return func(c *cobra.Command, args []string) error {
		if len(args) < min || max > 0 && len(args) > max {
			return usageError(c, errors.New("want "+want))
		}
		return nil
	}
}

func usageError(c *cobra.Command, err error) error {
	return fmt.Errorf("%w: %v (see hastate %s --help)", ctl.ErrUsage, err, c.Name())
}

func statusCmd(stdout io.Writer) *cobra.Command {
	var addr, output string
	var withHAProxy bool
	var pf promFlags
	c := &cobra.Command{
		Use:   "status [<selector>...]",
		Short: "Show desired state and the answer each server gets, over the whole cluster",
		Long: `status lists every server the cluster knows (KV keys and what HAProxy polled,
over every replica) with its answer, since when, and how many of the HAProxy
nodes polling it were told that answer. Warnings (Consul not in sync, a
replica that did not answer) go to stderr.

--haproxy adds what HAProxy itself reports, read from Prometheus, against
what it was told (the column of hastate verify, which explains each).`,
		Example: `  HASTATE_ADDR=hastate.internal:9778 hastate status 'canary_*/*'
  hastate status -o json
  hastate status canary_web --haproxy --prometheus http://prometheus:9090`,
		RunE: func(c *cobra.Command, args []string) error {
			if output != "table" && output != "json" {
				return fmt.Errorf("%w: -o %q: want table or json", ctl.ErrUsage, output)
			}
			if len(args) == 0 {
				args = []string{"*/*"}
			}
			for i, a := range args {
				if !strings.Contains(a, "/") {
					args[i] = a + "/*" // status web: the whole backend
				}
			}
			sels, err := ctl.ParseSelectors(args)
			if err != nil {
				return err
			}
			r, err := ctl.NewReplica(addr)
			if err != nil {
				return err
			}
			v, err := r.Fleet(c.Context())
			if err != nil {
				return err
			}
			// Stale is not wrong, but the operator must know.
			if w := v.KV.Warning; w != "" {
				fmt.Fprintln(c.ErrOrStderr(), "warning:", w)
			}
			if err := ctl.Missing(v.Replicas); err != nil {
				fmt.Fprintln(c.ErrOrStderr(), "warning:", err)
			}
			if !v.HoldsState {
				fmt.Fprintln(c.ErrOrStderr(), "warning: this replica holds no state yet; its answers are withheld")
			}
			rows := ctl.Select(v.Servers, sels...)
			var hapCol map[string]string
			var hapRows map[string][]ctl.VerifyRow
			if withHAProxy {
				hapCol, hapRows = haproxyColumn(c.Context(), &pf, addr, &v, sels, c.ErrOrStderr())
			}
			if output == "json" {
				enc := json.NewEncoder(stdout)
				enc.SetIndent("", "  ")
				if withHAProxy {
					return enc.Encode(withHAProxyRows(rows, hapRows))
				}
				if rows == nil {
					rows = []api.ServerState{}
				}
				return enc.Encode(rows)
			}
			tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
			fmt.Fprint(tw, "BACKEND\tSERVER\tANSWER\tSINCE\tVALUE\tRAMP\tUNTIL\tTOLD\tREASON\tBY\tPROBLEM")
			if withHAProxy {
				fmt.Fprint(tw, "\tHAPROXY")
			}
			fmt.Fprintln(tw)
			for _, r := range rows {
				ans := r.Answer
				if r.Withheld {
					ans = "(withheld)"
				}
				until := ""
				switch {
				case r.Expired != "":
					until = "expired: " + r.Expired
				case r.Until != nil:
					until = r.Until.Local().Format("Jan 2 15:04")
				}
				since := ""
				if r.Since != nil {
					since = ago(time.Since(*r.Since))
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d/%d\t%s\t%s\t%s", r.Backend, r.Server, ans, since, r.Desired, r.Ramping.String(),
					until, r.Told, r.Polled, r.Reason, r.By, r.Error)
				if withHAProxy {
					fmt.Fprint(tw, "\t"+cmp.Or(hapCol[r.Backend+"/"+r.Server], "?"))
				}
				fmt.Fprintln(tw)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			for _, r := range v.InvalidKeys {
				if r.Backend == "" {
					fmt.Fprintf(stdout, "invalid key %s: %s\n", r.Key, r.Error)
				}
			}
			return nil
		},
	}
	replicaFlag(c, &addr)
	c.Flags().StringVarP(&output, "output", "o", "table", "table|json")
	c.Flags().BoolVar(&withHAProxy, "haproxy", false, "add a column with what HAProxy reports through Prometheus, as hastate verify compares it")
	pf.add(c)
	return c
}

func waitCmd(stdout io.Writer) *cobra.Command {
	var cf consulFlags
	var addr string
	var idle bool
	var pf promFlags
	c := &cobra.Command{
		Use:   "wait <selector>...",
		Short: "Wait until every HAProxy polling the selected servers was told their current answer",
		Long: `wait reads Consul's current index for the prefix, waits until the replica has
applied at least that index (every write made before wait started is in),
then until every HAProxy that polled a selected server in the last minute,
on any replica, was last told that server's current answer.

With --idle it then waits until every HAProxy reports no current session on
each selected server, in a sample scraped after every HAProxy was told,
naming the servers and HAProxy instances that still hold sessions.
` + promHelp + `

Exit 0 when done; 1 on timeout, naming what lags (an HAProxy, a replica that
does not answer, sessions), or when it cannot confirm; 3 when the selector
matches no server.`,
		Example: `  hastate drain 'canary_*/*' --reason deploy && hastate wait 'canary_*/*' --timeout 1m
  hastate wait canary_web/gke-cny-web --idle --timeout 10m --prometheus http://prometheus:9090`,
		Args: needArgs(1, 0, "at least one <backend>/<server> selector"),
		RunE: func(c *cobra.Command, args []string) error {
			g, err := gate(cf, addr, args)
			if err != nil {
				return err
			}
			g.Out = c.ErrOrStderr()
			var prom *ctl.Prometheus
			if idle {
				if prom, err = pf.prometheus(); err != nil {
					return err
				}
			}
			start := time.Now()
			if err := ctl.Wait(c.Context(), g); err != nil {
				return fmt.Errorf("after %s: %w", time.Since(start).Round(time.Millisecond), err)
			}
			if idle {
				return waitIdle(c.Context(), prom, g, stdout, args, start)
			}
			fmt.Fprintf(stdout, "every HAProxy polling %s was told the current answer (%s)\n", strings.Join(args, " "), time.Since(start).Round(time.Millisecond))
			return nil
		},
	}
	cf.add(c)
	replicaFlag(c, &addr)
	c.Flags().BoolVar(&idle, "idle", false, "also wait until HAProxy reports no current session on each selected server (through Prometheus)")
	pf.add(c)
	return c
}

// gate reads the selectors, Consul and the replica of wait and precheck.
func gate(cf consulFlags, addr string, args []string) (ctl.GateOptions, error) {
	sels, err := ctl.ParseSelectors(args)
	if err != nil {
		return ctl.GateOptions{}, err
	}
	w, err := cf.writer()
	if err != nil {
		return ctl.GateOptions{}, err
	}
	r, err := ctl.NewReplica(addr)
	if err != nil {
		return ctl.GateOptions{}, err
	}
	return ctl.GateOptions{Consul: w.Client, ConsulAddr: w.Addr, Prefix: w.Prefix, Replica: r, Selectors: sels}, nil
}

func precheckCmd(stdout io.Writer) *cobra.Command {
	var cf consulFlags
	var addr string
	c := &cobra.Command{
		Use:   "precheck <selector>...",
		Short: "Exit 0 only if every selected server is ready or in maint (the deploy contract)",
		Long: `precheck first waits until the replica has applied every write made to Consul
before it started (bounded by --timeout), then checks the deploy pipeline's
contract over the whole cluster: servers that are ready or in maint pass; a
drained server, a ramp in progress and anything it cannot confirm (a
replica that does not answer, Consul not in sync, an invalid key) block.

Exit 0: deploy; 1: blocked or cannot confirm (the reasons on stderr); 3: the
selector matches no server.`,
		Example: `  hastate precheck 'canary_*/*' && ./deploy.sh`,
		Args:    needArgs(1, 0, "at least one <backend>/<server> selector"),
		RunE: func(c *cobra.Command, args []string) error {
			g, err := gate(cf, addr, args)
			if err != nil {
				return err
			}
			n, blocking, err := ctl.Precheck(c.Context(), g)
			if err != nil {
				return err
			}
			if len(blocking) > 0 {
				return fmt.Errorf("%w: %d of %d selected servers block the deploy:\n  %s", ctl.ErrNotDone, len(blocking), n, strings.Join(blocking, "\n  "))
			}
			fmt.Fprintf(stdout, "ok: %d selected servers, each ready or in maint\n", n)
			return nil
		},
	}
	cf.add(c)
	replicaFlag(c, &addr)
	return c
}

func probeCmd(stdout io.Writer) *cobra.Command {
	var addr string
	c := &cobra.Command{
		Use:   "probe <backend>/<server>",
		Short: "Send one agent check as HAProxy does and print the answer",
		Long: `probe connects to an agent port, sends "<backend>/<server>\n" as HAProxy's
agent-send does, and prints the one-line answer. It exits 1 when no answer
comes: refused, closed without a line (the answer is withheld), or timed out.`,
		Example: `  hastate probe canary_web/gke-cny-web
  hastate probe canary_web/gke-cny-web --addr 10.0.0.9:9777 --timeout 2s   # through the load balancer`,
		Args: needArgs(1, 1, "one <backend>/<server>"),
		RunE: func(c *cobra.Command, args []string) error {
			sel, err := ctl.ParseSelector(args[0])
			if err != nil {
				return err
			}
			answer, err := ctl.Probe(c.Context(), addr, sel)
			if err != nil {
				return err
			}
			fmt.Fprintln(stdout, answer)
			return nil
		},
	}
	c.Flags().StringVar(&addr, "addr", ctl.DefaultAgentAddr, "agent-check address, host:port")
	_ = c.Flags().SetAnnotation("addr", noEnv, []string{"HASTATE_ADDR is the HTTP address"})
	return c
}

// ago renders a duration for a status table: "42s ago", "3h12m ago",
// "2d5h ago".
func ago(d time.Duration) string {
	switch {
	case d < time.Minute:
		return d.Round(time.Second).String() + " ago"
	case d < 24*time.Hour:
		return strings.TrimSuffix(d.Round(time.Minute).String(), "0s") + " ago"
	}
	return fmt.Sprintf("%dd%dh ago", int(d.Hours())/24, int(d.Hours())%24)
}
