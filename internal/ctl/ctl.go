// Package ctl implements the operator commands: writing desired state to
// Consul KV (one transaction for several keys) and reading status from a
// hastate replica. cmd/hastate parses flags and calls it.
package ctl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/hastate/hastate/kvsync"
	"github.com/hastate/hastate/server"
	"github.com/hastate/hastate/state"
)

// MaxTxnKeys is the most keys one Consul transaction may carry.
const MaxTxnKeys = 64

var (
	// ErrUsage marks errors in what the operator typed.
	ErrUsage = errors.New("usage")
	// ErrTruncated marks a list a replica cut at the most rows one answer
	// carries: no command acts on a partial list.
	ErrTruncated = errors.New("list cut by the replica")
)

// Target is one backend/server (server may be "*" for the whole backend).
type Target struct{ Backend, Server string }

func (t Target) String() string { return t.Backend + "/" + t.Server }

// Key is the KV key for the target under prefix.
func (t Target) Key(prefix string) string {
	return prefix + state.StatePrefix + t.Backend + "/" + t.Server
}

// ParseTargets parses backend/server arguments.
func ParseTargets(args []string) ([]Target, error) {
	if len(args) == 0 {
		return nil, fmt.Errorf("%w: name at least one <backend>/<server> (or <backend>/* for the whole backend)", ErrUsage)
	}
	out := make([]Target, 0, len(args))
	seen := map[Target]bool{}
	for _, a := range args {
		b, s, ok := strings.Cut(a, "/")
		if !ok || b == "" || s == "" || strings.Contains(s, "/") || strings.ContainsAny(a, " \t\r\n") {
			return nil, fmt.Errorf("%w: %q is not <backend>/<server>: write e.g. canary_web/gke-cny-web or canary_web/*", ErrUsage, a)
		}
		t := Target{b, s}
		if !seen[t] {
			seen[t] = true
			out = append(out, t)
		}
	}
	if len(out) > MaxTxnKeys {
		return nil, fmt.Errorf("%w: %d servers in one command; Consul transactions hold at most %d keys: split the command or use <backend>/*", ErrUsage, len(out), MaxTxnKeys)
	}
	return out, nil
}

// Value builds the JSON value written for a state ("ready", "drain",
// "maint" or "N%"), validated with the same parser the replicas use.
func Value(st, reason, by, ramp string) (string, error) {
	v := map[string]string{"state": st}
	if reason != "" {
		v["reason"] = reason
	}
	if by != "" {
		v["by"] = by
	}
	if ramp != "" {
		v["ramp"] = ramp
	}
	b, err := json.Marshal(v)
	if err != nil {
		return "", err
	}
	if _, err := state.ParseValue(string(b)); err != nil {
		return "", fmt.Errorf("%w: %v", ErrUsage, err)
	}
	return string(b), nil
}

// Writer writes desired state to Consul KV.
type Writer struct {
	Client *api.Client
	Prefix string
	Addr   string // Consul's address, for messages
}

// NewWriter returns a Writer for the Consul at addr ("": CONSUL_HTTP_ADDR,
// else 127.0.0.1:8500; see kvsync.ClientConfig) and the KV prefix.
func NewWriter(addr, prefix string) (Writer, error) {
	if !strings.HasSuffix(prefix, "/") {
		return Writer{}, fmt.Errorf("%w: --kv-prefix %q must end with '/'", ErrUsage, prefix)
	}
	cfg := kvsync.ClientConfig(addr)
	cl, err := api.NewClient(cfg)
	if err != nil {
		return Writer{}, fmt.Errorf("consul client for %q: %w (check CONSUL_HTTP_ADDR / --consul-addr and the CONSUL_* TLS variables)", cfg.Address, err)
	}
	return Writer{Client: cl, Prefix: prefix, Addr: cfg.Address}, nil
}

// consulError explains a failed call to the Consul at addr; note (if
// any) comes before the advice, e.g. "nothing was written".
func consulError(ctx context.Context, addr string, err error, note string) error {
	if addr == "" {
		addr = "CONSUL_HTTP_ADDR"
	}
	if note != "" {
		note += "; "
	}
	return callError(ctx, "consul", addr, err, note+"check CONSUL_HTTP_ADDR / --consul-addr and CONSUL_HTTP_TOKEN")
}

// Set writes value to every target's key in one transaction.
func (w Writer) Set(ctx context.Context, targets []Target, value string) error {
	ops := make(api.TxnOps, 0, len(targets))
	for _, t := range targets {
		ops = append(ops, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVSet, Key: t.Key(w.Prefix), Value: []byte(value)}})
	}
	return w.txn(ctx, ops)
}

// Clear deletes every target's key in one transaction.
func (w Writer) Clear(ctx context.Context, targets []Target) error {
	ops := make(api.TxnOps, 0, len(targets))
	for _, t := range targets {
		ops = append(ops, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVDelete, Key: t.Key(w.Prefix)}})
	}
	return w.txn(ctx, ops)
}

func (w Writer) txn(ctx context.Context, ops api.TxnOps) error {
	ok, resp, _, err := w.Client.Txn().Txn(ops, (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		note := "nothing was written"
		if ctx.Err() != nil {
			// The request may have reached Consul before the deadline.
			note = "the transaction may or may not have been applied (all or nothing); running the command again is safe"
		}
		return consulError(ctx, w.Addr, err, note)
	}
	if !ok {
		var msgs []string
		for _, e := range resp.Errors {
			msgs = append(msgs, e.What)
		}
		return fmt.Errorf("consul rolled back the transaction, nothing was written: %s (check the token's KV write permission on the prefix)", strings.Join(msgs, "; "))
	}
	return nil
}

// Row is one server of /v1/state as the status command reads it.
type Row struct {
	Backend  string `json:"backend"`
	Server   string `json:"server"`
	Key      string `json:"key"`
	Source   string `json:"source"`
	Value    string `json:"value"`
	Desired  string `json:"desired"`
	Valid    bool   `json:"valid"`
	Error    string `json:"error"`
	Reason   string `json:"reason"`
	By       string `json:"by"`
	Answer   string `json:"answer"`
	Withheld bool   `json:"withheld"`
	Ramping  *Ramp  `json:"ramping,omitempty"`
}

// Ramp is a ramp in progress as /v1/state shows it.
type Ramp struct {
	Target        string    `json:"target"`
	WeightPercent int       `json:"weight_percent"`
	Started       time.Time `json:"started"`
	ETA           time.Time `json:"eta"`
	Duration      string    `json:"duration"`
}

// String renders the ramp for a status table.
func (r *Ramp) String() string {
	if r == nil {
		return ""
	}
	return fmt.Sprintf("%d%% (eta %s)", r.WeightPercent, r.ETA.Local().Format("15:04:05"))
}

// StateView is the part of /v1/state the status command uses.
type StateView struct {
	HoldsState  bool  `json:"holds_state"`
	Servers     []Row `json:"servers"`
	InvalidKeys []Row `json:"invalid_keys"`
	Total       int   `json:"total"`
	Truncated   bool  `json:"truncated"`
	// KV is the cluster's view of the Consul sync.
	KV struct {
		Warning string `json:"warning"`
	} `json:"kv"`
}

// FetchState reads /v1/state from a replica at base (e.g.
// http://127.0.0.1:9778 or 127.0.0.1:9778), every server and invalid key of
// it: it asks for the most rows a replica answers, and fails with
// ErrTruncated if the answer is still cut.
func FetchState(ctx context.Context, base string) (StateView, error) {
	var v StateView
	p := fmt.Sprintf("/v1/state?limit=%d", server.MaxLimit)
	if err := getJSON(ctx, base, p, &v); err != nil {
		return v, err
	}
	return v, whole(base, p, v.Truncated, len(v.Servers), v.Total, "servers")
}

// whole fails closed when a replica cut a list.
func whole(base, path string, truncated bool, got, total int, what string) error {
	if !truncated {
		return nil
	}
	return fmt.Errorf("GET %s%s: %w: the replica knows %d %s and answered %d, the most one answer carries; "+
		"refusing to act on a partial list (it could hide a drained server or a lagging HAProxy); "+
		"a fleet this large needs a narrower read than hastate offers today: report it to the hastate maintainers",
		strings.TrimSuffix(base, "/"), path, ErrTruncated, total, what, got)
}

// Match reports whether a row matches a selector "backend/server" with
// path.Match globs; an empty selector matches everything.
func Match(selector string, r Row) (bool, error) {
	if selector == "" {
		return true, nil
	}
	b, s, ok := strings.Cut(selector, "/")
	if !ok {
		b, s = selector, "*"
	}
	mb, err := path.Match(b, r.Backend)
	if err != nil {
		return false, fmt.Errorf("%w: selector %q: %v", ErrUsage, selector, err)
	}
	ms, err := path.Match(s, r.Server)
	if err != nil {
		return false, fmt.Errorf("%w: selector %q: %v", ErrUsage, selector, err)
	}
	return mb && ms, nil
}
