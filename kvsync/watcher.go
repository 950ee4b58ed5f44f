package kvsync

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	consul "github.com/hashicorp/consul/api"
	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/state"
	"go.uber.org/zap"
)

// requestSlack is how long past the blocking wait (and Consul's own jitter
// of up to wait/16) a call may take before it is abandoned as hung, so a
// half-open connection cannot stall the Watcher forever.
const requestSlack = 10 * time.Second

// Status is a Watcher's view of its sync, for readiness details and the
// status page; it is part of the HTTP API.
type Status = api.WatchStatus

// Watcher mirrors one KV prefix into a Sink. Create it with New, drive it
// with Run. Status is safe for concurrent use.
type Watcher struct {
	o     Options
	kv    *consul.KV
	log   *zap.Logger
	m     *Metrics
	slack time.Duration // requestSlack; tests shorten it

	running atomic.Bool
	// body and value are the buffers a read decodes Consul's listing
	// with, kept from one read to the next (one Run at a time).
	body, value []byte
	// unordered: Consul once listed keys out of order, so listings are
	// read in full rather than merged (see errUnordered).
	unordered bool
	// defaultMode reads in Consul's default mode instead of consistent
	// (see read); only the tests that measure the difference set it.
	defaultMode bool

	mu sync.Mutex
	st Status
}

// New validates o and returns a Watcher; it does not contact Consul.
func New(o Options) (*Watcher, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	o.setDefaults()
	return &Watcher{
		o:     o,
		kv:    o.Client.KV(),
		log:   o.Logger.With(zap.String("kv_prefix", o.Prefix)),
		m:     o.Metrics,
		slack: requestSlack,
	}, nil
}

// Status returns a snapshot of the Watcher's sync state.
func (w *Watcher) Status() Status {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.st
}

// Run mirrors the prefix into the Sink until ctx is done, then returns
// ctx.Err(). It returns ErrRunning at once if the Watcher is already
// running. Consul being unreachable is not an error: Run keeps retrying
// with backoff and catches up when Consul answers again.
//
// Every Run starts over at index 0 and hands its first successful read to
// the Sink even when the prefix is empty, so a new raft leader always
// applies a full read.
func (w *Watcher) Run(ctx context.Context) error {
	if !w.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer w.running.Store(false)

	var (
		// index is the Consul index the Sink is in sync with; 0 means
		// none, so the next read returns at once with the full prefix.
		index    uint64
		last     held          // what the Sink last accepted; its map is shared with it
		accepted uint64        // the index of that read
		failures int           // consecutive failed attempts
		since    time.Time     // first failure of the current streak
		wait     time.Duration // before the next call
		// src is the source reads name (Options.Identify), read at srcAt.
		src   *state.MirrorSource
		srcAt time.Time
		// reread: the Sink refused a read as behind the index it holds
		// (state.ErrIndexBehind); the next read confirms it.
		reread bool
	)
	for {
		if err := sleep(ctx, wait); err != nil {
			return err
		}
		start := time.Now()
		// After a failure the read does not block: Consul is back, and the
		// retry must say so now, not when the prefix next changes (up to
		// WaitTime later, a failing watch all along). It is compared with
		// what the Sink holds, so an unchanged prefix costs no apply.
		ask := index
		if failures > 0 {
			ask = 0
		}
		// One attempt, one secret: the listing, its proof and the
		// identity it is applied under are read with the token the first
		// request sent, even if the token file changes meanwhile.
		actx := withOneSecret(ctx)
		if w.o.Identify != nil && (src == nil || failures > 0 || index == 0 || time.Since(srcAt) >= w.o.IdentifyEvery) {
			s, err := w.o.Identify(actx)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if err != nil {
				failures, since = w.failed(failures, since, index, fmt.Errorf("consul: cannot tell which Consul cluster answers, so no read is applied: %w", err), true)
				wait = max(Backoff(failures-1, w.o.BackoffBase, w.o.BackoffMax), w.gap(start))
				continue
			}
			src, srcAt = &s, time.Now()
		}
		got, l, err := w.read(actx, ask, last)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			failures, since = w.failed(failures, since, index, err, true)
			wait = max(Backoff(failures-1, w.o.BackoffBase, w.o.BackoffMax), w.gap(start))
			continue
		}
		wait = w.gap(start)

		switch {
		case got < index:
			// Consul's rule: an index that goes backwards (a restored
			// snapshot, a new cluster) means start over with a full read.
			w.log.Info("consul index went backwards; starting over with a full read",
				zap.Uint64("index", index), zap.Uint64("consul_index", got))
			index = 0
			continue
		case got == index:
			// The wait timed out or an unrelated write woke us: nothing new.
		case l.unchanged:
			index = got // the index moved, the data did not
		default:
			if last.kv == nil || l.count == 0 || l.removes {
				// Consul leaves out what the token may not read, and says
				// so only for some tokens: an empty listing, one that
				// removes keys, or a first one (it may remove what raft
				// holds) is applied only once the token is proven able
				// to read the prefix. Until then the Sink keeps its state.
				if err := CheckRead(actx, w.o.Client, w.o.Prefix, w.accessor(actx)); err != nil {
					if ctx.Err() != nil {
						return ctx.Err()
					}
					failures, since = w.failed(failures, since, index,
						fmt.Errorf("consul: %d keys listed at index %d, not applied: %w", l.count, got, err), true)
					wait = max(Backoff(failures-1, w.o.BackoffBase, w.o.BackoffMax), wait)
					continue
				}
			}
			if w.o.Identify != nil {
				// The identity of the read handed over is read after it
				// (and its proof), with its token: an address that began
				// to answer for another cluster since the identity was
				// last read is caught here, not up to IdentifyEvery later
				// with that cluster's listing applied as the recorded
				// one's. Read before and after the listing, the same
				// cluster both times, or the read is discarded.
				s, err := w.o.Identify(actx)
				if ctx.Err() != nil {
					return ctx.Err()
				}
				if err == nil && (src == nil || s != *src) {
					err = fmt.Errorf("%w: %s before the listing, %s after it", errIdentityChanged, src, &s)
				}
				if err != nil {
					src = nil // read again before the next listing
					failures, since = w.failed(failures, since, index,
						fmt.Errorf("consul: %d keys listed at index %d, not applied: cannot tell which Consul cluster answered: %w", l.count, got, err), true)
					wait = max(Backoff(failures-1, w.o.BackoffBase, w.o.BackoffMax), wait)
					continue
				}
				src, srcAt = &s, time.Now()
			}
			r := state.KVRead{Index: got, KV: l.full.kv, Source: src, Reread: reread}
			if l.edits != nil {
				// The held map becomes the read; its keys follow once
				// the Sink accepts it.
				last.setMap(l.edits)
				r.KV = last.kv
			}
			if last.kv != nil {
				r.Base, r.Changed = accepted, l.changed
			}
			if err := w.o.Sink.ApplyRead(ctx, r); err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				if l.edits != nil {
					// The held map is now the read the Sink refused:
					// the next read is compared in full.
					last, accepted = held{}, 0
				}
				// Below what the Sink holds: the next read (consistent,
				// at index 0 after this failure) confirms it.
				reread = errors.Is(err, state.ErrIndexBehind)
				// Not delivered: index stays, so the next read returns at
				// once with the then-current data, after the backoff.
				failures, since = w.failed(failures, since, index,
					fmt.Errorf("sink: apply %d keys at index %d: %w", l.count, got, err), false)
				wait = max(Backoff(failures-1, w.o.BackoffBase, w.o.BackoffMax), wait)
				continue
			}
			reread = false
			w.m.updates.Inc()
			w.log.Debug("applied consul KV read", zap.Uint64("consul_index", got), zap.Int("keys", l.count), zap.Int("changed", len(l.changed)))
			if l.edits != nil {
				last.setKeys(l.edits)
			} else {
				last = l.full
			}
			index, accepted = got, got
		}
		if failures > 0 {
			w.log.Info("consul KV sync recovered",
				zap.Int("failed_attempts", failures),
				zap.Duration("outage", time.Since(since).Round(time.Millisecond)),
				zap.Uint64("consul_index", got), zap.Int("keys", l.count))
			failures = 0
		}
		w.succeeded(index)
	}
}

// read lists the prefix, blocking until Consul's index passes index (or the
// wait ends), and returns the index and the listing compared with last,
// what the Sink holds (its kv is nil when nothing yet).
func (w *Watcher) read(ctx context.Context, index uint64, last held) (uint64, listing, error) {
	limit := w.o.WaitTime + w.o.WaitTime/16 + w.slack
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	list := func() (*capture, *consul.QueryMeta, error) {
		c := &capture{prefix: w.o.Prefix, index: index, last: last, unordered: w.unordered, body: &w.body, value: &w.value}
		// Consistent: Consul's leader confirms it still leads and has
		// applied its log before answering. In the default mode a Consul
		// server just restarted, or just elected, answers from whatever
		// it has applied so far (an empty prefix at index 1 was seen),
		// and the leader would apply that older data over what it holds.
		q := (&consul.QueryOptions{WaitIndex: index, WaitTime: w.o.WaitTime, RequireConsistent: !w.defaultMode}).WithContext(withCapture(ctx, c))
		_, meta, err := w.kv.List(w.o.Prefix, q) // the pairs are read by listingTransport into c
		return c, meta, err
	}
	c, meta, err := list()
	if errors.Is(err, errUnordered) {
		w.log.Warn("Consul listed the keys under the prefix out of order; reading every listing in full from now on (this costs more at scale; report it with the Consul version)",
			zap.Error(err))
		w.unordered = true
		c, meta, err = list()
	}
	switch {
	case refused(err), errors.Is(err, errFilteredByACLs):
		// 403: with acl.enable_key_list_policy a listing the token may
		// not make; for any token that Consul does not know. Filtered:
		// applying a partial read would clear the states the token
		// cannot see.
		return 0, listing{}, fmt.Errorf("consul: list %q: %w", w.o.Prefix, tokenError(w.o.Prefix, w.accessor(ctx), "list "+w.o.Prefix, err))
	case err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded):
		return 0, listing{}, fmt.Errorf("consul: list %q: no answer within %s: %w", w.o.Prefix, limit, err)
	case err != nil:
		return 0, listing{}, fmt.Errorf("consul: list %q: %w", w.o.Prefix, err)
	case meta == nil:
		return 0, listing{}, fmt.Errorf("consul: list %q: no query metadata in the answer", w.o.Prefix)
	case meta.ResultsFilteredByACLs:
		return 0, listing{}, fmt.Errorf("consul: list %q: %w", w.o.Prefix, tokenError(w.o.Prefix, w.accessor(ctx), "list "+w.o.Prefix, errFilteredByACLs))
	}
	if !c.done {
		return 0, listing{}, fmt.Errorf("consul: list %q: %w", w.o.Prefix, errNotNewClient)
	}
	l := c.res
	// Consul's rule: an index must be above 0; waiting on 0 would not
	// block, so treat 0 as 1.
	got := max(meta.LastIndex, 1)

	w.m.index.Set(float64(got))
	w.m.keys.Set(float64(l.count))
	w.m.reachable.Set(1)
	w.mu.Lock()
	w.st.Index, w.st.Reachable = got, true
	w.mu.Unlock()
	return got, l, nil
}

// errNotNewClient: the listing did not pass through listingTransport.
var errNotNewClient = errors.New("the Consul client was not built by kvsync.NewClient, which reads the listing (build it with NewClient)")

// errNotConsul: the answer lacks what every Consul KV answer carries (see
// checkConsulAnswer); what answered is a proxy, a load balancer or
// another service, and its "nothing here" proves nothing.
var errNotConsul = errors.New("the answer is not Consul's")

// errIdentityChanged: the Consul cluster read after a listing is not the
// one read before it; which one answered the listing cannot be told.
var errIdentityChanged = errors.New("the Consul cluster at the address changed during the read")

var errFilteredByACLs = errors.New("the Consul token may not read every key under the prefix (X-Consul-Results-Filtered-By-ACLs), refusing a partial read")

// failed records a failed attempt, logs one line for it and returns the new
// streak. consul tells a Consul failure from a Sink one.
func (w *Watcher) failed(failures int, since time.Time, index uint64, err error, consul bool) (int, time.Time) {
	failures++
	if failures == 1 {
		since = time.Now()
	}
	now := w.o.Now()
	w.m.errors.Inc()
	var te *TokenError
	w.mu.Lock()
	w.st.LastError, w.st.LastErrorTime, w.st.ConsecutiveErrors = err.Error(), now, failures
	var me *api.MirrorError
	if w.st.LastErrorReason = ""; consul || errors.As(err, &me) {
		w.st.LastErrorReason = MirrorReasonOf(err)
	}
	if failures == 1 {
		w.st.FailingSince = now
	}
	if errors.As(err, &te) {
		since := now
		if p := w.st.TokenProblem; p != nil {
			since = p.Since
		}
		w.st.TokenProblem = te.Problem(since)
	}
	// Otherwise a token problem stands until a read succeeds: Consul
	// could not be asked, or the Sink refused.
	if consul {
		w.st.Reachable = false
	}
	w.mu.Unlock()

	retry := Backoff(failures-1, w.o.BackoffBase, w.o.BackoffMax)
	fields := []zap.Field{
		zap.Error(err),
		zap.Int("attempt", failures),
		zap.Duration("retry_in", retry),
		zap.Uint64("consul_index", index),
	}
	switch {
	case consul:
		w.m.reachable.Set(0)
		w.log.Error("cannot read Consul KV; serving the last mirrored state; "+consulHint(err), fields...)
	case errors.As(err, &me):
		w.log.Error("refusing to apply the Consul KV read: this replica's Consul or prefix is not the one recorded in raft; serving the last mirrored state "+
			"(the leader hands leadership to a replica that matches)", fields...)
	case errors.Is(err, state.ErrIndexBehind):
		w.log.Warn("the Consul index is below the one the mirror holds; reading again to confirm before applying", fields...)
	default:
		w.log.Error("could not apply the Consul KV read; serving the last applied state; "+
			"will retry with a fresh read (check this replica's raft leadership and logs)", fields...)
	}
	return failures, since
}

// MirrorReasonOf types a failed read or apply for the mirror verdict: a
// refusal that carries one (*api.MirrorError, the cluster's for another
// cluster or prefix), an answer that is not Consul's (errNotConsul), one
// the token could not vouch for (errFilteredByACLs, 401, 403); anything
// else is Consul unreachable.
func MirrorReasonOf(err error) api.MirrorReason {
	var (
		se consul.StatusError
		me *api.MirrorError
	)
	switch {
	case errors.As(err, &me):
		return me.Verdict.Reason
	case errors.Is(err, errNotConsul):
		return api.MirrorNotConsul
	case errors.Is(err, errFilteredByACLs), errors.As(err, &se) && (se.Code == 401 || se.Code == 403):
		return api.MirrorTokenCannotRead
	}
	return api.MirrorConsulUnreachable
}

// consulHint says what an operator should check for err.
func consulHint(err error) string {
	var se consul.StatusError
	var te *TokenError
	switch {
	case errors.As(err, &te):
		return "as leader it holds the last state until the token may read the prefix (check --consul-token-file / CONSUL_HTTP_TOKEN and the token's policy)"
	case errors.Is(err, errNotConsul):
		return "what answers at CONSUL_HTTP_ADDR / --consul-addr is not Consul's KV endpoint (a proxy, a load balancer without a route, another service): point it at a Consul agent"
	case errors.Is(err, errFilteredByACLs):
		return "give the token (--consul-token-file, CONSUL_HTTP_TOKEN) key_prefix list on the whole prefix (docs/deploy.md, Consul ACL policies)"
	case errors.As(err, &se) && (se.Code == 401 || se.Code == 403):
		return "check the Consul token (--consul-token-file, CONSUL_HTTP_TOKEN): it needs key_prefix list on the prefix"
	case errors.As(err, &se):
		return "Consul answered with an error; check the Consul servers (leader, quorum)"
	default:
		return "check that Consul is up and reachable at CONSUL_HTTP_ADDR / --consul-addr, and its TLS settings and token"
	}
}

// accessor names the token the Watcher's client sends with ctx, an
// attempt's ("" unknown).
func (w *Watcher) accessor(ctx context.Context) string {
	if w.o.Token == nil {
		return ""
	}
	return w.o.Token.accessorFor(ctx)
}

// succeeded records that the Sink holds Consul's content at index.
func (w *Watcher) succeeded(index uint64) {
	now := w.o.Now()
	w.m.lastSuccess.Set(float64(now.UnixNano()) / 1e9)
	w.mu.Lock()
	w.st.LastSuccess, w.st.ConsecutiveErrors, w.st.FailingSince = now, 0, time.Time{}
	w.st.TokenProblem = nil
	w.st.SyncedIndex = index
	w.mu.Unlock()
}

// gap returns how long to wait so the next call starts at least MinGap,
// plus up to 50% jitter, after the call that started at start.
func (w *Watcher) gap(start time.Time) time.Duration {
	g := w.o.MinGap
	if half := int64(g / 2); half > 0 {
		g += time.Duration(rand.Int64N(half + 1))
	}
	return g - time.Since(start)
}

// sleep waits for d or until ctx is done.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
