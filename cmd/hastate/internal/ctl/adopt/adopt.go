// Package adopt is hastate adopt-consul: the adoption marker
// (state.Adoption, <prefix>config/adopt) written with the operator's
// Consul token into the Consul cluster to adopt, and the wait until the
// raft leader adopted it. Adopting changes what every HAProxy is told, so
// it takes the authority of a write to that Consul's prefix, proven to
// that Consul by the write itself; a replica's HTTP port adopts nothing.
//
// It may import ctl and write; nothing imports it but cmd/hastate.
package adopt

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	consul "github.com/hashicorp/consul/api"
	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/write"
	"github.com/hastate/hastate/kvsync"
	"github.com/hastate/hastate/state"
)

// Options are adopt-consul's: the cluster confirmed (--cluster), and who
// and why, shown in the marker and the leader's log.
type Options struct {
	Cluster    string
	By, Reason string
	Now        time.Time
	// Poll is the gap between two reads of the replica while waiting (0:
	// 250ms).
	Poll time.Duration
}

// Replica is what Mark reads of a replica: /v1/cluster.
type Replica interface {
	Cluster(ctx context.Context) (api.ClusterInfo, error)
}

// Result is what Mark did: the marker written (its key and value), the
// Consul it went to, and the source raft records at the end.
type Result struct {
	Key      string
	Marker   state.Adoption
	Consul   state.MirrorSource // the Consul the marker was written into
	Recorded *state.MirrorSource
	// Unchanged: raft recorded the cluster already; nothing was written.
	Unchanged bool
}

// Mark writes the adoption marker for o.Cluster into the Consul w writes
// to, after checking that it is that cluster, and waits (until ctx ends)
// until the replica reports that raft records it. in is the replica's
// /v1/cluster, read first: its prefix is the one the marker goes under,
// its recorded source the one the marker replaces.
func Mark(ctx context.Context, r Replica, in api.ClusterInfo, w write.Writer, o Options) (Result, error) {
	res := Result{Key: in.KVPrefix + state.AdoptKey, Recorded: in.Source}
	switch {
	case in.Source == nil:
		return res, fmt.Errorf("%w: nothing adopted: raft records no Consul cluster yet (the leader records the one it reads with its first read), so there is nothing to replace", ctl.ErrNotDone)
	case state.NamesSource(o.Cluster, *in.Source):
		res.Unchanged = true
		return res, nil
	}
	id, err := kvsync.ReadIdentity(ctx, w.Client)
	if err != nil {
		return res, ctl.ConsulError(ctx, w.Addr, fmt.Errorf("read which Consul cluster it is: %w", err), "nothing was written, nothing adopted")
	}
	ns, part := kvsync.Scope(w.Addr)
	res.Consul = id.Source(in.KVPrefix, ns, part)
	if !state.NamesSource(o.Cluster, res.Consul) {
		return res, fmt.Errorf("%w: nothing written, nothing adopted: the Consul at %s is %s, not --cluster %s; a marker adopts only the cluster that holds it: "+
			"point CONSUL_HTTP_ADDR / --consul-addr at the Consul to adopt", ctl.ErrNotDone, w.Addr, res.Consul, o.Cluster)
	}
	res.Marker = state.Adoption{Cluster: o.Cluster, ReplacesCluster: state.SourceID(*in.Source), ReplacesPrefix: in.Source.Prefix,
		At: o.Now, By: o.By, Reason: o.Reason}
	// One key, set as it is: the write itself is the proof of authority.
	// Consul answers 403 for a token that may not write it ("Permission
	// denied") and for one it does not know ("ACL not found").
	p := &consul.KVPair{Key: res.Key, Value: []byte(state.MarshalAdoption(res.Marker))}
	if _, err := w.Client.KV().Put(p, (&consul.WriteOptions{}).WithContext(ctx)); err != nil {
		var se consul.StatusError
		if errors.As(err, &se) && (se.Code == http.StatusForbidden || se.Code == http.StatusUnauthorized) {
			return res, &ctl.PermissionError{Refused: "write " + res.Key, Rule: ctl.WriteRule(in.KVPrefix, res.Key),
				Consul: fmt.Sprintf("%d %s", se.Code, se.Body), Note: "nothing was written, nothing adopted"}
		}
		note := "nothing was written, nothing adopted"
		if ctx.Err() != nil {
			note = "the marker may or may not have been written: `consul kv get " + res.Key + "` shows whether it was"
		}
		return res, ctl.ConsulError(ctx, w.Addr, err, note)
	}
	return res, wait(ctx, r, &res, o)
}

// wait reads the replica until raft records the marker's cluster.
func wait(ctx context.Context, r Replica, res *Result, o Options) error {
	poll := o.Poll
	if poll <= 0 {
		poll = 250 * time.Millisecond
	}
	var last error
	for {
		in, err := r.Cluster(ctx)
		switch {
		case err == nil && in.Source != nil && state.NamesSource(o.Cluster, *in.Source) && in.Source.Prefix == res.Consul.Prefix:
			res.Recorded = in.Source
			return nil
		case err == nil:
			res.Recorded, last = in.Source, nil
			if in.Mirror != nil && !in.Mirror.CanMirror() {
				last = fmt.Errorf("this replica's mirror verdict: %s", in.Mirror)
			}
		default:
			last = err
		}
		t := time.NewTimer(poll)
		select {
		case <-ctx.Done():
			t.Stop()
			msg := fmt.Sprintf("the adoption marker is written (%s), but raft still records %s: the leader adopts the cluster when its own read of it holds the marker "+
				"(every replica must read that Consul, with a token that may read the prefix: /v1/cluster mirror, the leader's log); "+
				"it will as soon as it does, or delete the marker to call it off (consul kv delete %s)", res.Key, res.Recorded, res.Key)
			if last != nil {
				msg += "; last: " + last.Error()
			}
			return fmt.Errorf("%w: %s", ctl.ErrNotDone, msg)
		case <-t.C:
		}
	}
}

// Print writes what Mark did.
func (r Result) Print(out io.Writer) {
	if r.Unchanged {
		fmt.Fprintf(out, "nothing to adopt: raft records this cluster already (%s)\n", r.Recorded)
		return
	}
	fmt.Fprintf(out, "adoption marker written into %s: %s = %s\n", r.Consul, r.Key, state.MarshalAdoption(r.Marker))
	fmt.Fprintf(out, "adopted: raft records %s\n", r.Recorded)
	fmt.Fprintf(out, "The leader applies its read of this Consul: every HAProxy is told what it holds. Check with hastate status. "+
		"The marker names the source it replaced, so it adopts nothing again; it may stay, or be deleted (consul kv delete %s).\n", r.Key)
}
