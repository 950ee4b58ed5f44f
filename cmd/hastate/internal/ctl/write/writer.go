package write

import (
	"context"
	"errors"
	"fmt"
	"strings"

	consul "github.com/hashicorp/consul/api"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl"
	"github.com/hastate/hastate/kvsync"
	"github.com/hastate/hastate/state"
)

// Writer writes desired state to Consul KV.
type Writer struct {
	Client *consul.Client
	Prefix string
	Addr   string // Consul's address, for messages
}

// NewWriter returns a Writer for the Consul at addr ("": CONSUL_HTTP_ADDR,
// else 127.0.0.1:8500; see kvsync.ClientConfig) and the KV prefix.
func NewWriter(addr, prefix string) (Writer, error) {
	if !strings.HasSuffix(prefix, "/") {
		return Writer{}, fmt.Errorf("%w: --kv-prefix %q must end with '/'", ctl.ErrUsage, prefix)
	}
	cfg := kvsync.ClientConfig(addr)
	cl, err := consul.NewClient(cfg)
	if err != nil {
		return Writer{}, fmt.Errorf("consul client for %q: %w (check CONSUL_HTTP_ADDR / --consul-addr and the CONSUL_* TLS variables)", cfg.Address, err)
	}
	return Writer{Client: cl, Prefix: prefix, Addr: cfg.Address}, nil
}

// Apply writes the plan as one transaction, conditional on every key the
// plan read (Plan.Deps): a state key written is set or deleted only if it
// still has the index it was read at (absent: only if it still does not
// exist), and a key read but not written is checked the same way. Meta
// keys follow their state key. A transaction that fails a condition
// returns a *ConflictError.
func (w Writer) Apply(ctx context.Context, p Plan) error {
	deps := map[string]KVKey{}
	for _, d := range p.Deps {
		deps[d.Key] = d
	}
	ops := make(consul.TxnOps, 0, 2*len(p.Ops)+len(p.Deps))
	written := map[string]bool{}
	for _, o := range p.Ops {
		d, dep := deps[o.Key]
		written[o.Key] = true
		for i, t := range TxnOps(o) {
			op := &consul.KVTxnOp{Verb: consul.KVSet, Key: t.Key, Value: []byte(t.Value)}
			if t.Delete {
				op = &consul.KVTxnOp{Verb: consul.KVDelete, Key: t.Key}
			}
			if i == 0 && dep { // the state key: conditional
				switch {
				case t.Delete:
					op.Verb, op.Index = consul.KVDeleteCAS, d.Index
				default:
					op.Verb, op.Index = consul.KVCAS, d.Index // 0: only if absent
				}
			}
			ops = append(ops, &consul.TxnOp{KV: op})
		}
	}
	for _, d := range p.Deps {
		if written[d.Key] {
			continue
		}
		op := &consul.KVTxnOp{Verb: consul.KVCheckNotExists, Key: d.Key}
		if d.Present {
			op = &consul.KVTxnOp{Verb: consul.KVCheckIndex, Key: d.Key, Index: d.Index}
		}
		ops = append(ops, &consul.TxnOp{KV: op})
	}
	return w.Txn(ctx, ops, "nothing was written", "running the command again is safe")
}

// ConflictError is a transaction Consul rolled back because a condition
// failed: a key it was conditional on changed since it was read. Keys are
// the keys of the failed conditions.
type ConflictError struct {
	Keys []string
	What string // Consul's reasons
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("a key changed since it was read (%s): %s", strings.Join(e.Keys, ", "), e.What)
}

// Is makes errors.Is(err, ErrConflict) true.
func (e *ConflictError) Is(target error) bool { return target == ErrConflict }

// conditional reports whether a verb only applies when a key is as read.
func conditional(v consul.KVOp) bool {
	switch v {
	case consul.KVCAS, consul.KVDeleteCAS, consul.KVCheckIndex, consul.KVCheckNotExists:
		return true
	}
	return false
}

// Txn runs one Consul transaction. unwritten says what a failure means
// ("nothing was written"), again what to do when the request may have
// reached Consul before the deadline. A rollback whose failed operations
// are all conditions is a *ConflictError (decided from the operations
// Consul names, not from its text); any other rollback says what Consul
// said.
func (w Writer) Txn(ctx context.Context, ops consul.TxnOps, unwritten, again string) error {
	_, err := w.TxnResults(ctx, ops, unwritten, again)
	return err
}

// TxnResults is Txn returning, when it committed, Consul's results: the
// key of each KV op as written, with its modify index.
func (w Writer) TxnResults(ctx context.Context, ops consul.TxnOps, unwritten, again string) (consul.TxnResults, error) {
	ok, resp, _, err := w.Client.Txn().Txn(ops, (&consul.QueryOptions{}).WithContext(ctx))
	if err != nil {
		note := unwritten
		if ctx.Err() != nil {
			// The request may have reached Consul before the deadline.
			note = "the transaction may or may not have been applied (all or nothing); " + again
		}
		return nil, ctl.ConsulError(ctx, w.Addr, err, note)
	}
	if ok {
		return resp.Results, nil
	}
	var msgs, keys []string
	allConditions := resp != nil && len(resp.Errors) > 0
	for _, e := range resp.Errors {
		// Consul names a permission failure only in its text (a TxnError
		// has no code): "Permission denied: token ... lacks permission
		// 'key:write' on ...".
		if strings.Contains(e.What, "Permission denied") && e.OpIndex >= 0 && e.OpIndex < len(ops) && ops[e.OpIndex].KV != nil {
			key := ops[e.OpIndex].KV.Key
			return nil, &ctl.PermissionError{Refused: "write " + key, Rule: ctl.WriteRule(w.Prefix, key), Consul: e.What,
				Note: "consul rolled back the transaction, " + unwritten + " (meta keys included: one transaction)"}
		}
		msgs = append(msgs, e.What)
		if e.OpIndex < 0 || e.OpIndex >= len(ops) || ops[e.OpIndex].KV == nil || !conditional(ops[e.OpIndex].KV.Verb) {
			allConditions = false
			continue
		}
		keys = append(keys, ops[e.OpIndex].KV.Key)
	}
	what := strings.Join(msgs, "; ")
	if allConditions {
		return nil, &ConflictError{Keys: keys, What: what}
	}
	return nil, fmt.Errorf("consul rolled back the transaction, %s: %s (check the token's KV write permission on the prefix)", unwritten, what)
}

var _ error = (*ConflictError)(nil)

// isConflict reports whether err is a failed condition.
func isConflict(err error) bool {
	var c *ConflictError
	return errors.As(err, &c)
}

// ErrConflict: a transaction's index check failed (a concurrent write).
var ErrConflict = errors.New("a key changed since it was read")

// MigrationKey is the full KV key of the migration marker.
func (w Writer) MigrationKey() string { return w.Prefix + state.MigrationKey }
