package fleet

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl"
)

// Replica reads what the cluster knows from one hastate replica.
type Replica struct {
	c *api.Client
}

const replicaAdvice = "check HASTATE_ADDR / --addr (a replica's HTTP address, port 9778) or ask another replica"

// NewReplica returns a reader for the replica at addr (a URL, or a bare
// host:port).
func NewReplica(addr string) (*Replica, error) {
	c, err := api.NewClient(addr, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: HASTATE_ADDR / --addr: %v", ctl.ErrUsage, err)
	}
	return &Replica{c: c}, nil
}

// Addr is the replica's base URL.
func (r *Replica) Addr() string { return r.c.Addr() }

// explain says why a call to the replica failed; it is ctl.ErrCannotConfirm.
func (r *Replica) explain(ctx context.Context, err error) error {
	var se *api.StatusError
	switch {
	case err == nil:
		return nil
	case errors.Is(err, api.ErrTruncated):
		return ctl.CannotConfirm(fmt.Errorf("hastate replica at %s: %w; refusing to act on a partial list (it could hide a drained server or a lagging HAProxy)", r.Addr(), err))
	case errors.As(err, &se):
		return ctl.CannotConfirm(fmt.Errorf("hastate replica at %s: %w: %s", r.Addr(), err, replicaAdvice))
	}
	return ctl.CannotConfirm(ctl.CallError(ctx, "hastate replica", r.Addr(), err, replicaAdvice))
}

// Fleet reads every server the cluster knows: KV keys, wildcard followers
// and what HAProxy polled on any replica. Which replicas answered is in
// Replicas; Missing says who did not.
func (r *Replica) Fleet(ctx context.Context) (api.StateView, error) {
	v, err := r.c.State(ctx, true)
	return v, r.explain(ctx, err)
}

// Cluster reads the replica's view of the raft cluster.
func (r *Replica) Cluster(ctx context.Context) (api.ClusterInfo, error) {
	v, err := r.c.Cluster(ctx)
	return v, r.explain(ctx, err)
}

// Pollers reads which HAProxy asked which replica for which server.
func (r *Replica) Pollers(ctx context.Context) (api.PollersView, error) {
	v, err := r.c.Pollers(ctx, true)
	return v, r.explain(ctx, err)
}

// Missing names the replicas that did not answer a cluster-wide read, as
// an ctl.ErrCannotConfirm error; nil when all answered.
func Missing(answers []api.ReplicaAnswer) error {
	var miss []string
	for _, a := range answers {
		if !a.Answered {
			miss = append(miss, fmt.Sprintf("replica %s unreachable (%s)", a.ID, a.Error))
		}
	}
	if len(miss) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s: what only it saw is missing; retry, or check that replica with "+
		"hastate status --addr <its HTTP address> (port 9778 by default; an address in the error above is its raft port, which the replicas ask each other on)",
		ctl.ErrCannotConfirm, strings.Join(miss, "; "))
}

// Server reads one server's row (/v1/state/<backend>/<server>), known to
// the cluster or not.
func (r *Replica) Server(ctx context.Context, backend, srv string) (api.ServerState, error) {
	var row api.ServerState
	err := r.c.Get(ctx, "/v1/state/"+url.PathEscape(backend)+"/"+url.PathEscape(srv), &row)
	return row, r.explain(ctx, err)
}
