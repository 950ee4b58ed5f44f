package app

// This file holds the adoption of a Consul cluster (docs/runbook.md,
// "Adopting a restored or rebuilt Consul"). Adopting changes what every
// HAProxy is told, so it takes a writer's authority over the Consul to be
// adopted, proven to that Consul: the operator (hastate adopt-consul)
// writes the marker <prefix>config/adopt with a writer token into it
// (state.Adoption), and the raft leader adopts the cluster it reads only
// when its own read of it holds a marker naming that cluster and the
// source recorded now. No HTTP request adopts anything.

import (
	"context"
	"errors"
	"sync"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/cluster"
	"github.com/hastate/hastate/kvsync"
	"github.com/hastate/hastate/state"
	"go.uber.org/zap"
)

// mirrorNode is what the leader's watch hands its reads to (cluster.Node).
type mirrorNode interface {
	ApplyRead(ctx context.Context, r state.KVRead) error
	RecordedSource() *state.MirrorSource
	Adopt(ctx context.Context, src state.MirrorSource, want string) (*state.MirrorSource, error)
}

var _ mirrorNode = (*cluster.Node)(nil)

// adoptingSink is the leader's Sink: the node's ApplyRead, and, for a
// read the node refuses as another cluster's or prefix's, the adoption
// that the read's own marker asks for (state.AdoptionOf), then the read
// applied. The read is one the watch proved its token may read in full
// and read the identity of, after it, with the same token: the marker in
// it is that cluster's, written by a token that may write its prefix.
type adoptingSink struct {
	n   mirrorNode
	log *zap.Logger

	mu     sync.Mutex
	ignore string // the last marker ignored, logged once
}

var _ kvsync.Sink = (*adoptingSink)(nil)

func (s *adoptingSink) ApplyRead(ctx context.Context, r state.KVRead) error {
	err := s.n.ApplyRead(ctx, r)
	var me *api.MirrorError
	if !errors.As(err, &me) || !me.Verdict.Identity() || r.Source == nil {
		return err
	}
	rec := s.n.RecordedSource()
	if rec == nil {
		return err
	}
	a, why := state.AdoptionOf(r.KV, *r.Source, *rec)
	if errors.Is(why, state.ErrNoAdoption) {
		return err
	}
	if why != nil {
		s.ignored(r.KV[state.AdoptKey], why)
		v := me.Verdict
		v.Detail += "; " + state.AdoptKey + " ignored: " + why.Error()
		return &api.MirrorError{Verdict: v}
	}
	was, aerr := s.n.Adopt(ctx, *r.Source, a.Cluster)
	if aerr != nil {
		s.ignored(r.KV[state.AdoptKey], aerr)
		v := me.Verdict
		v.Detail += "; the adoption marker " + state.AdoptKey + " was not applied: " + aerr.Error()
		return &api.MirrorError{Verdict: v}
	}
	s.log.Warn("adopted a Consul cluster by its adoption marker: the mirror follows it from now on",
		zap.Stringer("source", r.Source), zap.Stringer("was", was), zap.String("marker", state.AdoptKey),
		zap.String("by", a.By), zap.String("reason", a.Reason), zap.Time("written_at", a.At))
	return s.n.ApplyRead(ctx, r)
}

// ignored logs a marker that adopts nothing, once per value.
func (s *adoptingSink) ignored(raw string, why error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ignore == raw {
		return
	}
	s.ignore = raw
	s.log.Warn("the Consul this leader reads holds an adoption marker that adopts nothing; the last state is served",
		zap.String("marker", state.AdoptKey), zap.Error(why))
}
