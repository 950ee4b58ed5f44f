package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/internal/ctl"
	"github.com/hastate/hastate/state"
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

func usageError(c *cobra.Command, err error) error {
	return fmt.Errorf("%w: %v (see %s --help)", ctl.ErrUsage, err, c.CommandPath())
}

func statusCmd(stdout io.Writer) *cobra.Command {
	var addr, output string
	var withHAProxy bool
	var pf promFlags
	c := &cobra.Command{
		Use:   "status [<selector>...]",
		Short: "Show desired state and the answer each server gets, over the whole cluster",
		Long: `Show desired state and the answer each server gets, over the whole cluster.

status lists every server the cluster knows (KV keys and what HAProxy polled,
over every replica) with its answer, since when, and how many of the HAProxy
nodes polling it were told that answer, then counts the servers in and out
of rotation (drain, maint, 0% and withheld are out). Selectors are read as
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
			all := len(args) == 0
			if all {
				args = []string{"*/*"}
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
			if !all {
				if err := ctl.Matched(v.Servers, sels); err != nil {
					return err
				}
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
			var hap func(api.ServerState) string
			if withHAProxy {
				hap = func(r api.ServerState) string { return cmp.Or(hapCol[r.Backend+"/"+r.Server], "?") }
			}
			if err := printStatus(stdout, rows, v.InvalidKeys, hap); err != nil {
				return err
			}
			if v.Migration != nil {
				fmt.Fprintln(stdout, v.Migration)
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

// statusTime is how status shows a time: with seconds and the zone.
const statusTime = "Jan 2 15:04:05 MST"

// printStatus writes the status table, the servers in and out of
// rotation, the invalid keys that name no server, and the value grammar
// once if a row's problem is an invalid value.
func printStatus(w io.Writer, rows, invalidKeys []api.ServerState, hap func(api.ServerState) string) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprint(tw, "BACKEND\tSERVER\tANSWER\tSINCE\tVALUE\tRAMP\tUNTIL\tTOLD\tREASON\tBY\tPROBLEM")
	if hap != nil {
		fmt.Fprint(tw, "\tHAPROXY")
	}
	fmt.Fprintln(tw)
	grammar := false
	problem := func(msg string) string {
		if short, ok := strings.CutSuffix(msg, "; valid forms: "+state.ValidForms); ok {
			grammar = true
			return short
		}
		return msg
	}
	var servers, in int
	out := map[string]int{}
	for _, r := range rows {
		ans := r.Answer
		if r.Withheld {
			ans = "(withheld)"
		}
		until := ""
		var problems []string
		if r.Error != "" {
			problems = append(problems, problem(r.Error))
		}
		switch {
		case r.Expired != "" && r.ExpiredAt != nil:
			until = "expired " + r.ExpiredAt.Local().Format(statusTime)
			problems = append(problems, "expired key "+r.Expired+": treated as absent until it is written again")
		case r.Expired != "":
			until = "expired"
			problems = append(problems, "expired key "+r.Expired+": treated as absent until it is written again")
		case r.Until != nil:
			until = r.Until.Local().Format(statusTime)
		}
		if r.AtZero() {
			problems = append(problems, "at 0%: HAProxy shows it as DRAIN")
		}
		if r.Note != "" {
			problems = append(problems, r.Note)
		}
		since := ""
		if r.Since != nil {
			since = ago(time.Since(*r.Since))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d/%d\t%s\t%s\t%s", r.Backend, r.Server, ans, since, r.Desired, r.Ramping.String(),
			until, r.Told, r.Polled, r.Reason, r.By, strings.Join(problems, "; "))
		if hap != nil {
			fmt.Fprint(tw, "\t"+hap(r))
		}
		fmt.Fprintln(tw)
		if r.Server == state.Wildcard {
			continue
		}
		servers++
		switch {
		case r.InRotation():
			in++
		case r.AtZero():
			out["at 0%"]++
		default:
			out[string(r.Kind)]++
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if servers > 0 {
		var parts []string
		for _, k := range []string{string(api.KindDrain), string(api.KindMaint), "at 0%", string(api.KindWithheld)} {
			if out[k] > 0 {
				parts = append(parts, fmt.Sprintf("%d %s", out[k], k))
			}
		}
		line := fmt.Sprintf("%d of %d servers in rotation", in, servers)
		if len(parts) > 0 {
			line += "; out: " + strings.Join(parts, ", ")
		}
		fmt.Fprintln(w, line)
	}
	for _, r := range invalidKeys {
		if r.Backend == "" {
			fmt.Fprintf(w, "invalid key %s: %s\n", r.Key, problem(r.Error))
		}
	}
	if grammar {
		fmt.Fprintf(w, "valid values: %s\n", state.ValidForms)
	}
	return nil
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

Exit 0 when done; 1 on timeout, naming what lags (an HAProxy, a ramp,
sessions); 3 when a selector matches no server; 4 when it cannot confirm (a
replica that does not answer or has not applied Consul's index of the
prefix, which it names, Consul or Prometheus unreadable). Before anything it
checks that the replica reads the same KV prefix of the same Consul.`,
		Example: `  hastate drain 'canary_*/*' --reason deploy && hastate wait 'canary_*/*' --timeout 1m
  hastate ready canary_web && hastate wait canary_web --settled --timeout 10m   # until the ramp is done
  hastate wait canary_web/gke-cny-web --idle --timeout 10m --prometheus http://prometheus:9090`,
		Args: argCount(cobra.MinimumNArgs(1), "at least one <backend>/<server> selector"),
		RunE: func(c *cobra.Command, args []string) error {
			g, err := gate(cf, addr, args)
			if err != nil {
				return err
			}
			g.Out, g.Settled = c.ErrOrStderr(), settled
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
		Long: `Exit 0 only if every selected server is ready or in maint (the deploy contract).

precheck first waits until the replica has applied every write made to Consul
before it started, and out of a replica's start-up (bounded by --timeout),
then checks the deploy pipeline's contract over the whole cluster: servers
that are ready or in maint pass; a drained server, a server at 0% (HAProxy
shows it as DRAIN), a ramp in progress and anything it cannot confirm (a
replica that does not answer, Consul not in sync, an invalid key) block. It
counts servers, never backend-wide keys.

Exit 0: deploy; 1: blocked (something selected is drained, at 0% or
ramping; the reasons on stderr); 3: a selector matches no server; 4: cannot
confirm (a replica that does not answer or has not applied Consul's latest
index, Consul unreadable): a pipeline tells "drained on
purpose" from "hastate is broken".`,
		Example: `  hastate precheck 'canary_*/*' && ./deploy.sh
  hastate precheck canary_web --timeout 30s`,
		Args: argCount(cobra.MinimumNArgs(1), "at least one <backend>/<server> selector"),
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
				return fmt.Errorf("%w: %d of %s block the deploy:\n  %s", ctl.ErrNotDone, len(blocking), plural(n, "selected server", "selected servers"), strings.Join(blocking, "\n  "))
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
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
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
			answer, err := ctl.Probe(c.Context(), addr, sel)
			if err != nil {
				return err
			}
			fmt.Fprintln(stdout, answer)
			return nil
		},
	}
	c.Flags().StringVar(&addr, "addr", ctl.DefaultAgentAddr, "agent-check address, host:port (HASTATE_PROBE_ADDR)")
	// HASTATE_ADDR is the replicas' HTTP address, not the agent port.
	_ = c.Flags().SetAnnotation("addr", envName, []string{"HASTATE_PROBE_ADDR"})
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
