package kvsync

import (
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	hapi "github.com/hastate/hastate/api"
	"github.com/hastate/hastate/internal/testenv"
)

// consulHeaders are the headers Consul sets on every KV answer.
func consulHeaders(h http.Header, index string) {
	h.Set("X-Consul-Index", index)
	h.Set("X-Consul-LastContact", "0")
	h.Set("X-Consul-KnownLeader", "true")
}

// pairsBody is a Consul listing of pairs.
func pairsBody(t *testing.T, pairs ...*api.KVPair) string {
	t.Helper()
	b, err := json.Marshal(api.KVPairs(pairs))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Only Consul's own answer is applied. A fake Consul answers a real read
// at index 500 (web/s1 drained), then, every time after, an answer that
// is not Consul's listing of the prefix: each is refused, nothing more is
// applied (the Sink holds the drain), and the Watcher's status names why,
// with the mirror reason the verdict uses.
func TestWatcherAppliesOnlyConsulsOwnAnswer(t *testing.T) {
	t.Parallel()
	good := func(t *testing.T) http.HandlerFunc {
		body := pairsBody(t, kvp("hastate/state/web/s1", "drain"), kvp("hastate/state/web/s2", "maint"))
		return func(rw http.ResponseWriter, r *http.Request) {
			consulHeaders(rw.Header(), "500")
			_, _ = io.WriteString(rw, body)
		}
	}
	bare404 := func(rw http.ResponseWriter, r *http.Request) { http.NotFound(rw, r) }
	headers := func(mod func(h http.Header), status int, body string) http.HandlerFunc {
		return func(rw http.ResponseWriter, r *http.Request) {
			consulHeaders(rw.Header(), "501")
			mod(rw.Header())
			rw.WriteHeader(status)
			_, _ = io.WriteString(rw, body)
		}
	}
	same := func(http.Header) {}
	one := `[{"Key":"hastate/state/web/s1","Value":"ZHJhaW4="}]` // drain
	tests := []struct {
		name   string
		bad    func(t *testing.T) http.HandlerFunc
		want   string // in the status's last error
		reason hapi.MirrorReason
	}{
		{"404 with no Consul headers (a proxy or LB with no route)", func(*testing.T) http.HandlerFunc { return bare404 }, "no X-Consul-Index header", hapi.MirrorNotConsul},
		{"404 without X-Consul-Index", func(*testing.T) http.HandlerFunc {
			return headers(func(h http.Header) { h.Del("X-Consul-Index") }, 404, "")
		}, "no X-Consul-Index header", hapi.MirrorNotConsul},
		{"404 with a garbled X-Consul-Index", func(*testing.T) http.HandlerFunc {
			return headers(func(h http.Header) { h.Set("X-Consul-Index", "5o1") }, 404, "")
		}, `X-Consul-Index "5o1" is not a number`, hapi.MirrorNotConsul},
		{"404 at X-Consul-Index 0", func(*testing.T) http.HandlerFunc {
			return headers(func(h http.Header) { h.Set("X-Consul-Index", "0") }, 404, "")
		}, "X-Consul-Index is 0", hapi.MirrorNotConsul},
		{"200 without X-Consul-Index", func(*testing.T) http.HandlerFunc {
			return headers(func(h http.Header) { h.Del("X-Consul-Index") }, 200, one)
		}, "no X-Consul-Index header", hapi.MirrorNotConsul},
		{"404 without X-Consul-KnownLeader", func(*testing.T) http.HandlerFunc {
			return headers(func(h http.Header) { h.Del("X-Consul-KnownLeader") }, 404, "")
		}, `X-Consul-KnownLeader is ""`, hapi.MirrorNotConsul},
		{"404 with X-Consul-KnownLeader false", func(*testing.T) http.HandlerFunc {
			return headers(func(h http.Header) { h.Set("X-Consul-KnownLeader", "false") }, 404, "")
		}, `X-Consul-KnownLeader is "false"`, hapi.MirrorNotConsul},
		{"200 with X-Consul-KnownLeader garbled", func(*testing.T) http.HandlerFunc {
			return headers(func(h http.Header) { h.Set("X-Consul-KnownLeader", "yes") }, 200, one)
		}, `X-Consul-KnownLeader is "yes"`, hapi.MirrorNotConsul},
		{"404 without X-Consul-LastContact", func(*testing.T) http.HandlerFunc {
			return headers(func(h http.Header) { h.Del("X-Consul-LastContact") }, 404, "")
		}, "no X-Consul-LastContact header", hapi.MirrorNotConsul},
		{"200 with a garbled X-Consul-LastContact", func(*testing.T) http.HandlerFunc {
			return headers(func(h http.Header) { h.Set("X-Consul-LastContact", "soon") }, 200, one)
		}, `X-Consul-LastContact "soon" is not a number`, hapi.MirrorNotConsul},
		{"filtered by ACLs after a garbled X-Consul-LastContact (consul/api stops reading there)", func(*testing.T) http.HandlerFunc {
			return headers(func(h http.Header) {
				h.Set("X-Consul-LastContact", "-")
				h.Set("X-Consul-Results-Filtered-By-ACLs", "true")
			}, 200, one)
		}, "X-Consul-LastContact", hapi.MirrorNotConsul},
		{"filtered by ACLs, headers sane", func(*testing.T) http.HandlerFunc {
			return headers(func(h http.Header) { h.Set("X-Consul-Results-Filtered-By-ACLs", "true") }, 200, one)
		}, "may not read every key", hapi.MirrorTokenCannotRead},
		{"200 []", func(*testing.T) http.HandlerFunc { return headers(same, 200, "[]") }, "the body is []", hapi.MirrorNotConsul},
		{"200 null", func(*testing.T) http.HandlerFunc { return headers(same, 200, "null") }, "the body is null", hapi.MirrorNotConsul},
		{"200 [ ] with spaces", func(*testing.T) http.HandlerFunc { return headers(same, 200, " [ ]\n") }, "the body is []", hapi.MirrorNotConsul},
		{"a redirect (Consul cleaning a path: another prefix)", func(*testing.T) http.HandlerFunc {
			return func(rw http.ResponseWriter, r *http.Request) {
				if strings.HasPrefix(r.URL.Path, "/v1/kv/other/") {
					consulHeaders(rw.Header(), "900")
					rw.WriteHeader(404)
					return
				}
				http.Redirect(rw, r, "/v1/kv/other/?"+r.URL.RawQuery, http.StatusMovedPermanently)
			}
		}, `redirected (HTTP 301) to "/v1/kv/other/`, hapi.MirrorNotConsul},
		{"a key repeated (invalid UTF-8 read as U+FFFD)", func(t *testing.T) http.HandlerFunc {
			return headers(same, 200, pairsBody(t, kvp("hastate/state/web/s1", "drain"), kvp("hastate/state/web/s\uFFFD", "drain"), kvp("hastate/state/web/s\uFFFD", "ready")))
		}, "listed a key twice", hapi.MirrorConsulUnreachable},
		{"a key repeated, not next to its twin", func(t *testing.T) http.HandlerFunc {
			return headers(same, 200, pairsBody(t, kvp("hastate/state/web/a\uFFFD", "drain"), kvp("hastate/state/web/a\uFFFD1", "drain"), kvp("hastate/state/web/a\uFFFD", "ready")))
		}, "listed a key twice", hapi.MirrorConsulUnreachable},
		{"a key outside the prefix", func(t *testing.T) http.HandlerFunc {
			return headers(same, 200, pairsBody(t, kvp("hastate/state/web/s1", "drain"), kvp("other/state/web/s2", "ready")))
		}, `a key outside the prefix asked: "other/state/web/s2"`, hapi.MirrorNotConsul},
		{"only keys outside the prefix", func(t *testing.T) http.HandlerFunc {
			return headers(same, 200, pairsBody(t, kvp("hastate2/state/web/s1", "ready")))
		}, "a key outside the prefix", hapi.MirrorNotConsul},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var calls atomic.Int64
			goodH, badH := good(t), tt.bad(t)
			srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
				if !r.URL.Query().Has("recurse") {
					// CheckRead's proof that the token may read (the
					// first read of a term is proven): it may.
					consulHeaders(rw.Header(), "500")
					rw.WriteHeader(http.StatusNotFound)
					return
				}
				if calls.Add(1) == 1 && r.URL.Path == "/v1/kv/hastate/" {
					goodH(rw, r)
					return
				}
				badH(rw, r)
			}))
			t.Cleanup(srv.Close)
			c, err := NewClient(srv.URL)
			if err != nil {
				t.Fatal(err)
			}
			sink := &recSink{}
			w, err := New(fastOptions(c, sink))
			if err != nil {
				t.Fatal(err)
			}
			stop := runWatcher(t, w)
			testenv.Eventually(t, 10*time.Second, func() error {
				st := w.Status()
				return testenv.Expect(st.ConsecutiveErrors >= 3, "status %+v: want 3 failed reads after the good one", st)
			})
			stop()
			want := map[string]string{"state/web/s1": "drain", "state/web/s2": "maint"}
			if d := sink.delivered(); len(d) != 1 || d[0].index != 500 || !maps.Equal(d[0].kv, want) {
				t.Errorf("sink got %+v, want only the read at index 500", d)
			}
			st := w.Status()
			if !strings.Contains(st.LastError, tt.want) || st.Reachable || st.SyncedIndex != 500 {
				t.Errorf("status %+v: want the last error to say %q, unreachable, synced at 500", st, tt.want)
			}
			if st.LastErrorReason != tt.reason {
				t.Errorf("reason %q, want %q (error %q)", st.LastErrorReason, tt.reason, st.LastError)
			}
		})
	}
}

// The probe asks what the watch asks: a consistent listing, answered by
// Consul itself.
func TestProbeAsksWhatTheWatchAsks(t *testing.T) {
	t.Parallel()
	var asked atomic.Value
	var bare atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if bare.Load() {
			http.NotFound(rw, r)
			return
		}
		consulHeaders(rw.Header(), "7")
		if !r.URL.Query().Has("keys") {
			rw.WriteHeader(http.StatusNotFound) // CheckRead's direct reads: nothing there
			return
		}
		asked.Store(r.URL.String())
		_, _ = io.WriteString(rw, `["hastate/state/"]`)
	}))
	t.Cleanup(srv.Close)
	c, err := NewClient(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewProbe(ProbeOptions{Client: c, Prefix: "hastate/"})
	if err != nil {
		t.Fatal(err)
	}
	p.check(t.Context())
	if h := p.Health(); !h.Reachable || h.Verdict.Reason != hapi.MirrorOK {
		t.Fatalf("probe of a sane Consul: %+v", h)
	}
	u := asked.Load().(string)
	for _, want := range []string{"/v1/kv/hastate/", "consistent", "keys", "separator=%2F"} {
		if !strings.Contains(u, want) {
			t.Errorf("probe asked %s, want %s in it", u, want)
		}
	}
	if strings.Contains(u, "stale") {
		t.Errorf("probe asked %s: a stale read succeeds where the watch fails", u)
	}
	bare.Store(true)
	p.check(t.Context())
	if h := p.Health(); h.Reachable || h.Verdict.Reason != hapi.MirrorNotConsul || !strings.Contains(h.Verdict.Detail, "X-Consul-Index") {
		t.Errorf("probe of a bare 404: %+v, want not_consul naming the header", h)
	}
}

func TestCheckPrefix(t *testing.T) {
	t.Parallel()
	for _, p := range []string{"hastate/", "gitlab-haproxy-agent/", "a/b/", "a.b/", "..a/"} {
		if err := CheckPrefix(p); err != nil {
			t.Errorf("CheckPrefix(%q) = %v, want nil", p, err)
		}
	}
	for p, want := range map[string]string{
		"":              "empty",
		"hastate":       `must end with "/"`,
		"/hastate/":     "must not start",
		"hastate//":     `segment ""`,
		"a//b/":         `segment "": Consul would redirect`,
		"./hastate/":    `segment "."`,
		"hastate/./":    `segment "."`,
		"hastate/../":   `segment ".."`,
		"a/../hastate/": `e.g. "a/hastate/"`,
	} {
		if err := CheckPrefix(p); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("CheckPrefix(%q) = %v, want an error with %q", p, err, want)
		}
	}
}
