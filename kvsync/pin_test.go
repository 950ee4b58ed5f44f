package kvsync

// Issue 43: a listing, the proof that its token may read the prefix and
// the identity it is applied under are one read, made with one secret and
// read from one Consul cluster.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/hastate/hastate/internal/testenv"
	"github.com/hastate/hastate/state"
)

// aclConsul is a fake Consul with ACLs on and default deny: the token
// secret it names may read the prefix, any other token (the anonymous one
// above all) may read nothing. As Consul does, it lists the prefix as
// empty (404, no filtered header) for the anonymous token, and answers a
// direct read 403 where the token may not read. onList, if set, runs in
// the handler of each listing before it is answered, with the token the
// listing was made with.
type aclConsul struct {
	t      *testing.T
	secret string
	pairs  api.KVPairs
	index  uint64
	srv    *httptest.Server
	onList func(token string)
	// onRead, if set, runs in the handler of each request that is not a
	// listing (the proof's key list and direct reads), before it is
	// answered.
	onRead func(token string)

	mu     sync.Mutex
	tokens []string // the token of each request, in order ("" anonymous)
}

func newACLConsul(t *testing.T, secret string, index uint64, pairs ...*api.KVPair) *aclConsul {
	c := &aclConsul{t: t, secret: secret, pairs: pairs, index: index}
	c.srv = httptest.NewServer(http.HandlerFunc(c.serve))
	t.Cleanup(c.srv.Close)
	return c
}

func (c *aclConsul) serve(rw http.ResponseWriter, r *http.Request) {
	tok := r.Header.Get("X-Consul-Token")
	c.mu.Lock()
	c.tokens = append(c.tokens, r.Method+" "+r.URL.Path+" as "+tok)
	onList, onRead := c.onList, c.onRead
	c.mu.Unlock()
	q := r.URL.Query()
	if onRead != nil && !q.Has("recurse") {
		onRead(tok)
	}
	may := tok == c.secret
	switch {
	case q.Has("recurse"):
		if onList != nil {
			onList(tok)
		}
		if q.Get("index") == strconv.FormatUint(c.index, 10) {
			<-r.Context().Done() // nothing changes: the query blocks
			return
		}
		rep := reply{index: c.index}
		if may {
			rep.pairs = c.pairs
		}
		serveReply(c.t, rw, rep) // the anonymous token lists nothing, unflagged
	case !may:
		rw.WriteHeader(http.StatusForbidden)
		_, _ = rw.Write([]byte("Permission denied: anonymous token lacks permission 'key:read'"))
	default:
		consulHeaders(rw.Header(), strconv.FormatUint(c.index, 10))
		rw.WriteHeader(http.StatusNotFound)
	}
}

// requests lists what was asked, as "GET /v1/kv/hastate/ as <token>".
func (c *aclConsul) requests() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.tokens...)
}

// tokenFile is a Token read from a file holding secret ("" : the file
// exists, empty), with the environment's tokens cleared; the test
// rewrites the file and calls tok.reread() to rotate it.
func tokenFile(t *testing.T, secret string) (file string, tok *Token) {
	t.Helper()
	t.Setenv(api.HTTPTokenEnvName, "")
	t.Setenv(api.HTTPTokenFileEnvName, "")
	file = filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	tok, err := NewToken(TokenOptions{File: file})
	if err != nil {
		t.Fatal(err)
	}
	return file, tok
}

// TestTokenFilledBetweenListingAndProofIsNotApplied is the reproduced
// window: a replica started with an empty token file lists the prefix as
// the anonymous token (Consul: 404, empty, nothing says it filtered); the
// file is filled before the proof runs. The proof must be made with the
// listing's token (and fail), never with the new one: otherwise the empty
// listing is applied and every drained server is answered ready 100%.
func TestTokenFilledBetweenListingAndProofIsNotApplied(t *testing.T) {
	const secret = "9a1c2f0e-reader"
	file, tok := tokenFile(t, "") // the Secret not mounted yet
	c := newACLConsul(t, secret, 7, kvp("hastate/state/web/s1", "drain"))
	var once sync.Once
	c.onList = func(token string) {
		if token != "" {
			return
		}
		// Between the anonymous listing and its proof: the Secret is
		// mounted, and the Token reads it (as its Run does every second).
		once.Do(func() {
			if err := os.WriteFile(file, []byte(secret+"\n"), 0o600); err != nil {
				t.Error(err)
			}
			tok.reread()
		})
	}
	client, err := NewTokenClient(c.srv.URL, tok)
	if err != nil {
		t.Fatal(err)
	}
	sink := &recSink{}
	o := Options{Client: client, Prefix: "hastate/", Sink: sink, Token: tok,
		WaitTime: time.Second, BackoffBase: 20 * time.Millisecond, BackoffMax: 50 * time.Millisecond}
	w, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	runWatcher(t, w)
	testenv.Eventually(t, 10*time.Second, func() error {
		for _, call := range sink.all() {
			if call.kv["state/web/s1"] != "drain" {
				t.Fatalf("the Sink was handed a read without the drain (%d keys at index %d): the anonymous token's empty listing was proven by the token read after it; requests:\n%s",
					len(call.kv), call.index, strings.Join(c.requests(), "\n"))
			}
		}
		if d := sink.lastDelivered(); d == nil {
			return errors.New("nothing applied yet (the read with the file's token should be)")
		}
		return nil
	})
	if st := w.Status(); st.TokenProblem != nil {
		t.Errorf("token problem still reported after a proven read: %+v", st.TokenProblem)
	}
}

// TestProofIsMadeWithTheListingsToken pins the rule at its smallest: every
// request of one attempt (the listing and each read of its proof) sends
// the secret the first one sent, whatever the file says meanwhile.
func TestProofIsMadeWithTheListingsToken(t *testing.T) {
	file, tok := tokenFile(t, "old-secret")
	c := newACLConsul(t, "old-secret", 3)
	client, err := NewTokenClient(c.srv.URL, tok)
	if err != nil {
		t.Fatal(err)
	}
	ctx := withOneSecret(context.Background())
	if _, _, err := client.KV().Keys("hastate/", "/", (&api.QueryOptions{}).WithContext(ctx)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, []byte("new-secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	tok.reread()
	if err := CheckRead(ctx, client, "hastate/", ""); err != nil {
		t.Errorf("the proof of an attempt begun with old-secret: %v; requests:\n%s", err, strings.Join(c.requests(), "\n"))
	}
	// A new attempt sends the new one (which this Consul refuses).
	var te *TokenError
	if err := CheckRead(context.Background(), client, "hastate/", ""); !errors.As(err, &te) {
		t.Errorf("a new attempt after the file changed: %v, want a TokenError (new-secret is refused)", err)
	}
}

// TestProofOnItsOwnIsOneSecret: CheckRead outside a Watcher's attempt
// (the probe every replica runs) is one secret too: the token file
// rotated after its key list does not change the token of its direct
// reads, so what it proves is one token's.
func TestProofOnItsOwnIsOneSecret(t *testing.T) {
	file, tok := tokenFile(t, "reader")
	c := newACLConsul(t, "reader", 3)
	var once sync.Once
	c.onRead = func(string) {
		once.Do(func() { // after the proof's first request: the Secret rotated
			if err := os.WriteFile(file, []byte("rotated"), 0o600); err != nil {
				t.Error(err)
			}
			tok.reread()
		})
	}
	client, err := NewTokenClient(c.srv.URL, tok)
	if err != nil {
		t.Fatal(err)
	}
	err = CheckRead(context.Background(), client, "hastate/", "")
	reqs := c.requests()
	for _, r := range reqs {
		if !strings.HasSuffix(r, " as reader") {
			t.Fatalf("one proof sent two tokens (%v); requests:\n%s", err, strings.Join(reqs, "\n"))
		}
	}
	if err != nil || len(reqs) != 1+len(ProbePaths("hastate/")) {
		t.Fatalf("the proof with the reader's token: %v after %d requests, want nil after %d", err, len(reqs), 1+len(ProbePaths("hastate/")))
	}
}

// identityConsul is a Consul address whose answers switch from one
// cluster to another (a DNS name or a load balancer moved): each listing
// and each identity read is answered by the cluster current at the time.
type identityConsul struct {
	mu      sync.Mutex
	cluster string // "a" or "b"
	reads   int    // identity reads
}

func (i *identityConsul) current() string {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.cluster
}

func (i *identityConsul) identify(context.Context) (state.MirrorSource, error) {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.reads++
	return state.MirrorSource{ClusterID: "cluster-" + i.cluster, Servers: "10.0.0." + i.cluster + ":8300", Prefix: "hastate/"}, nil
}

// TestListingIsAppliedUnderTheIdentityReadWithIt: the address starts
// answering for another cluster right after an applied read (well inside
// the identity's re-read interval). Its listing, at a higher index, must
// not be handed over under the old cluster's identity: the Sink (the raft
// leader) would apply another cluster's state as the recorded one's.
func TestListingIsAppliedUnderTheIdentityReadWithIt(t *testing.T) {
	id := &identityConsul{cluster: "a"}
	var (
		mu      sync.Mutex
		index   uint64 = 5
		changed        = make(chan struct{}) // closed when the address moves
	)
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if !q.Has("recurse") {
			consulHeaders(rw.Header(), "1")
			rw.WriteHeader(http.StatusNotFound) // the proof: the token may read
			return
		}
		mu.Lock()
		idx := index
		mu.Unlock()
		if q.Get("index") == strconv.FormatUint(idx, 10) {
			select { // a blocking query: answered once the address moves
			case <-r.Context().Done():
				return
			case <-changed:
			}
			mu.Lock()
			idx = index
			mu.Unlock()
		}
		cl := id.current()
		pairs := api.KVPairs{kvp("hastate/state/web/s1", "drain")}
		if cl == "b" {
			pairs = api.KVPairs{kvp("hastate/state/web/s1", "ready"), kvp("hastate/state/web/s2", "ready")}
		}
		serveReply(t, rw, reply{index: idx, pairs: pairs})
	}))
	t.Cleanup(srv.Close)
	sink := watchNamed(t, srv, id.identify)
	testenv.Eventually(t, 10*time.Second, func() error {
		if len(sink.allReads()) == 0 {
			return errors.New("cluster a's read not applied yet")
		}
		return nil
	})
	// The address now answers for cluster b, at a higher index.
	id.mu.Lock()
	id.cluster = "b"
	id.mu.Unlock()
	mu.Lock()
	index = 9
	mu.Unlock()
	close(changed)
	testenv.Eventually(t, 10*time.Second, func() error {
		for _, r := range sink.allReads() {
			if _, fromB := r.KV["state/web/s2"]; fromB && clusterOf(r) != "cluster-b" {
				t.Fatalf("cluster b's listing (index %d) was handed over as %s's", r.Index, clusterOf(r))
			}
		}
		rs := sink.allReads()
		if last := rs[len(rs)-1]; clusterOf(last) != "cluster-b" {
			return fmt.Errorf("cluster b's listing not handed over yet (last: index %d from %s)", last.Index, clusterOf(last))
		}
		return nil
	})
}

// clusterOf is the cluster ID a read was handed over under ("": none).
func clusterOf(r state.KVRead) string {
	if r.Source == nil {
		return ""
	}
	return r.Source.ClusterID
}

// TestListingIsAppliedOnlyIfOneClusterAnsweredAroundIt: the identity read
// before a listing and the one read after it must be the same cluster.
// Here the address answers for cluster a when the listing is made and for
// cluster b (the one the mirror follows, say) right after it: a's listing
// must not be handed over as b's. The next attempt reads b before and
// after its listing, and b's listing is handed over.
func TestListingIsAppliedOnlyIfOneClusterAnsweredAroundIt(t *testing.T) {
	id := &identityConsul{cluster: "a"}
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if !q.Has("recurse") {
			consulHeaders(rw.Header(), "1")
			rw.WriteHeader(http.StatusNotFound) // the proof: the token may read
			return
		}
		if q.Get("index") == "9" {
			<-r.Context().Done() // nothing changes: the query blocks
			return
		}
		id.mu.Lock()
		cl := id.cluster
		id.cluster = "b" // the address moves right after a's listing
		id.mu.Unlock()
		pairs := api.KVPairs{kvp("hastate/state/web/b1", "drain")}
		if cl == "a" {
			pairs = api.KVPairs{kvp("hastate/state/web/a1", "ready")}
		}
		serveReply(t, rw, reply{index: 9, pairs: pairs})
	}))
	t.Cleanup(srv.Close)
	sink := watchNamed(t, srv, id.identify)
	testenv.Eventually(t, 10*time.Second, func() error {
		rs := sink.allReads()
		for _, r := range rs {
			if _, fromA := r.KV["state/web/a1"]; fromA {
				t.Fatalf("cluster a's listing was handed over (as %s's): the cluster changed between the identity read before it and the one after", clusterOf(r))
			}
		}
		return testenv.Expect(len(rs) > 0 && clusterOf(rs[len(rs)-1]) == "cluster-b", "cluster b's listing not handed over yet")
	})
}

// TestListingWhoseIdentityCannotBeReadIsNotHandedOver: the identity read
// after a listing fails (Consul's Connect CA endpoint times out, say).
// Which cluster answered the listing is then unknown, and a read whose
// cluster is unknown is never handed over; the next attempt reads the
// identity again, before and after its listing.
func TestListingWhoseIdentityCannotBeReadIsNotHandedOver(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		switch {
		case !q.Has("recurse"):
			consulHeaders(rw.Header(), "1")
			rw.WriteHeader(http.StatusNotFound) // the proof: the token may read
		case q.Get("index") == "9":
			<-r.Context().Done() // nothing changes: the query blocks
		default:
			serveReply(t, rw, reply{index: 9, pairs: api.KVPairs{kvp("hastate/state/web/s1", "drain")}})
		}
	}))
	t.Cleanup(srv.Close)
	var calls atomic.Int32
	identify := func(context.Context) (state.MirrorSource, error) {
		if calls.Add(1) == 2 { // the one after the first listing
			return state.MirrorSource{}, errors.New("GET /v1/connect/ca/roots: context deadline exceeded")
		}
		return state.MirrorSource{ClusterID: "cluster-a", Servers: "10.0.0.1:8300", Prefix: "hastate/"}, nil
	}
	sink := watchNamed(t, srv, identify)
	testenv.Eventually(t, 10*time.Second, func() error {
		rs := sink.allReads()
		for _, r := range rs {
			if clusterOf(r) != "cluster-a" {
				t.Fatalf("a read was handed over named %+v, although the identity read after its listing failed", r.Source)
			}
		}
		return testenv.Expect(len(rs) > 0 && calls.Load() >= 4, "the retry's read not handed over yet (%d identity reads)", calls.Load())
	})
}

// watchNamed runs a Watcher of hastate/ against the fake Consul srv, each
// read named by identify (read again only around listings and after
// failures), until the test ends, and returns its Sink.
func watchNamed(t *testing.T, srv *httptest.Server, identify func(context.Context) (state.MirrorSource, error)) *recSink {
	t.Helper()
	client, err := NewClient(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	sink := &recSink{}
	w, err := New(Options{Client: client, Prefix: "hastate/", Sink: sink, Identify: identify, IdentifyEvery: time.Hour,
		WaitTime: 200 * time.Millisecond, BackoffBase: 10 * time.Millisecond, BackoffMax: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	runWatcher(t, w)
	return sink
}
