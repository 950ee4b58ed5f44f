package app

// This file holds the operator's adoption of a Consul cluster (POST
// /v1/consul/adopt, hastate adopt-consul): the raft leader records the
// Consul it reads now as the mirror's source, in place of the recorded one.

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/cluster"
	"github.com/hastate/hastate/server"
)

var _ server.Adopter = (*App)(nil)

// AdoptConsul records the Consul cluster this replica reads as the
// mirror's source, if this replica leads, its Consul answers as Consul,
// and confirm names that cluster.
func (a *App) AdoptConsul(ctx context.Context, confirm string) (api.AdoptResult, error) {
	if !a.node.IsLeader() {
		in := a.node.Info()
		return api.AdoptResult{}, &api.AdoptError{Code: http.StatusConflict, LeaderID: in.LeaderID,
			Message: fmt.Sprintf("this replica (%s) is not the raft leader; run the command against the leader %s (e.g. HASTATE_ADDR=<%s's HTTP address>)",
				a.o.NodeID, orUnknown(in.LeaderID), orUnknown(in.LeaderID))}
	}
	if p := a.probe.Health(); !p.Verdict.CanMirror() {
		return api.AdoptResult{}, &api.AdoptError{Code: http.StatusUnprocessableEntity,
			Message: "this leader cannot read its Consul as Consul (" + p.Verdict.String() + "): fix that first; only a Consul that answers can be adopted"}
	}
	src, err := a.identify(ctx)
	if err != nil {
		return api.AdoptResult{}, &api.AdoptError{Code: http.StatusUnprocessableEntity,
			Message: "cannot read which Consul cluster this leader reads: " + err.Error()}
	}
	res := api.AdoptResult{Adopted: src, Leader: a.o.NodeID}
	if rec := a.node.RecordedSource(); rec != nil && api.SourceVerdict(src, *rec).CanMirror() {
		if confirm != src.ClusterID && confirm != src.Servers {
			return api.AdoptResult{}, &api.AdoptError{Code: http.StatusUnprocessableEntity,
				Message: fmt.Sprintf("this leader's Consul is %s, not %q, and it is already the recorded one: nothing to adopt", src, confirm)}
		}
		res.Was, res.Unchanged = rec, true
		return res, nil
	}
	was, err := a.node.Adopt(ctx, src, confirm)
	switch {
	case errors.Is(err, cluster.ErrAdoptRefused):
		return api.AdoptResult{}, &api.AdoptError{Code: http.StatusUnprocessableEntity, Message: err.Error()}
	case errors.Is(err, cluster.ErrNotLeader):
		return api.AdoptResult{}, &api.AdoptError{Code: http.StatusConflict, Message: "leadership moved while adopting; run the command again against the new leader: " + err.Error()}
	case err != nil:
		return api.AdoptResult{}, err
	}
	res.Was = was
	return res, nil
}

func orUnknown(s string) string {
	if s == "" {
		return "(none known)"
	}
	return s
}
