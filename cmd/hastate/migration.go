package main

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/hastate/hastate/cmd/hastate/internal/ctl"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/fleet"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/migration"
	"github.com/spf13/cobra"
)

const migrationLong = `A migration from the runbook's per-node agent is marked in Consul KV
(<kv-prefix>config/migration) while HAProxy nodes move, a few at a time,
from their local agent (agent-addr 127.0.0.1) to hastate's load balancer.
Both read the same <kv-prefix>state/<backend>/<server> keys, but the
per-node agent knows only per-server keys with the four words ready, drain,
maint and N%: no backend-wide keys, no meta keys, no expiry, no ramps.

While a migration is marked, every write is one both serve the same way:
selectors expand to per-server keys (the output says so), --for and --ramp
are refused with the reason, the typo guard also accepts servers that have a
key in Consul (before a node is moved no HAProxy polls hastate), and
undrains do not ramp (a ramp in progress ends at full weight at once). The
per-node agent never reads the marker (it is not under state/).

Exit codes: 0 ok, 1 refused or failed, 2 usage, 4 Consul could not be read.`

func migrationCmd(stdout io.Writer) *cobra.Command {
	c := &cobra.Command{
		Use:   "migration start|status|finish",
		Short: "Mark, show or end a migration from the per-node agent (both serve one prefix)",
		Long:  "Mark, show or end a migration from the per-node agent (both serve one prefix).\n\n" + migrationLong,
		Example: `  hastate migration start --reason "gstg: move canary_web nodes to hastate"
  hastate migration status
  hastate migration finish      # once every HAProxy node asks hastate`,
		Args: argCount(cobra.NoArgs, "a subcommand: start, status or finish"),
		RunE: func(c *cobra.Command, _ []string) error { return c.Help() },
	}
	for _, sub := range []*cobra.Command{migrationStartCmd(stdout), migrationStatusCmd(stdout), migrationFinishCmd(stdout)} {
		c.AddCommand(withTimeout(sub))
	}
	return c
}

func migrationStartCmd(stdout io.Writer) *cobra.Command {
	var (
		cf     consulFlags
		o      migration.Options
		dryRun bool
	)
	c := &cobra.Command{
		Use:   "start",
		Short: "Mark a migration: from now on every write is one the per-node agent serves the same way",
		Long: `Mark a migration: from now on every write is one the per-node agent serves the same way.

start writes <kv-prefix>config/migration (only if it does not exist). It
refuses, writing nothing, while KV holds a key the per-node agent would serve
differently from hastate, and names each with what to do: a backend-wide key
(the agent ignores it), a value that is not one of its four words (a JSON
value: hastate migrate-kv), a key that expires (--for) or ramps (--ramp).
--force marks the migration anyway. A migration already marked is left as
it is (exit 0).

` + migrationLong,
		Example: `  hastate migration start --reason "gstg rollout, issue 1234" --dry-run
  hastate migration start --reason "gstg rollout, issue 1234" --kv-prefix gitlab-haproxy-agent/`,
		Args: argCount(cobra.NoArgs, "no arguments"),
		RunE: func(c *cobra.Command, _ []string) error {
			wr, err := cf.writer()
			if err != nil {
				return err
			}
			o.Now, o.DryRun = time.Now(), dryRun
			m, wrote, err := migration.Start(c.Context(), wr, o)
			if err != nil {
				return err
			}
			switch {
			case dryRun:
				fmt.Fprintf(stdout, "migration start (dry run, nothing written): would set %s%s\n", m.Key, m.Marker.Describe())
			case wrote:
				fmt.Fprintf(stdout, "migration start: %s written\n", m.Key)
			default:
				fmt.Fprintln(stdout, "migration start: already marked, nothing written")
			}
			m.Print(stdout)
			return nil
		},
	}
	cf.add(c)
	c.Flags().StringVar(&o.Reason, "reason", "", "why, shown in status")
	c.Flags().StringVar(&o.By, "by", osUser(), "who, shown in status")
	c.Flags().BoolVar(&o.Force, "force", false, "mark the migration although KV holds keys the per-node agent serves differently (they are named)")
	c.Flags().BoolVar(&dryRun, "dry-run", false, "check and print, write nothing")
	return c
}

func migrationStatusCmd(stdout io.Writer) *cobra.Command {
	var cf consulFlags
	c := &cobra.Command{
		Use:   "status",
		Short: "Show whether a migration is marked, and the keys the per-node agent serves differently",
		Long: `Show whether a migration is marked, and the keys the per-node agent serves differently.

status reads Consul (consistently): the marker <kv-prefix>config/migration,
and every state and meta key, naming each key that the per-node agent would
serve differently from hastate (a backend-wide key, a value that is not one
of its four words, a key that expires or ramps). It exits 0 when it could
read Consul, whatever it found; 4 when it could not. What each agent
answers, server by server: hastate compare --agent HOST:PORT.`,
		Example: `  hastate migration status
  hastate migration status --kv-prefix gitlab-haproxy-agent/`,
		Args: argCount(cobra.NoArgs, "no arguments"),
		RunE: func(c *cobra.Command, _ []string) error {
			wr, err := cf.writer()
			if err != nil {
				return err
			}
			m, err := migration.Read(c.Context(), wr)
			if err != nil {
				return err
			}
			m.Print(stdout)
			return nil
		},
	}
	cf.add(c)
	return c
}

func migrationFinishCmd(stdout io.Writer) *cobra.Command {
	var (
		cf     consulFlags
		addr   string
		dryRun bool
	)
	c := &cobra.Command{
		Use:   "finish",
		Short: "End the migration: backend-wide keys, --for and --ramp work again",
		Long: `End the migration: backend-wide keys, --for and --ramp work again.

finish deletes <kv-prefix>config/migration (on condition that it is the
marker it read). Do it only once no HAProxy node asks a per-node agent any
more (every agent-addr points at hastate's load balancer, the local agents
are stopped): from then on writes use backend-wide keys, --for and --ramp,
which a node still on its local agent would not serve. finish prints the
HAProxy nodes that poll hastate (from the replica at --addr), so that you
can count them against the fleet.`,
		Example: `  hastate migration finish --dry-run      # the HAProxy nodes hastate sees, nothing written
  hastate migration finish`,
		Args: argCount(cobra.NoArgs, "no arguments"),
		RunE: func(c *cobra.Command, _ []string) error {
			wr, err := cf.writer()
			if err != nil {
				return err
			}
			if r, err := fleet.NewReplica(addr); err == nil {
				if nodes, err := fleet.PollingHAProxies(c.Context(), r); err != nil {
					fmt.Fprintf(c.ErrOrStderr(), "warning: cannot list the HAProxy nodes that poll hastate: %v\n", err)
				} else {
					fmt.Fprintf(stdout, "%d HAProxy nodes poll hastate: %s\n", len(nodes), nodes)
				}
			}
			m, wrote, err := migration.Finish(c.Context(), wr, migration.Options{DryRun: dryRun})
			if err != nil {
				return err
			}
			switch {
			case !m.Marked && !wrote:
				fmt.Fprintf(stdout, "migration finish: no migration is marked (%s does not exist), nothing written\n", m.Key)
			case dryRun:
				fmt.Fprintf(stdout, "migration finish (dry run, nothing written): would delete %s (marked%s)\n", m.Key, m.Marker.Describe())
			default:
				fmt.Fprintf(stdout, "migration finish: %s deleted: writes use backend-wide keys, --for and --ramp again, and undrains ramp\n", m.Key)
			}
			return nil
		},
	}
	cf.add(c)
	replicaFlag(c, &addr)
	c.Flags().BoolVar(&dryRun, "dry-run", false, "print, write nothing")
	return c
}

func compareCmd(stdout io.Writer) *cobra.Command {
	var (
		cf           consulFlags
		addr, agent  string
		parallel     int
		checkTimeout time.Duration
	)
	c := &cobra.Command{
		Use:   "compare --agent HOST:PORT [<selector>...]",
		Short: "Ask an agent (a per-node agent) about every server as HAProxy would, and compare with hastate",
		Long: `Ask an agent (a per-node agent) about every server as HAProxy would, and compare with hastate.

compare checks that the replica (--addr) reads this --kv-prefix of this
Consul, waits until it holds every write made to Consul before it started,
then asks the agent at --agent about every server the
cluster knows (KV keys and what HAProxy polled, over every replica; or those
the selectors match, a literal backend/server even when unknown): it sends
"<backend>/<server>\n" and reads one line, as HAProxy's agent-check does.
Each answer is compared with hastate's:
  - the same line is the same answer;
  - a ramp counts as ready: hastate's "ready 40%" mid-ramp equals any
    "ready N%" above 0;
  - no answer (the agent closes without a line) is an answer: HAProxy keeps
    the server's state. It equals hastate only where hastate withholds too
    (an invalid key with no valid value).
A server the agent cannot be asked about (connection refused, no answer
within --check-timeout) cannot be confirmed. When Consul's index moves while
it compares (a write in flight), compare starts again (3 times at most).

Exit codes: 0 the same for every server; 1 the answers differ (every such
server is named, with where hastate's answer comes from); 3 a selector
matched nothing; 4 cannot confirm (the agent, the replica or Consul could
not be read well enough). The agent port of a replica (--agent
<replica>:9777) must compare clean: it is the check that compare itself works.`,
		Example: `  hastate compare --agent 10.1.2.3:9777                  # a node still on its per-node agent
  hastate compare --agent 10.1.2.3:9777 'canary_*/*'
  hastate compare --agent hastate-0.hastate:9777         # hastate against itself: exit 0`,
		Args: cobra.ArbitraryArgs,
		RunE: func(c *cobra.Command, args []string) error {
			if agent == "" {
				return usageError(c, errors.New("--agent HOST:PORT is required: the agent port to compare (a per-node agent's, e.g. 10.1.2.3:9777)"))
			}
			var sels []ctl.Selector
			if len(args) > 0 {
				var err error
				if sels, err = ctl.ParseSelectors(args); err != nil {
					return err
				}
			}
			wr, err := cf.writer()
			if err != nil {
				return err
			}
			r, err := fleet.NewReplica(addr)
			if err != nil {
				return err
			}
			res, err := migration.Compare(c.Context(), migration.CompareOptions{Agent: agent, Parallel: parallel, CheckTimeout: checkTimeout,
				Gate: fleet.GateOptions{Consul: wr.Client, ConsulAddr: wr.Addr, Prefix: wr.Prefix, Replica: r, Selectors: sels}})
			if res.Checked > 0 || err == nil {
				res.Print(stdout, agent, r.Addr())
			}
			switch {
			case err != nil:
				return err
			case len(res.Differ) > 0:
				return fmt.Errorf("the agent at %s answers %d servers differently from hastate (listed above)", agent, len(res.Differ))
			case len(res.Unconfirmed) > 0:
				return fmt.Errorf("%w: %d servers could not be asked at %s (listed above)", ctl.ErrCannotConfirm, len(res.Unconfirmed), agent)
			}
			return nil
		},
	}
	cf.add(c)
	replicaFlag(c, &addr)
	c.Flags().StringVar(&agent, "agent", "", "the agent port to ask, host:port (a per-node agent's, or a replica's 9777)")
	c.Flags().IntVar(&parallel, "parallel", 16, "checks at once")
	c.Flags().DurationVar(&checkTimeout, "check-timeout", 2*time.Second, "bound of one check; a slower agent cannot be confirmed")
	return c
}
