package fleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl"
	"github.com/hastate/hastate/state"
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
	case errors.Is(err, api.ErrOlderReplica):
		return ctl.CannotConfirm(fmt.Errorf("hastate replica at %s: %w; point HASTATE_ADDR / --addr at a replica that runs this CLI's release or later", r.Addr(), err))
	case errors.As(err, &se) && se.Code == http.StatusServiceUnavailable:
		// A replica answers its API whether it is ready or not: a 503 is
		// a load balancer in front of the replicas with none ready.
		return ctl.CannotConfirm(ctl.Explain(fmt.Sprintf("no replica is ready: %s answered HTTP 503, as a load balancer does when none of the replicas behind it passes its readiness check; "+
			"the cluster has probably lost its quorum (no raft leader): every replica withholds its answers and HAProxy keeps each server's last state; "+
			"ask a replica directly (HASTATE_ADDR=<replica>:9778 hastate status) to see why, and see %s", r.Addr(), RunbookNoLeader), err))
	case errors.As(err, &se):
		return ctl.CannotConfirm(fmt.Errorf("hastate replica at %s: %w: %s", r.Addr(), err, replicaAdvice))
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET):
		// A replica answers; a TCP load balancer with no ready replica
		// behind it closes or resets the connection instead.
		return ctl.CannotConfirm(ctl.Explain(fmt.Sprintf("%s closed the connection without an answer: if it is a load balancer, no replica behind it may be ready "+
			"(a lost quorum? see %s); ask a replica directly (HASTATE_ADDR=<replica>:9778 hastate status) to see why", r.Addr(), RunbookNoLeader), err))
	}
	return ctl.CannotConfirm(ctl.CallError(ctx, "hastate replica", r.Addr(), err, replicaAdvice))
}

// Fleet reads the servers the selectors match (none: every server the
// cluster knows): KV keys, wildcard followers and what HAProxy polled on
// any replica. The replica filters (and pages), so a command about a few
// servers never reads the fleet's table; with selectors, Backends names
// every backend the cluster knows (see KnownRows). Which replicas
// answered is in Replicas; Live says whether those are enough.
func (r *Replica) Fleet(ctx context.Context, sels ...ctl.Selector) (api.StateView, error) {
	f, err := filterOf(sels)
	if err != nil {
		return api.StateView{}, err
	}
	v, err := r.c.StateOf(ctx, api.Query{Filter: f}, true)
	return v, r.explain(ctx, err)
}

// BackendsOf returns the selectors that cover the whole backends sels
// name (backend/* for each): what a write's capacity guard reads.
func BackendsOf(sels []ctl.Selector) []ctl.Selector {
	var out []ctl.Selector
	for _, s := range sels {
		b := ctl.Selector{Backend: s.Backend, Server: "*"}
		if !slices.Contains(out, b) {
			out = append(out, b)
		}
	}
	return out
}

// KnownRows is v's rows, plus a backend-wide row for every backend the
// cluster knows that none of them names (a filtered view's Backends): what
// a selector that matches nothing is compared with, for its "did you
// mean" and the list of known backends.
func KnownRows(v api.StateView) []api.ServerState {
	rows := slices.Clone(v.Servers)
	have := map[string]bool{}
	for _, r := range rows {
		have[r.Backend] = true
	}
	for _, b := range v.Backends {
		if !have[b] {
			rows = append(rows, api.ServerState{Backend: b, Server: "*", Source: "known"})
		}
	}
	return rows
}

func filterOf(sels []ctl.Selector) (api.Filter, error) {
	var ss []string
	for _, s := range sels {
		ss = append(ss, s.String())
	}
	f, err := api.ParseFilter(ss)
	if err != nil {
		return f, fmt.Errorf("%w: %v", ctl.ErrUsage, err)
	}
	return f, nil
}

// HAProxies reads the cluster's record of which HAProxy nodes exist, with
// what each replica that answered saw.
func (r *Replica) HAProxies(ctx context.Context) (api.HAProxiesView, error) {
	return r.c.HAProxies(ctx)
}

// Live says whether the replicas that answered a cluster-wide read
// (answers) are enough to decide: every replica answered, or the cluster
// records which HAProxy nodes exist and every one that polled within
// api.HAProxyRecent was seen by a replica that answers within
// api.SeenWithin (a dead replica's HAProxy nodes move to the live ones
// once the load balancer drops it). Otherwise it is ctl.ErrCannotConfirm,
// naming each HAProxy seen by no live replica, or, while the record is not
// kept (a rolling upgrade from a release without it), the replicas that
// did not answer. note, when not empty, says that a replica did not answer
// and why that does not stop the command.
func (r *Replica) Live(ctx context.Context, answers []api.ReplicaAnswer) (note string, err error) {
	miss := Missing(answers)
	if miss == nil {
		return "", nil
	}
	v, err := r.HAProxies(ctx)
	switch {
	case errors.Is(err, api.ErrOlderReplica):
		return "", fmt.Errorf("%w (replica at %s runs a release that does not record which HAProxy nodes exist, so every replica must answer)", miss, r.Addr())
	case err != nil:
		return "", fmt.Errorf("%w (and which HAProxy nodes exist could not be read: %v)", miss, r.explain(ctx, err))
	case !v.Recorded:
		return "", fmt.Errorf("%w; until the cluster records which HAProxy nodes exist (feature level %d, once every replica runs 0.15.0 or later: /v1/cluster level.waiting), every replica must answer", miss, state.LevelRecorded)
	}
	// Down are the replicas that did not answer the read the command
	// rests on (answering the record's read is not enough: their polls
	// are what is missing).
	var down []string
	for _, a := range answers {
		if !a.Answered {
			down = append(down, fmt.Sprintf("%s (%s)", a.ID, a.Error))
		}
	}
	now := time.Now()
	unseen := v.Unseen(now, answers)
	if len(unseen) == 0 {
		return fmt.Sprintf("replica %s did not answer; every HAProxy that polled in the last %s was seen by a live replica within %s, so the replicas that are up decide",
			strings.Join(down, ", "), api.HAProxyRecent, api.SeenWithin), nil
	}
	var names []string
	for _, h := range unseen {
		last := "never seen by a live replica"
		var latest time.Time
		for _, at := range h.SeenBy {
			if at.After(latest) {
				latest = at
			}
		}
		if !latest.IsZero() {
			last = "last seen by a live replica " + ctl.Ago(now.Sub(latest))
		}
		names = append(names, fmt.Sprintf("HAProxy %s (last poll %s by the cluster's record; %s)", h.HAProxy, ctl.Ago(now.Sub(h.LastSeen)), last))
	}
	return "", fmt.Errorf("%w: %s: seen by no live replica, so what it was last told only %s may know; "+
		"this clears once it polls a replica that is up (the load balancer drops a dead replica within seconds, then its next agent check is seen) "+
		"or that replica is back; an HAProxy that was stopped for good clears %s after its last poll",
		ctl.ErrCannotConfirm, strings.Join(names, "; "), strings.Join(down, ", "), api.HAProxyRecent)
}

// Cluster reads the replica's view of the raft cluster.
func (r *Replica) Cluster(ctx context.Context) (api.ClusterInfo, error) {
	v, err := r.c.Cluster(ctx)
	return v, r.explain(ctx, err)
}

// Pollers reads which HAProxy asked which replica for which of the
// servers the selectors match (none: all), every page of them.
func (r *Replica) Pollers(ctx context.Context, sels ...ctl.Selector) (api.PollersView, error) {
	f, err := filterOf(sels)
	if err != nil {
		return api.PollersView{}, err
	}
	v, err := r.c.PollersOf(ctx, api.Query{Filter: f}, true)
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
