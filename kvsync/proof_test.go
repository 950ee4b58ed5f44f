package kvsync

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/hastate/hastate/internal/testenv"
)

// TestProofOnEveryListingThatRemovesKeys: the read proof is not only for
// the first read of a Run. After a first read applied with a token that
// could read the prefix, the token loses its read (a policy changed, the
// file now holds another token) and Consul lists the prefix short or
// empty without saying it filtered. Such a listing must not be applied
// while the proof fails: it would turn every drained server it lost back
// to ready. A listing that only adds keys removes nothing and is applied
// as read (kvsync/DESIGN.md, "What the token may not read").
func TestProofOnEveryListingThatRemovesKeys(t *testing.T) {
	held := api.KVPairs{kvp("hastate/state/web/s1", "drain"), kvp("hastate/state/web/s2", "maint")}
	cases := []struct {
		name    string
		after   api.KVPairs // the listing once the token lost its read
		applied bool        // handed to the Sink although the proof fails
	}{
		{name: "empty", after: nil},
		{name: "one key fewer", after: api.KVPairs{kvp("hastate/state/web/s1", "drain")}},
		{name: "one key more", after: append(api.KVPairs{kvp("hastate/state/web/s0", "drain")}, held...), applied: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var (
				mu      sync.Mutex
				index   uint64 = 5
				pairs          = held
				may            = true // the direct reads of the proof
				changed        = make(chan struct{})
			)
			srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
				mu.Lock()
				idx, ps, ok := index, pairs, may
				mu.Unlock()
				q := r.URL.Query()
				switch {
				case q.Has("recurse"):
					if q.Get("index") == strconv.FormatUint(idx, 10) {
						select { // a blocking query: answered once the prefix changes
						case <-r.Context().Done():
							return
						case <-changed:
						}
						mu.Lock()
						idx, ps = index, pairs
						mu.Unlock()
					}
					serveReply(t, rw, reply{index: idx, pairs: ps})
				case ok:
					serveReply(t, rw, reply{index: idx}) // 404: may read, absent
				default:
					serveReply(t, rw, reply{status: http.StatusForbidden, body: "Permission denied: token lacks permission 'key:read'"})
				}
			}))
			t.Cleanup(srv.Close)
			sink, w := watchFake(t, srv)
			testenv.Eventually(t, 10*time.Second, func() error {
				return testenv.Expect(len(sink.delivered()) == 1, "the first read (proven) is not applied yet")
			})
			mu.Lock()
			index, pairs, may = 9, tc.after, false
			mu.Unlock()
			close(changed)
			testenv.Eventually(t, 10*time.Second, func() error {
				calls := sink.delivered()
				last := calls[len(calls)-1]
				switch {
				case !tc.applied && len(calls) > 1:
					t.Fatalf("a listing of %d keys at index %d, which removes what the Sink holds, was applied although the token may not read the prefix", len(last.kv), last.index)
				case tc.applied && last.index != 9:
					return fmt.Errorf("the listing that only adds keys is not applied yet (last applied: index %d)", last.index)
				case !tc.applied && w.Status().TokenProblem == nil:
					return errors.New("the failed proof is not reported as a token problem yet")
				}
				return nil
			})
		})
	}
}

// TestProofRefusesAKeyListFilteredByACLs: a token that may read state/
// but where a narrower rule denies some key below it passes every direct
// read of the proof; Consul says so only on the key list, with
// X-Consul-Results-Filtered-By-ACLs, which consul/api's Keys does not
// return. The proof reads the header itself and refuses the token.
func TestProofRefusesAKeyListFilteredByACLs(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		consulHeaders(rw.Header(), "7")
		if r.URL.Query().Has("keys") {
			rw.Header().Set("X-Consul-Results-Filtered-By-ACLs", "true")
			_, _ = rw.Write([]byte(`["hastate/state/"]`))
			return
		}
		rw.WriteHeader(http.StatusNotFound) // a direct read: may read, absent
	}))
	t.Cleanup(srv.Close)
	client, err := NewClient(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	var te *TokenError
	if err := CheckRead(t.Context(), client, "hastate/", "acc-1"); !errors.As(err, &te) || te.Refused != "read every key under hastate/" {
		t.Fatalf("the proof with a filtered key list: %v, want a TokenError refusing to read every key under hastate/", err)
	}
}

// TestListingsAreConsistentReads: right after a Consul server restarts or
// its leader changes, Consul's default read mode answers from whatever
// that server has applied so far (an empty prefix at index 1 was seen).
// The fake answers so in the default mode and with the current state only
// to a consistent read: the watch must never hand over the stale answer.
func TestListingsAreConsistentReads(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		switch {
		case !q.Has("consistent"):
			serveReply(t, rw, reply{index: 1}) // not caught up yet: empty, index 1
		case !q.Has("recurse"):
			serveReply(t, rw, reply{index: 11}) // the proof: 404, the token may read
		case q.Get("index") == "11":
			<-r.Context().Done() // nothing changes: the query blocks
		default:
			serveReply(t, rw, reply{index: 11, pairs: api.KVPairs{kvp("hastate/state/web/s1", "drain")}})
		}
	}))
	t.Cleanup(srv.Close)
	sink, _ := watchFake(t, srv)
	testenv.Eventually(t, 10*time.Second, func() error {
		for _, c := range sink.delivered() {
			if c.kv["state/web/s1"] != "drain" {
				t.Fatalf("the Sink was handed a read of %d keys at index %d: a stale default-mode answer", len(c.kv), c.index)
			}
		}
		return testenv.Expect(len(sink.delivered()) > 0, "nothing handed over yet")
	})
}

// watchFake runs a Watcher of hastate/ against the fake Consul srv until
// the test ends, and returns its Sink and the Watcher.
func watchFake(t *testing.T, srv *httptest.Server) (*recSink, *Watcher) {
	t.Helper()
	client, err := NewClient(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	sink := &recSink{}
	w, err := New(Options{Client: client, Prefix: "hastate/", Sink: sink,
		WaitTime: 200 * time.Millisecond, BackoffBase: 10 * time.Millisecond, BackoffMax: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	runWatcher(t, w)
	return sink, w
}
