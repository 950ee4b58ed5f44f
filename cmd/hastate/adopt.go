package main

// This file holds hastate adopt-consul: the operator's "this Consul was
// restored (or rebuilt); mirror it from now on" (docs/runbook.md), by the
// adoption marker written with a writer's token (ctl/adopt).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/adopt"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/write"
	"github.com/spf13/cobra"
)

func adoptCmd(stdout io.Writer) *cobra.Command {
	var (
		addr, consulAddr string
		o                adopt.Options
	)
	c := &cobra.Command{
		Use:   "adopt-consul --cluster <ID>",
		Short: "Mirror another Consul cluster from now on (after a restore or rebuild): write its adoption marker with a writer's token",
		Long: `Mirror another Consul cluster from now on (after a restore or rebuild): write its adoption marker with a writer's token.

The mirror records which Consul cluster and prefix it mirrors (cluster ID,
datacenter, namespace, partition, prefix). A leader whose Consul is another
cluster applies nothing from it: it says so (readiness, /v1/cluster mirror,
the status page, hastate_mirror_verdict, its logs) and hands leadership to a
replica that reads the recorded cluster. When the recorded cluster is gone
for good and another one is to be mirrored from now on (a Consul restored
from a snapshot under a new cluster ID, a rebuilt one, a DR cluster after
fail-over), adopt it: point every replica at it, make sure its KV holds
the state (what it holds is what every HAProxy is told once adopted),
then run this with CONSUL_HTTP_ADDR pointing at that Consul and
CONSUL_HTTP_TOKEN a token that may write <kv-prefix>config/ there (the
shipped writer policy).

Adopting takes the same authority as a write to that Consul's prefix: this
command writes the adoption marker <kv-prefix>config/adopt into it, naming
the cluster (--cluster, which must be the Consul written to) and the source
raft records now, and the raft leader adopts the cluster when its own read
of that Consul holds the marker. No request to a replica's HTTP port adopts
anything. It then waits (up to --timeout) until the replica at --addr
reports that raft records the cluster.

Without --cluster it only shows what would be adopted: the recorded source
and the replica's Consul, with the command to confirm.

Exit codes: 0 adopted (or raft records the cluster already); 1 not done:
nothing written (the Consul written to is not --cluster, nothing recorded
yet), or the marker is written but the leader has not adopted within
--timeout (it names why; it adopts as soon as it can); 2 no --cluster;
4 the replica or Consul could not be read; 5 permission denied: the token
may not write the marker (nothing written, nothing adopted).`,
		Example: `  # what would be adopted (exit 2: --cluster is needed to adopt)
  HASTATE_ADDR=hastate-0:9778 hastate adopt-consul
  # adopt it: CONSUL_HTTP_ADDR the Consul to adopt, CONSUL_HTTP_TOKEN a writer token of that Consul
  CONSUL_HTTP_ADDR=consul-dr:8500 CONSUL_HTTP_TOKEN=$WRITER_TOKEN hastate adopt-consul --cluster 7f42f496-fbc7-8692-05ed-334aa5340c1e --reason "DR fail-over, INC-123"`,
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
			if o.Cluster == "" {
				fmt.Fprint(stdout, adoptPlan(in, cl.Addr()))
				return usageError(c, errors.New("nothing adopted: --cluster <ID> confirms what to adopt"))
			}
			w, err := write.NewWriter(consulAddr, in.KVPrefix)
			if err != nil {
				return err
			}
			o.Now = time.Now()
			res, err := adopt.Mark(ctx, replicaInfo{cl}, in, w, o)
			if err != nil {
				return err
			}
			res.Print(stdout)
			return nil
		},
	}
	replicaFlag(c, &addr)
	c.Flags().StringVar(&consulAddr, "consul-addr", "", "the HTTP address of the Consul to adopt (default CONSUL_HTTP_ADDR, else 127.0.0.1:8500)")
	c.Flags().StringVar(&o.Cluster, "cluster", "", "the cluster ID (or servers) of the Consul to adopt, as shown without this flag")
	c.Flags().StringVar(&o.Reason, "reason", "", "why, written in the marker and logged by the leader")
	c.Flags().StringVar(&o.By, "by", osUser(), "who, written in the marker and logged by the leader")
	return c
}

// replicaInfo reads a replica's /v1/cluster for adopt.Mark.
type replicaInfo struct{ cl *api.Client }

func (r replicaInfo) Cluster(ctx context.Context) (api.ClusterInfo, error) {
	var in api.ClusterInfo
	err := r.cl.Get(ctx, "/v1/cluster", &in)
	return in, err
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
	if id != "" {
		s += fmt.Sprintf("to adopt it, with a token that may write %sconfig/ in that Consul (the writer policy):\n  CONSUL_HTTP_ADDR=<that Consul> CONSUL_HTTP_TOKEN=<writer token> hastate adopt-consul --addr %s --cluster %s\n",
			in.KVPrefix, addr, id)
	}
	return s
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}
