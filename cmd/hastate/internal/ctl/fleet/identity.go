package fleet

import (
	"context"
	"fmt"
	"time"

	consul "github.com/hashicorp/consul/api"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl"
	"github.com/hastate/hastate/kvsync"
)

// ReplicaUnknownError: the replica could not be asked, or cannot say what
// it reads (it predates kv_prefix in /v1/cluster, or has not read its
// Consul's identity yet). It is ctl.ErrCannotConfirm, and the "no replica to
// ask" guard of a write (--allow-no-replica lifts it).
type ReplicaUnknownError struct{ err error }

func (e ReplicaUnknownError) Error() string   { return e.err.Error() }
func (e ReplicaUnknownError) Unwrap() []error { return []error{e.err, ctl.ErrCannotConfirm} }

// CheckReplica checks, before anything else, that the replica reads the
// KV prefix prefix of the same Consul cluster as c: a write nobody serves
// is the worst failure an operator can have, and a wait for an index the
// replica never reaches tells nothing. A mismatch is ctl.ErrWrongReplica,
// naming both prefixes (or clusters); a replica that cannot tell is
// ReplicaUnknownError.
// identityWait is how long CheckReplica waits for a replica that cannot
// say yet which Consul cluster it reads: a few of its 2s retries.
const identityWait = 5 * time.Second

func CheckReplica(ctx context.Context, c *consul.Client, consulAddr, prefix string, r *Replica) error {
	ci, err := r.Cluster(ctx)
	if err != nil {
		return ReplicaUnknownError{fmt.Errorf("cannot confirm which KV prefix the replica reads: %w", err)}
	}
	if ci.KVPrefix == "" {
		return ReplicaUnknownError{fmt.Errorf("replica %s at %s (version %q) does not say which KV prefix it reads (it predates this CLI); "+
			"ask an upgraded replica (HASTATE_ADDR / --addr)", ci.NodeID, r.Addr(), ci.Version)}
	}
	if ci.KVPrefix != prefix {
		return fmt.Errorf("%w: refused, nothing was written: replica %s at %s reads KV prefix %q, this command uses %q (--kv-prefix / HASTATE_KV_PREFIX): "+
			"no replica there would serve it; use --kv-prefix %s, or point HASTATE_ADDR / --addr at a replica that reads %q",
			ctl.ErrWrongReplica, ci.NodeID, r.Addr(), ci.KVPrefix, prefix, ci.KVPrefix, prefix)
	}
	mine, err := kvsync.ReadIdentity(ctx, c)
	if err != nil {
		return ctl.ConsulError(ctx, consulAddr, err, "nothing was written")
	}
	// A replica re-reads its Consul's identity every 2s while it fails
	// (it started while Consul was down, say): this Consul answers, so it
	// is waited for a moment, never longer than ctx.
	for wait := time.Now().Add(identityWait); (ci.Consul == nil || ci.Consul.Cluster == "") && time.Now().Before(wait); {
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
		if ctx.Err() != nil {
			break
		}
		if again, err := r.Cluster(ctx); err == nil {
			ci = again
		}
	}
	if ci.Consul == nil || ci.Consul.Cluster == "" {
		why := "it has not read its Consul yet"
		if ci.Consul != nil && ci.Consul.Error != "" {
			why = ci.Consul.Error
		}
		return ReplicaUnknownError{fmt.Errorf("replica %s at %s cannot say which Consul cluster it reads (%s); this command writes prefix %q to %s (%s)",
			ci.NodeID, r.Addr(), why, prefix, consulAddr, mine)}
	}
	theirs := kvsync.Identity{Datacenter: ci.Consul.Datacenter, Cluster: ci.Consul.Cluster}
	if !theirs.Same(mine) {
		return fmt.Errorf("%w: refused, nothing was written: replica %s at %s reads prefix %q of another Consul cluster (%s) than this command writes to at %s (%s): "+
			"no replica there would serve it; check CONSUL_HTTP_ADDR / --consul-addr and HASTATE_ADDR / --addr",
			ctl.ErrWrongReplica, ci.NodeID, r.Addr(), ci.KVPrefix, theirs, consulAddr, mine)
	}
	return nil
}
