package kvsync

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/hastate/hastate/state"
)

// reply is one scripted answer of a fake Consul.
type reply struct {
	pairs    api.KVPairs // none: a 404, as Consul answers for an empty prefix
	index    uint64
	filtered bool   // X-Consul-Results-Filtered-By-ACLs
	status   int    // an error status with body, e.g. 403 "Permission denied"
	body     string // with status
	drop     bool   // the connection breaks: no HTTP answer
}

// script is a fake Consul: an HTTP server that answers the Watcher's
// listings with replies in order, records each call's index, then blocks
// until the call is cancelled. The Watcher reads it as it reads Consul,
// through NewClient's transport.
type script struct {
	t       *testing.T
	replies []reply
	wait    time.Duration // expected WaitTime of every call
	srv     *httptest.Server

	mu    sync.Mutex
	waits []uint64
	done  chan struct{} // closed at the first call past the script
	// denied lists what the token may not do, as CheckRead asks it
	// ("read hastate/meta/", "list hastate/"): answered 403; every other
	// direct read or key list is a 404 (the token may, nothing there).
	denied map[string]bool
	proofs int // direct reads and key lists answered
}

// deny makes the fake refuse the token what CheckRead asks ("read <key>",
// "list <prefix>"); with none, it refuses nothing.
func (s *script) deny(what ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.denied = map[string]bool{}
	for _, w := range what {
		s.denied[w] = true
	}
}

// proofCount is how many of CheckRead's requests the fake answered.
func (s *script) proofCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proofs
}

// serveProof answers CheckRead's direct reads and key lists.
func (s *script) serveProof(rw http.ResponseWriter, r *http.Request) {
	key := strings.TrimPrefix(r.URL.Path, "/v1/kv/")
	what := "read " + key
	if r.URL.Query().Has("keys") {
		what = "list " + key
	}
	s.mu.Lock()
	s.proofs++
	denied := s.denied[what]
	s.mu.Unlock()
	if denied {
		rw.WriteHeader(http.StatusForbidden)
		_, _ = io.WriteString(rw, "Permission denied")
		return
	}
	rw.Header().Set("X-Consul-Index", "1")
	rw.Header().Set("X-Consul-LastContact", "0")
	rw.Header().Set("X-Consul-KnownLeader", "true")
	rw.WriteHeader(http.StatusNotFound)
}

func newScript(t *testing.T, wait time.Duration, replies ...reply) *script {
	s := &script{t: t, replies: replies, wait: wait, done: make(chan struct{})}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.srv.Close)
	return s
}

// client is a Watcher's client of the fake.
func (s *script) client() *api.Client {
	s.t.Helper()
	c, err := NewClient(s.srv.URL)
	if err != nil {
		s.t.Fatal(err)
	}
	return c
}

func (s *script) serve(rw http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if !q.Has("recurse") && strings.HasPrefix(r.URL.Path, "/v1/kv/") {
		s.serveProof(rw, r)
		return
	}
	if want := fmt.Sprintf("%dms", s.wait.Milliseconds()); q.Get("wait") != want || !q.Has("recurse") {
		s.t.Errorf("listing asked with %s, want recurse and wait=%s", r.URL, want)
	}
	var index uint64
	if q.Has("index") {
		index, _ = strconv.ParseUint(q.Get("index"), 10, 64)
	}
	s.mu.Lock()
	n := len(s.waits)
	if n == len(s.replies) {
		select {
		case <-s.done:
		default:
			close(s.done)
		}
		s.mu.Unlock()
		<-r.Context().Done()
		return
	}
	s.waits = append(s.waits, index)
	rep := s.replies[n]
	s.mu.Unlock()
	serveReply(s.t, rw, rep)
}

// serveReply writes rep as Consul would.
func serveReply(t *testing.T, rw http.ResponseWriter, rep reply) {
	switch {
	case rep.drop:
		conn, _, err := http.NewResponseController(rw).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		// Not an HTTP answer (a closed connection alone would make Go's
		// transport retry the request on a fresh one).
		_, _ = io.WriteString(conn, "not HTTP\r\n\r\n")
		conn.Close()
		return
	case rep.status != 0:
		rw.WriteHeader(rep.status)
		_, _ = io.WriteString(rw, rep.body)
		return
	}
	// The headers Consul sets on every answer (consul/api reads the ones
	// after X-Consul-LastContact only when it is there).
	consulHeaders(rw.Header(), strconv.FormatUint(rep.index, 10))
	if rep.filtered {
		rw.Header().Set("X-Consul-Results-Filtered-By-ACLs", "true")
	}
	if len(rep.pairs) == 0 {
		rw.WriteHeader(http.StatusNotFound)
		return
	}
	body, err := json.Marshal(rep.pairs)
	if err != nil {
		t.Error(err)
	}
	rw.Header().Set("Content-Type", "application/json")
	_, _ = rw.Write(body)
}

func (s *script) waitIndexes() []uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]uint64(nil), s.waits...)
}

// exhausted waits until every reply was consumed.
func (s *script) exhausted(t *testing.T) {
	t.Helper()
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		t.Fatalf("fake consul: only %d of %d replies consumed", len(s.waitIndexes()), len(s.replies))
	}
}

// sinkCall is one ApplyRead call.
type sinkCall struct {
	index   uint64
	kv      map[string]string
	base    uint64
	changed []string // sorted
	err     error
}

// recSink records ApplyRead calls; fail, if set, decides the error of call n
// (counting from 0).
type recSink struct {
	mu    sync.Mutex
	calls []sinkCall
	reads []state.KVRead // each call's read, whole (its source, Reread)
	fail  func(n int) error
}

var _ Sink = (*recSink)(nil)

func (s *recSink) ApplyRead(_ context.Context, r state.KVRead) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var err error
	if s.fail != nil {
		err = s.fail(len(s.calls))
	}
	s.calls = append(s.calls, sinkCall{index: r.Index, kv: maps.Clone(r.KV), base: r.Base, changed: slices.Sorted(slices.Values(r.Changed)), err: err})
	r.KV = maps.Clone(r.KV)
	s.reads = append(s.reads, r)
	return err
}

func (s *recSink) all() []sinkCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]sinkCall(nil), s.calls...)
}

// allReads returns each call's read, whole.
func (s *recSink) allReads() []state.KVRead {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]state.KVRead(nil), s.reads...)
}

// delivered returns the calls that succeeded.
func (s *recSink) delivered() []sinkCall {
	var out []sinkCall
	for _, c := range s.all() {
		if c.err == nil {
			out = append(out, c)
		}
	}
	return out
}

// lastDelivered returns the data of the last successful call, or nil.
func (s *recSink) lastDelivered() map[string]string {
	d := s.delivered()
	if len(d) == 0 {
		return nil
	}
	return d[len(d)-1].kv
}

// runWatcher runs w until the returned stop is called or the test ends;
// stop checks that Run returned context.Canceled promptly.
func runWatcher(t *testing.T, w *Watcher) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }() // owned by stop
	stop = sync.OnceFunc(func() {
		cancel()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("Run returned %v, want context.Canceled", err)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("Run did not return within 5s of cancel")
		}
	})
	t.Cleanup(stop)
	return stop
}

func kvp(key, value string) *api.KVPair { return &api.KVPair{Key: key, Value: []byte(value)} }

func folder(key string) *api.KVPair { return &api.KVPair{Key: key} }
