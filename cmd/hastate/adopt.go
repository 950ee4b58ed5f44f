package main

// This file holds hastate adopt-consul: the operator's "this Consul was
// restored (or rebuilt); mirror it from now on" (docs/runbook.md).

import (
	"errors"
	"fmt"
	"io"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl"
	"github.com/spf13/cobra"
)

func adoptCmd(stdout io.Writer) *cobra.Command {
	var addr, confirm string
	c := &cobra.Command{
		Use:   "adopt-consul --cluster <ID>",
		Short: "Tie the mirror to the Consul cluster the raft leader reads now (after a restore or rebuild)",
		Long: `Tie the mirror to the Consul cluster the raft leader reads now (after a restore or rebuild).

The mirror records which Consul cluster and prefix it mirrors (cluster ID,
datacenter, namespace, partition, prefix). A leader whose Consul is another
cluster applies nothing from it: it says so (readiness, /v1/cluster mirror,
the status page, hastate_mirror_verdict, its logs) and hands leadership to a
replica that reads the recorded cluster. When the recorded cluster is gone
for good and another one is to be mirrored from now on (a Consul restored
from a snapshot under a new cluster ID, a rebuilt one, a DR cluster after
fail-over), adopt it: point every replica at it, make sure its KV holds
the state (what it holds is what every HAProxy is told once adopted),
then run this against the raft leader.

Without --cluster it only shows what would be adopted: the recorded source
and the leader's Consul, with the command to confirm. --cluster must name
the cluster ID (or, for a Consul without Connect, its servers) that it
shows, so that a leader that changed meanwhile adopts nothing.`,
		Example: `  # what would be adopted (exit 2: --cluster is needed to adopt)
  HASTATE_ADDR=hastate-0:9778 hastate adopt-consul
  # adopt it
  HASTATE_ADDR=hastate-0:9778 hastate adopt-consul --cluster 7f42f496-fbc7-8692-05ed-334aa5340c1e`,
		Args: argCount(cobra.NoArgs, "no arguments"),
		RunE: func(c *cobra.Command, _ []string) error {
			ctx := c.Context()
			cl, err := api.NewClient(addr, nil)
			if err != nil {
				return fmt.Errorf("%w: --addr: %v", ctl.ErrUsage, err)
			}
			var in api.ClusterInfo
			if err := cl.Get(ctx, "/v1/cluster", &in); err != nil {
				return fmt.Errorf("%w: read %s/v1/cluster: %v (check --addr / HASTATE_ADDR)", ctl.ErrCannotConfirm, cl.Addr(), err)
			}
			if confirm == "" {
				fmt.Fprint(stdout, adoptPlan(in, cl.Addr()))
				return usageError(c, errors.New("nothing adopted: --cluster <ID> confirms what to adopt"))
			}
			res, err := cl.AdoptConsul(ctx, confirm)
			var ae *api.AdoptError
			switch {
			case errors.As(err, &ae):
				return fmt.Errorf("%w: nothing adopted: %s", ctl.ErrNotDone, ae.Message)
			case err != nil:
				return fmt.Errorf("%w: POST %s/v1/consul/adopt: %v (nothing may have been adopted: check /v1/cluster source)", ctl.ErrCannotConfirm, cl.Addr(), err)
			case res.Unchanged:
				fmt.Fprintf(stdout, "nothing to adopt: the leader %s reads the recorded Consul (%s)\n", res.Leader, res.Adopted)
				return nil
			}
			was := "none"
			if res.Was != nil {
				was = res.Was.String()
			}
			fmt.Fprintf(stdout, "adopted by the leader %s: %s\nwas: %s\nThe leader applies its next read of this Consul (within a few seconds): every HAProxy is then told what it holds. Check with hastate status; replicas that still read the old cluster cannot lead the mirror (/v1/cluster mirror).\n",
				res.Leader, res.Adopted, was)
			return nil
		},
	}
	replicaFlag(c, &addr)
	c.Flags().StringVar(&confirm, "cluster", "", "the cluster ID (or servers) of the Consul to adopt, as shown without this flag")
	return c
}

// adoptPlan says what adopt-consul would adopt, from a replica's view.
func adoptPlan(in api.ClusterInfo, addr string) string {
	s := "recorded in raft: "
	if in.Source == nil {
		s += "nothing yet (the leader records its Consul with its first read)\n"
	} else {
		s += in.Source.String() + "\n"
	}
	s += fmt.Sprintf("this replica (%s, %s; leader: %s) reads: ", in.NodeID, in.State, in.LeaderID)
	id := ""
	switch ci := in.Consul; {
	case ci == nil:
		s += "(not known yet)\n"
	default:
		s += fmt.Sprintf("cluster %s, datacenter %s, servers %s", orNone(ci.ClusterID), orNone(ci.Datacenter), orNone(ci.Cluster))
		if ci.Error != "" {
			s += " (last read failed: " + ci.Error + ")"
		}
		s += "\n"
		id = ci.ClusterID
		if id == "" {
			id = ci.Cluster
		}
	}
	if in.Mirror != nil {
		s += "mirror verdict: " + in.Mirror.String() + "\n"
	}
	if in.State != "leader" {
		s += fmt.Sprintf("run it against the leader %s: only the leader adopts the Consul it reads\n", orNone(in.LeaderID))
	} else if id != "" {
		s += fmt.Sprintf("to adopt it: hastate adopt-consul --addr %s --cluster %s\n", addr, id)
	}
	return s
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}
