package kvsync

// This file is the Consul token a replica sends. consul/api reads a token
// file once, in NewClient; a Kubernetes Secret mounted as a volume changes
// in place when the token is rotated, so Token re-reads its file and the
// client's transport (NewTokenClient) sends the current secret with every
// request. The accessor ID, which names the token in logs, metrics and
// status (never the secret), is looked up from Consul
// (/v1/acl/token/self, which any valid token may read about itself).

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"
	hapi "github.com/hastate/hastate/api"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"go.uber.org/zap"
)

// AnonymousAccessor is the accessor ID of Consul's anonymous token, which
// Consul uses for a request that carries no token.
const AnonymousAccessor = "00000000-0000-0000-0000-000000000002"

// Token sources, as the metrics and status name them.
const (
	TokenFromFile = "file" // --consul-token-file or CONSUL_HTTP_TOKEN_FILE
	TokenFromEnv  = "env"  // CONSUL_HTTP_TOKEN
	TokenNone     = "none" // no token: Consul's anonymous token
)

// TokenOptions configure a Token.
type TokenOptions struct {
	// File is the token file (--consul-token-file); "" means
	// CONSUL_HTTP_TOKEN_FILE, and with neither, Secret (CONSUL_HTTP_TOKEN)
	// is the token and never changes. A file that holds a token wins over
	// Secret, as in every Consul tool.
	File string
	// Secret is the static token; "" means CONSUL_HTTP_TOKEN.
	Secret string
	// Interval is how often the file is read again; 0 means 1s.
	Interval time.Duration
	// Logger; nil logs nothing.
	Logger *zap.Logger
	// Registerer for the hastate_consul_token_* metrics; nil: unregistered.
	Registerer prometheus.Registerer
}

// Token is the Consul token of this process: a static one, or the content
// of a file re-read every Interval. Its methods are safe for concurrent use.
type Token struct {
	o      TokenOptions
	source string

	changes    prometheus.Counter
	fileErrors prometheus.Counter
	changedAt  prometheus.Gauge
	info       *prometheus.GaugeVec

	mu       sync.Mutex
	secret   string
	accessor string // "" until looked up
	since    time.Time
	fileErr  string // the last problem reading the file ("" none)
}

// TokenState is what status and /v1/cluster say about the token (its
// Problem is the probe's business).
type TokenState = hapi.ConsulToken

// NewToken reads the token (from its file, if there is one). A file that
// cannot be read at start is an error: a replica must not quietly run with
// the anonymous token because a mount is missing.
func NewToken(o TokenOptions) (*Token, error) {
	if o.File == "" {
		o.File = os.Getenv(api.HTTPTokenFileEnvName)
	}
	if o.Secret == "" {
		o.Secret = os.Getenv(api.HTTPTokenEnvName)
	}
	if o.Interval <= 0 {
		o.Interval = time.Second
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	f := promauto.With(o.Registerer)
	t := &Token{
		o: o,
		changes: f.NewCounter(prometheus.CounterOpts{
			Name: "hastate_consul_token_changes_total",
			Help: "Per replica: times the Consul token changed while running (its file was rewritten, e.g. a rotated Kubernetes Secret).",
		}),
		fileErrors: f.NewCounter(prometheus.CounterOpts{
			Name: "hastate_consul_token_file_errors_total",
			Help: "Per replica: reads of the Consul token file that failed or found it empty; the last token read stays in use.",
		}),
		changedAt: f.NewGauge(prometheus.GaugeOpts{
			Name: "hastate_consul_token_last_change_timestamp_seconds",
			Help: "Per replica: Unix time the Consul token in use was first read (at start, or when its file changed).",
		}),
		info: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hastate_consul_token_info",
			Help: `Per replica: 1 for the Consul token in use: its accessor ID (never the secret; "" until Consul named it) and where it comes from (file, env, none: the anonymous token).`,
		}, []string{"accessor_id", "source"}),
	}
	switch {
	case o.File != "":
		t.source = TokenFromFile
		secret, err := readTokenFile(o.File)
		if err != nil {
			return nil, fmt.Errorf("consul token file %s: %w (set --consul-token-file / CONSUL_HTTP_TOKEN_FILE to the mounted Secret's file)", o.File, err)
		}
		if secret == "" {
			secret = strings.TrimSpace(o.Secret)
		}
		t.secret = secret
	case strings.TrimSpace(o.Secret) != "":
		t.source, t.secret = TokenFromEnv, strings.TrimSpace(o.Secret)
	default:
		t.source = TokenNone
	}
	if t.secret == "" {
		t.accessor = AnonymousAccessor
		o.Logger.Warn("no Consul token set: Consul answers as its anonymous token, which with default deny reads nothing "+
			"(set --consul-token-file, CONSUL_HTTP_TOKEN_FILE or CONSUL_HTTP_TOKEN; docs/deploy.md, Consul ACL policies)",
			zap.String("source", t.source), zap.String("file", o.File))
	}
	t.since = time.Now()
	t.changedAt.Set(float64(t.since.UnixNano()) / 1e9)
	t.setInfoLocked()
	return t, nil
}

// readTokenFile reads a token file as Consul's tools do (trimmed).
func readTokenFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// Secret is the token to send ("" for none).
func (t *Token) Secret() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.secret
}

// AccessorID names the token in use ("" while Consul has not named it).
func (t *Token) AccessorID() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.accessor
}

// accessorFor names the token requests made with ctx send: an attempt's
// (withOneSecret) when its secret is still the current one (the anonymous
// accessor for none), "" when the token changed since; else the current.
func (t *Token) accessorFor(ctx context.Context) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	p, ok := ctx.Value(oneSecretKey{}).(*oneSecret)
	if !ok {
		return t.accessor
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case !p.set || p.tok != t || p.secret == t.secret:
		return t.accessor
	case p.secret == "":
		return AnonymousAccessor
	}
	return ""
}

// State is the token's description for status.
func (t *Token) State() TokenState {
	t.mu.Lock()
	defer t.mu.Unlock()
	st := TokenState{Source: t.source, AccessorID: t.accessor, Since: t.since, FileError: t.fileErr}
	if t.source == TokenFromFile {
		st.File = t.o.File
	}
	return st
}

// Run re-reads the file every Interval (with a file) and asks Consul,
// through c, for the accessor ID of the token in use until it knows it,
// until ctx is done. c must send this token (NewTokenClient).
func (t *Token) Run(ctx context.Context, c *api.Client) error {
	tick := time.NewTicker(t.o.Interval)
	defer tick.Stop()
	var looked time.Time
	for {
		if t.source == TokenFromFile {
			t.reread()
		}
		// At once for a new token, then every 10s while Consul does not
		// name it (down, or ACLs off).
		if acc, since := t.AccessorID(), t.State().Since; acc == "" && (looked.Before(since) || time.Since(looked) >= 10*time.Second) {
			looked = time.Now()
			t.lookup(ctx, c)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// reread reads the file again and switches to its token if it changed. A
// file that cannot be read or is empty (a writer caught half-way) keeps
// the last token: an empty file never turns a working replica anonymous.
func (t *Token) reread() {
	secret, err := readTokenFile(t.o.File)
	if err == nil && secret == "" {
		err = errors.New("the file is empty")
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if err != nil {
		if t.fileErr != err.Error() {
			t.o.Logger.Error("cannot read the Consul token file; keeping the last token read (check the mounted Secret)",
				zap.String("file", t.o.File), zap.Error(err), zap.String("accessor_id", t.accessor))
		}
		t.fileErr = err.Error()
		t.fileErrors.Inc()
		return
	}
	if t.fileErr != "" {
		t.o.Logger.Info("Consul token file readable again", zap.String("file", t.o.File))
		t.fileErr = ""
	}
	if secret == t.secret {
		return
	}
	old := t.accessor
	t.secret, t.accessor, t.since = secret, "", time.Now()
	t.changes.Inc()
	t.changedAt.Set(float64(t.since.UnixNano()) / 1e9)
	t.setInfoLocked()
	t.o.Logger.Info("Consul token changed: its file holds a new token, sent from now on",
		zap.String("file", t.o.File), zap.String("old_accessor_id", old))
}

// lookup asks Consul for the accessor ID of the token in use.
func (t *Token) lookup(ctx context.Context, c *api.Client) {
	secret := t.Secret()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	self, _, err := c.ACL().TokenReadSelf((&api.QueryOptions{Token: secret}).WithContext(ctx))
	if err != nil || self == nil {
		return // Consul down, ACLs off, or the token refused: the probe says which
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.secret != secret || t.accessor != "" {
		return
	}
	t.accessor = self.AccessorID
	t.setInfoLocked()
	t.o.Logger.Info("Consul token in use", zap.String("accessor_id", t.accessor), zap.String("source", t.source),
		zap.String("description", self.Description))
}

func (t *Token) setInfoLocked() {
	t.info.Reset()
	t.info.WithLabelValues(t.accessor, t.source).Set(1)
}

// NewTokenClient is NewClient sending tok's current secret with every
// request (a request whose options carry their own token keeps it), so
// that a rotated token file needs no new client. The environment's
// CONSUL_HTTP_TOKEN(_FILE) are tok's business, not consul/api's.
func NewTokenClient(addr string, tok *Token) (*api.Client, error) {
	cfg := ClientConfig(addr)
	// consul/api falls back to CONSUL_HTTP_TOKEN_FILE, read once, for an
	// empty Token: it gets a placeholder that the transport replaces.
	cfg.Token, cfg.TokenFile = tokenPlaceholder, ""
	c, err := newClient(cfg)
	if err != nil {
		return nil, err
	}
	cfg.HttpClient.Transport = tokenTransport{next: cfg.HttpClient.Transport, tok: tok}
	return c, nil
}

// tokenPlaceholder is the client's configured token, which tokenTransport
// replaces with the Token's current secret (never sent to Consul).
const tokenPlaceholder = "hastate-kvsync-token-placeholder"

// tokenTransport sets X-Consul-Token from a Token.
type tokenTransport struct {
	next http.RoundTripper
	tok  *Token
}

func (t tokenTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Header.Get("X-Consul-Token") == tokenPlaceholder {
		req = req.Clone(req.Context())
		s := t.tok.Secret()
		if p, ok := req.Context().Value(oneSecretKey{}).(*oneSecret); ok {
			s = p.use(t.tok, s) // one attempt, one secret (withOneSecret)
		}
		if s != "" {
			req.Header.Set("X-Consul-Token", s)
		} else {
			req.Header.Del("X-Consul-Token") // Consul's anonymous token
		}
	}
	return t.next.RoundTrip(req)
}

// oneSecretKey marks a context whose requests all send one secret (see
// withOneSecret).
type oneSecretKey struct{}

// oneSecret is the secret the requests of one context send: the Token's
// current one at the first request, kept for the rest.
type oneSecret struct {
	mu     sync.Mutex
	tok    *Token // whose secret; a request through another Token's client is not pinned
	set    bool
	secret string
}

// use returns the secret to send through tok's transport, cur being
// tok's current one: the first request's for every request after it.
func (p *oneSecret) use(tok *Token, cur string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case !p.set:
		p.tok, p.set, p.secret = tok, true, cur
	case p.tok != tok:
		return cur
	}
	return p.secret
}

// withOneSecret marks ctx so that every request made with it through a
// NewTokenClient transport sends the secret the first one sent, even when
// the token file changes meanwhile. A read is one attempt of the Watcher:
// its listing, the proof that the listing's token may read the prefix
// (CheckRead) and the identity it is applied under are one token's, so
// that an empty listing made as the anonymous token is never "proven" by
// the token read from the file a moment later. A ctx marked already is
// returned as it is (CheckRead inside an attempt keeps the attempt's).
func withOneSecret(ctx context.Context) context.Context {
	if _, ok := ctx.Value(oneSecretKey{}).(*oneSecret); ok {
		return ctx
	}
	return context.WithValue(ctx, oneSecretKey{}, &oneSecret{})
}
