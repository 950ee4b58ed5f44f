package kvsync

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/hastate/hastate/state"
	"go.uber.org/zap"
)

// Sink receives changed reads of the prefix (see state.KVRead: the whole
// prefix, and what changed since the read the Sink last accepted from
// this Watcher). The map is valid during the call only: the Watcher
// changes it in place into the next read, so the Sink must neither keep
// nor modify it. A returned error means "not applied": the Watcher backs
// off and hands over the then-current full read again.
type Sink interface {
	ApplyRead(ctx context.Context, r state.KVRead) error
}

// Defaults applied to zero Options fields.
const (
	DefaultWaitTime    = 60 * time.Second
	DefaultMinGap      = 50 * time.Millisecond
	DefaultBackoffBase = 250 * time.Millisecond
	DefaultBackoffMax  = 30 * time.Second
	// DefaultIdentifyEvery: a read's source is at most this old.
	DefaultIdentifyEvery = 30 * time.Second
)

// Errors returned by this package.
var (
	// ErrInvalidOptions wraps every error New returns.
	ErrInvalidOptions = errors.New("kvsync: invalid options")
	// ErrRunning is returned by Run when the Watcher is already running.
	ErrRunning = errors.New("kvsync: watcher is already running")
)

// Options configure a Watcher. Zero values are documented per field.
type Options struct {
	// Client is the Consul client; required. Build it with NewClient: the
	// Watcher reads the listings through its transport.
	Client *api.Client
	// Prefix is the KV prefix to mirror, ending in "/" and not starting
	// with one, e.g. "hastate/" or "gitlab-haproxy-agent/". Required.
	Prefix string
	// Sink receives changed reads. Required.
	Sink Sink
	// Logger; nil logs nothing.
	Logger *zap.Logger
	// Metrics; nil uses a private, unregistered set.
	Metrics *Metrics
	// Token is the token Client sends (NewTokenClient), for its accessor
	// ID in errors and status; nil names no accessor.
	Token *Token

	// WaitTime is the blocking-query wait; 0 means DefaultWaitTime.
	// Consul caps it at 10 minutes. A proxy between hastate and Consul
	// whose idle timeout is shorter fails every quiet query; and the
	// Watcher is "in sync" only as of its last answer, so a quiet prefix
	// shows a sync age of up to about WaitTime.
	WaitTime time.Duration
	// MinGap is the least time between the starts of two calls to Consul,
	// plus up to 50% random jitter; 0 means DefaultMinGap.
	MinGap time.Duration
	// BackoffBase and BackoffMax shape the wait after consecutive failures
	// (see Backoff); 0 means DefaultBackoffBase and DefaultBackoffMax.
	BackoffBase time.Duration
	BackoffMax  time.Duration

	// Identify reads which Consul cluster the Client reads and returns
	// the mirror source (state.MirrorSource, with Prefix) every read
	// handed to the Sink names, so that the Sink applies a read only from
	// the source it recorded. It is called before the first read of each
	// Run, after every failed attempt or index reset, and at least every
	// IdentifyEvery; and again after every listing about to be handed to
	// the Sink (after its proof), which is handed over only if both reads
	// name the same source, naming the one read after it. It is called
	// with the attempt's context: its requests through a NewTokenClient
	// send the listing's token. An error fails the read. nil: reads name
	// no source.
	Identify func(ctx context.Context) (state.MirrorSource, error)
	// IdentifyEvery is the longest a read's source may be known before it
	// is read again (0: DefaultIdentifyEvery).
	IdentifyEvery time.Duration

	// Now is the clock for the times in Status and the metrics; nil means
	// time.Now. Waiting uses real timers.
	Now func() time.Time
}

// CheckPrefix is the one check of a KV prefix (Options.Prefix, serve's
// --kv-prefix): not empty, ending in "/", not starting with one, and no
// empty, "." or ".." segment. Consul's HTTP server cleans such a path and
// redirects the read to another prefix (hastate//state/ to hastate/state/),
// whose keys then all fall outside the one asked.
func CheckPrefix(prefix string) error {
	switch {
	case prefix == "":
		return errors.New(`the KV prefix is empty: set it, e.g. "hastate/"`)
	case !strings.HasSuffix(prefix, "/"):
		return fmt.Errorf(`the KV prefix %q must end with "/" (try %q)`, prefix, prefix+"/")
	case strings.HasPrefix(prefix, "/"):
		return fmt.Errorf(`the KV prefix %q must not start with "/" (try %q)`, prefix, strings.TrimLeft(prefix, "/"))
	}
	for _, seg := range strings.Split(strings.TrimSuffix(prefix, "/"), "/") {
		switch seg {
		case "", ".", "..":
			return fmt.Errorf(`the KV prefix %q has a segment %q: Consul would redirect its reads to another path; write it without empty, "." or ".." segments, e.g. %q`,
				prefix, seg, cleanPrefix(prefix))
		}
	}
	return nil
}

// cleanPrefix is prefix without its empty and "." segments, for advice.
func cleanPrefix(prefix string) string {
	var out []string
	for _, seg := range strings.Split(prefix, "/") {
		if seg != "" && seg != "." && seg != ".." {
			out = append(out, seg)
		}
	}
	if len(out) == 0 {
		return "hastate/"
	}
	return strings.Join(out, "/") + "/"
}

func (o *Options) validate() error {
	var probs []string
	if o.Client == nil {
		probs = append(probs, "Client is required (build it with kvsync.NewClient)")
	}
	if err := CheckPrefix(o.Prefix); err != nil {
		probs = append(probs, err.Error())
	}
	if o.Sink == nil {
		probs = append(probs, "Sink is required")
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"WaitTime", o.WaitTime}, {"MinGap", o.MinGap}, {"BackoffBase", o.BackoffBase}, {"BackoffMax", o.BackoffMax}} {
		if d.v < 0 {
			probs = append(probs, fmt.Sprintf("%s %s is negative", d.name, d.v))
		}
	}
	if o.WaitTime > 10*time.Minute {
		probs = append(probs, fmt.Sprintf("WaitTime %s exceeds Consul's 10m limit", o.WaitTime))
	}
	if len(probs) > 0 {
		return fmt.Errorf("%w: %s", ErrInvalidOptions, strings.Join(probs, "; "))
	}
	return nil
}

func (o *Options) setDefaults() {
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	if o.Metrics == nil {
		o.Metrics = NewMetrics(nil)
	}
	o.WaitTime = cmp.Or(o.WaitTime, DefaultWaitTime)
	o.MinGap = cmp.Or(o.MinGap, DefaultMinGap)
	o.BackoffBase = cmp.Or(o.BackoffBase, DefaultBackoffBase)
	o.BackoffMax = cmp.Or(o.BackoffMax, DefaultBackoffMax)
	o.IdentifyEvery = cmp.Or(o.IdentifyEvery, DefaultIdentifyEvery)
	if o.BackoffMax < o.BackoffBase {
		o.BackoffMax = o.BackoffBase
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}
