package write

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	consul "github.com/hashicorp/consul/api"
	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/fleet"
	"github.com/hastate/hastate/state"
)

// ExpiredKey is a state key whose state has expired (its meta key's
// until, or the until of the JSON it holds, has passed) and which the
// cluster treats as absent: what `hastate clear --expired` deletes.
type ExpiredKey struct {
	Key   string // relative to the prefix: state/<backend>/<server>
	Word  string // what it holds (its state)
	Until time.Time
	index uint64
	// meta is the meta key (relative) and its index; "" when the until
	// came from JSON in the state key itself.
	meta      string
	metaIndex uint64
}

// ClearExpiredOptions are the options of ClearExpired.
type ClearExpiredOptions struct {
	Writer  Writer
	Replica *fleet.Replica
	// Selectors choose the keys (none: every key of the prefix). A
	// backend-wide key is chosen by <backend>/* (or <backend>).
	Selectors []ctl.Selector
	Now       time.Time
	DryRun    bool
	// Ramped: clear --ramped instead of --expired: the keys that hold
	// plain ready (left by ready --ramp) whose ramp is over, where
	// deleting them changes no answer (see rampedKey).
	Ramped bool
	// beforeTxn, for tests, runs between the read and each transaction.
	beforeTxn func(attempt int)
}

// ClearExpiredResult says what ClearExpired deleted (or, with DryRun,
// would delete), and the expired keys it left.
type ClearExpiredResult struct {
	Keys []ExpiredKey
	// Unconfirmed are keys expired by Consul's value that the cluster does
	// not show as expired (yet, or a clock ahead of the leader's): left.
	Unconfirmed []string
	DryRun      bool
	Written     bool
	Prefix      string
	// Ramped: the result of clear --ramped; Kept then names the ready
	// keys left and why.
	Ramped bool
	Kept   []string
}

// ClearExpired deletes, in one Consul transaction, the state keys (and
// their meta keys) of the selection whose state has expired: hastate
// treats them as absent already, so deleting them changes no answer; it
// only ends "expired" in status and lets a migration start. A key counts
// only when Consul's value says it expired and the cluster agrees (a row
// names it expired, with the same until): the leader's clock decides, not
// this machine's. The transaction is conditional on the index of every
// key it deletes, so a key written again meanwhile is read again, never
// deleted. Selectors that match no key and no server the cluster knows
// are ctl.ErrNoMatch.
func ClearExpired(ctx context.Context, o ClearExpiredOptions) (ClearExpiredResult, error) {
	res := ClearExpiredResult{DryRun: o.DryRun, Prefix: o.Writer.Prefix, Ramped: o.Ramped}
	if err := fleet.CheckReplica(ctx, o.Writer.Client, o.Writer.Addr, o.Writer.Prefix, o.Replica); err != nil {
		return res, fmt.Errorf("%w; nothing was deleted (clear %s asks the cluster which keys it treats as %s)", err, res.flag(), strings.TrimPrefix(res.flag(), "--"))
	}
	for attempt := 1; ; attempt++ {
		keys, unconfirmed, err := expiredKeys(ctx, o)
		res.Keys = keys
		if o.Ramped {
			res.Kept = unconfirmed
		} else {
			res.Unconfirmed = unconfirmed
		}
		if err != nil || len(keys) == 0 || o.DryRun {
			return res, err
		}
		ops := make(consul.TxnOps, 0, 2*len(keys))
		for _, k := range keys {
			ops = append(ops, &consul.TxnOp{KV: &consul.KVTxnOp{Verb: consul.KVDeleteCAS, Key: o.Writer.Prefix + k.Key, Index: k.index}})
			if k.meta != "" {
				ops = append(ops, &consul.TxnOp{KV: &consul.KVTxnOp{Verb: consul.KVDeleteCAS, Key: o.Writer.Prefix + k.meta, Index: k.metaIndex}})
			}
		}
		if len(ops) > MaxTxnKeys {
			return res, fmt.Errorf("refused, nothing was deleted: %s with their meta keys are %d operations, more than one Consul transaction holds (%d); "+
				"clear them by backend (hastate clear %s '<backend>/*')", ctl.PluralN(len(keys), res.what(), res.what()+"s"), len(ops), MaxTxnKeys, res.flag())
		}
		if o.beforeTxn != nil {
			o.beforeTxn(attempt)
		}
		err = o.Writer.Txn(ctx, ops, "nothing was deleted", "`hastate status` shows whether they are gone")
		if err == nil {
			res.Written = true
			return res, nil
		}
		if !errors.Is(err, ErrConflict) || attempt >= maxConflicts {
			return res, err
		}
		// A key was written again since it was read: read again.
	}
}

// expiredKeys reads the prefix from Consul (consistently) and the
// cluster's view, and returns the selected keys both say have expired.
func expiredKeys(ctx context.Context, o ClearExpiredOptions) (keys []ExpiredKey, unconfirmed []string, err error) {
	pairs, _, err := o.Writer.Client.KV().List(o.Writer.Prefix, (&consul.QueryOptions{RequireConsistent: true}).WithContext(ctx))
	if err != nil {
		return nil, nil, ctl.ConsulError(ctx, o.Writer.Addr, err, "nothing was deleted")
	}
	view, err := o.Replica.Fleet(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w; nothing was deleted", ctl.ErrCannotConfirm, err)
	}
	// expiredAt: what the cluster treats as expired, by key, and when.
	expiredAt := map[string]time.Time{}
	for _, r := range view.Servers {
		if r.Expired != "" && r.ExpiredAt != nil {
			expiredAt[r.Expired] = *r.ExpiredAt
		}
	}
	kv := map[string]*consul.KVPair{}
	for _, p := range pairs {
		kv[strings.TrimPrefix(p.Key, o.Writer.Prefix)] = p
	}
	matched := len(o.Selectors) == 0
	for k, p := range kv {
		rest, ok := strings.CutPrefix(k, state.StatePrefix)
		if !ok {
			continue
		}
		b, s, _ := strings.Cut(rest, "/")
		if len(o.Selectors) > 0 && !slices.ContainsFunc(o.Selectors, func(sel ctl.Selector) bool { return sel.Match(b, s) }) {
			continue
		}
		matched = true
		if o.Ramped {
			ek, why, ok := rampedKey(k, string(p.Value), p.ModifyIndex, kv, view.Servers)
			switch {
			case ok:
				keys = append(keys, ek)
			case why != "":
				unconfirmed = append(unconfirmed, fmt.Sprintf("%s (%s)", k, why))
			}
			continue
		}
		ek, ok := expiredKey(k, string(p.Value), p.ModifyIndex, kv, o.Now)
		if !ok {
			continue
		}
		if at, ok := expiredAt[k]; !ok || !at.Truncate(time.Second).Equal(ek.Until.Truncate(time.Second)) {
			unconfirmed = append(unconfirmed, k)
			continue
		}
		keys = append(keys, ek)
	}
	if !matched {
		for _, sel := range o.Selectors {
			if len(ctl.Select(view.Servers, sel)) == 0 {
				return nil, nil, ctl.NoMatch(sel, view.Servers)
			}
		}
	}
	slices.SortFunc(keys, func(a, b ExpiredKey) int { return strings.Compare(a.Key, b.Key) })
	slices.Sort(unconfirmed)
	return keys, unconfirmed, nil
}

// rampedKey says whether the state key k (raw, at index) is one `hastate
// ready --ramp` left behind that can go: it holds plain ready (its meta
// key, with the ramp, goes with it), no ramp the cluster runs comes from
// it, and, for a server's own key, no backend-wide key covers the server
// (deleting it would put the server under that key: a changed answer).
// why says why a ready key stays ("" for a key that is no ready key).
func rampedKey(k, raw string, index uint64, kv map[string]*consul.KVPair, rows []api.ServerState) (ek ExpiredKey, why string, ok bool) {
	v, err := state.ParseValue(raw)
	if err != nil || v.String() != "ready" {
		return ExpiredKey{}, "", false
	}
	ek = ExpiredKey{Key: k, Word: v.String(), index: index}
	if mk, _ := state.MetaKeyOf(k); kv[mk] != nil {
		ek.meta, ek.metaIndex = mk, kv[mk].ModifyIndex
	}
	rest := strings.TrimPrefix(k, state.StatePrefix)
	b, s, _ := strings.Cut(rest, "/")
	for _, r := range rows {
		if r.Ramping != nil && r.Ramping.Target == rest {
			return ExpiredKey{}, fmt.Sprintf("its ramp is at %d%%, done %s", r.Ramping.WeightPercent, r.Ramping.ETA.UTC().Format(time.RFC3339)), false
		}
	}
	if wk := state.StatePrefix + b + "/" + state.Wildcard; s != state.Wildcard && kv[wk] != nil {
		return ExpiredKey{}, fmt.Sprintf("it keeps %s/%s out of %s, which holds %s: clear it by name to follow that key", b, s, wk, strings.TrimSpace(string(kv[wk].Value))), false
	}
	return ek, "", true
}

// flag is the clear flag of the result, what names one key it deletes.
func (r ClearExpiredResult) flag() string {
	if r.Ramped {
		return "--ramped"
	}
	return "--expired"
}

func (r ClearExpiredResult) what() string {
	if r.Ramped {
		return "ramped ready key"
	}
	return "expired key"
}

// expiredKey says whether the state key k (raw, at index) has expired at
// now, by its meta key (when that counts: its state is k's word) or the
// JSON k holds.
func expiredKey(k, raw string, index uint64, kv map[string]*consul.KVPair, now time.Time) (ExpiredKey, bool) {
	v, err := state.ParseValue(raw)
	if err != nil {
		return ExpiredKey{}, false
	}
	ek := ExpiredKey{Key: k, Word: v.String(), Until: v.Until, index: index}
	if !state.IsJSONValue(raw) {
		mk, _ := state.MetaKeyOf(k)
		mp, ok := kv[mk]
		if !ok {
			return ExpiredKey{}, false
		}
		m, err := state.ParseMeta(string(mp.Value))
		if err != nil || m.String() != v.String() {
			return ExpiredKey{}, false // ignored by hastate: never expires
		}
		ek.Until, ek.meta, ek.metaIndex = m.Until, mk, mp.ModifyIndex
	} else if mk, _ := state.MetaKeyOf(k); kv[mk] != nil {
		ek.meta, ek.metaIndex = mk, kv[mk].ModifyIndex
	}
	if ek.Until.IsZero() || ek.Until.After(now) {
		return ExpiredKey{}, false
	}
	return ek, true
}

// Report prints what was (or would be) deleted, and what was left.
func (r ClearExpiredResult) Report(w io.Writer) {
	nothing, effect := "no selected key has expired", "hastate treated them as absent already, so no answer changes"
	if r.Ramped {
		nothing, effect = "no selected key holds ready with its ramp done", "each answers as no key does, so no answer changes"
	}
	switch {
	case len(r.Keys) == 0:
		fmt.Fprintf(w, "clear %s: nothing to clear: %s\n", r.flag(), nothing)
	default:
		verb := "deleted in one Consul transaction"
		if !r.Written {
			verb = "would be deleted in one Consul transaction (--dry-run: nothing was written)"
		}
		fmt.Fprintf(w, "clear %s: %s (with their meta keys) %s; %s:\n", r.flag(), ctl.PluralN(len(r.Keys), r.what(), r.what()+"s"), verb, effect)
		for _, k := range r.Keys {
			why := fmt.Sprintf("%s, expired %s", k.Word, k.Until.UTC().Format(time.RFC3339))
			if r.Ramped {
				why = "ready, its ramp done"
			}
			fmt.Fprintf(w, "  delete %s%s (%s)\n", r.Prefix, k.Key, why)
		}
	}
	for _, k := range r.Unconfirmed {
		fmt.Fprintf(w, "left %s%s: its until has passed by this machine's clock, but the cluster does not treat it as expired yet (the leader's clock decides); run it again in a moment\n", r.Prefix, k)
	}
	for _, k := range r.Kept {
		fmt.Fprintf(w, "left %s%s\n", r.Prefix, k)
	}
}
