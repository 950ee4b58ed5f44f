package kvsync

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/hastate/hastate/state"
)

// fakeKV is a KV whose List is a function field.
type fakeKV struct {
	list func(prefix string, q *api.QueryOptions) (api.KVPairs, *api.QueryMeta, error)
}

var _ KV = (*fakeKV)(nil)

func (f *fakeKV) List(prefix string, q *api.QueryOptions) (api.KVPairs, *api.QueryMeta, error) {
	return f.list(prefix, q)
}

// reply is one scripted answer of a fake Consul.
type reply struct {
	pairs    api.KVPairs
	index    uint64
	err      error
	filtered bool // ResultsFilteredByACLs
}

// script is a fake Consul that answers replies in order, records each
// call's WaitIndex, then blocks until the call's context is done.
type script struct {
	t       *testing.T
	replies []reply
	wait    time.Duration // expected WaitTime of every call

	mu    sync.Mutex
	waits []uint64
	done  chan struct{} // closed at the first call past the script
}

func newScript(t *testing.T, wait time.Duration, replies ...reply) *script {
	return &script{t: t, replies: replies, wait: wait, done: make(chan struct{})}
}

func (s *script) kv() *fakeKV {
	return &fakeKV{list: func(prefix string, q *api.QueryOptions) (api.KVPairs, *api.QueryMeta, error) {
		if q.WaitTime != s.wait {
			s.t.Errorf("WaitTime = %s, want %s", q.WaitTime, s.wait)
		}
		ctx := q.Context()
		if ctx.Done() == nil {
			s.t.Error("List called without a cancellable context")
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
			<-ctx.Done()
			return nil, nil, ctx.Err()
		}
		s.waits = append(s.waits, q.WaitIndex)
		r := s.replies[n]
		s.mu.Unlock()
		if r.err != nil {
			return nil, nil, r.err
		}
		return r.pairs, &api.QueryMeta{LastIndex: r.index, ResultsFilteredByACLs: r.filtered}, nil
	}}
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
	return err
}

func (s *recSink) all() []sinkCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]sinkCall(nil), s.calls...)
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
