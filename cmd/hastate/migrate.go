package main

import (
	"fmt"
	"io"
	"time"

	"github.com/hastate/hastate/cmd/hastate/internal/ctl/fleet"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/migration"
	"github.com/spf13/cobra"
)

func migrateCmd(stdout io.Writer) *cobra.Command {
	var (
		cf     consulFlags
		addr   string
		dryRun bool
	)
	c := &cobra.Command{
		Use:   "migrate-kv",
		Short: "Rewrite JSON state keys as the plain word plus a meta key (the runbook's KV contract)",
		Long: `Rewrite JSON state keys as the plain word plus a meta key (the runbook's KV contract).

Every state key that holds a JSON value (written by hastate 0.13.0's CLI, or by
hand) is rewritten as the plain word in the state key (ready, drain, maint,
N%) and the rest (reason, by, at, until, ramp) in <prefix>meta/<backend>/<server>.
What replicas serve does not change. Each batch is one Consul transaction that
checks every key's ModifyIndex: a key an operator writes meanwhile is read again,
never overwritten. Keys whose until has passed (or is a minute away) and invalid
values are left as they are and named. It refuses until every replica runs
0.14.0 or later (the cluster's feature level 2): before that a meta key's until
and ramp do not count yet.`,
		Example: `  hastate migrate-kv --dry-run     # what it would write
  hastate migrate-kv --kv-prefix gitlab-haproxy-agent/`,
		Args: argCount(cobra.NoArgs, "no arguments"),
		RunE: func(c *cobra.Command, _ []string) error {
			wr, err := cf.writer()
			if err != nil {
				return err
			}
			r, err := fleet.NewReplica(addr)
			if err != nil {
				return err
			}
			in, err := r.Cluster(c.Context())
			if err != nil {
				return fmt.Errorf("%w; the replica tells the cluster's feature level (nothing was written)", err)
			}
			res, err := migration.MigrateKV(c.Context(), wr, in.Level.Applied, migration.MigrateOptions{DryRun: dryRun, Now: time.Now()})
			res.Print(stdout, dryRun)
			return err
		},
	}
	cf.add(c)
	replicaFlag(c, &addr)
	c.Flags().BoolVar(&dryRun, "dry-run", false, "print what would be rewritten and write nothing")
	return c
}
