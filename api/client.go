package api

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
)

// Client reads a hastate replica's HTTP API. Every call is bounded by its
// context, the body included.
type Client struct {
	base string
	http *http.Client
}

// NewClient returns a client for the replica at addr: a URL such as
// http://hastate.internal:9778, or a bare host:port (as CONSUL_HTTP_ADDR is
// written). hc nil means http.DefaultClient.
func NewClient(addr string, hc *http.Client) (*Client, error) {
	base := strings.TrimSuffix(strings.TrimSpace(addr), "/")
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	u, err := url.Parse(base)
	if err != nil || u.Hostname() == "" || strings.HasSuffix(u.Host, ":") || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, fmt.Errorf("replica address %q: want host:port or http(s)://host:port", addr)
	}
	if hc == nil {
		hc = http.DefaultClient
	}
	return &Client{base: base, http: hc}, nil
}

// Addr is the replica's base URL.
func (c *Client) Addr() string { return c.base }

// StatusError is an HTTP answer other than 200.
type StatusError struct {
	Code int
	Body string // the start of the body, which says what was wrong
}

func (e *StatusError) Error() string { return fmt.Sprintf("HTTP %d: %s", e.Code, e.Body) }

// ErrTruncated is returned when a list is cut at MaxLimit rows: the caller
// must not act on a partial view.
var ErrTruncated = errors.New("the list is cut at the most rows one answer carries")

// Get reads path (with its query) into v.
func (c *Client) Get(ctx context.Context, path string, v any) error {
	return c.get(ctx, path, func(body io.Reader) error { return json.NewDecoder(body).Decode(v) })
}

// get asks for path and hands decode the body of a 200 answer.
func (c *Client) get(ctx context.Context, path string, decode func(io.Reader) error) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+path, nil)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return &StatusError{Code: resp.StatusCode, Body: strings.TrimSpace(string(b))}
	}
	if err := decode(resp.Body); err != nil {
		return fmt.Errorf("GET %s: %w", path, err)
	}
	return nil
}

// ErrOlderReplica is returned when the replica runs a release that cannot
// answer what was asked (filter a list, the record of HAProxy nodes) and
// the caller cannot do without it.
var ErrOlderReplica = errors.New("the replica runs an older hastate release")

// maxPages bounds the pages a list is read in (each at most MaxLimit rows).
const maxPages = 1000

// StateOf reads the servers q.Filter selects, every page of them (q.Limit
// rows each; 0: MaxLimit), from one replica; cluster also merges what the
// other replicas' HAProxy nodes polled. A replica of a release before
// 0.15.0 ignores the filter: its answer is filtered here, and when it is
// cut (the fleet does not fit in one answer) StateOf fails with
// ErrOlderReplica rather than act on part of it.
func (c *Client) StateOf(ctx context.Context, q Query, cluster bool) (StateView, error) {
	q.Limit = cmp.Or(q.Limit, MaxLimit)
	var out StateView
	for page := 0; ; page++ {
		v := q.values()
		if cluster {
			v.Set("scope", "cluster")
		}
		p := "/v1/state?" + v.Encode()
		var pv StateView
		err := c.get(ctx, p, func(body io.Reader) error {
			chunks, err := readChunks(body, firstChunk, maxChunk)
			if err != nil {
				// As before: what json.Decoder makes of the body up to
				// the error (a value complete before it is read).
				return json.NewDecoder(io.MultiReader(chunksReader(chunks), failingReader{err})).Decode(&pv)
			}
			pv, err = decodeState(chunks)
			return err
		})
		if err != nil {
			return out, err
		}
		older := !q.Filter.All() && pv.Selectors == nil
		if older {
			if pv.Truncated {
				return pv, fmt.Errorf("GET %s: %w: %w: it does not filter by selector (0.15.0 and later do), and its %d servers do not fit in one answer; ask a replica that runs 0.15.0 or later", p, ErrOlderReplica, ErrTruncated, pv.Total)
			}
			var rows []ServerState
			for _, r := range pv.Servers {
				if q.Filter.Match(r.Backend, r.Server) {
					rows = append(rows, r)
				}
			}
			for _, r := range pv.Servers {
				pv.Backends = appendNew(pv.Backends, r.Backend)
			}
			pv.Servers, pv.Total, pv.Selectors = rows, len(rows), q.Filter.Strings()
		}
		if page == 0 {
			out = pv
		} else {
			out.Servers = append(out.Servers, pv.Servers...)
			out.Replicas = mergeAnswers(out.Replicas, pv.Replicas)
		}
		switch {
		case pv.Next == "" && pv.Truncated && !older:
			return out, fmt.Errorf("GET %s: %w: the replica knows %d servers and answered %d", p, ErrTruncated, pv.Total, len(out.Servers))
		case pv.Next == "":
			out.Next, out.Truncated = "", false
			if pv.InvalidTotal > len(out.InvalidKeys) {
				return out, fmt.Errorf("GET %s: %w: %d invalid keys, %d answered", p, ErrTruncated, pv.InvalidTotal, len(out.InvalidKeys))
			}
			return out, nil
		case page+1 >= maxPages:
			return out, fmt.Errorf("GET %s: %w: more than %d pages", p, ErrTruncated, maxPages)
		}
		q.After = pv.Next
	}
}

// PollersOf reads the polls of the servers q.Filter selects, every page of
// them; cluster merges every replica's. A replica of a release before
// 0.15.0 is handled as in StateOf.
func (c *Client) PollersOf(ctx context.Context, q Query, cluster bool) (PollersView, error) {
	q.Limit = cmp.Or(q.Limit, MaxLimit)
	var out PollersView
	for page := 0; ; page++ {
		v := q.values()
		if cluster {
			v.Set("scope", "cluster")
		}
		p := "/v1/pollers?" + v.Encode()
		var pv PollersView
		if err := c.Get(ctx, p, &pv); err != nil {
			return out, err
		}
		older := !q.Filter.All() && pv.Selectors == nil
		if older {
			if pv.Truncated {
				return pv, fmt.Errorf("GET %s: %w: %w: it does not filter by selector (0.15.0 and later do), and its %d polls do not fit in one answer; ask a replica that runs 0.15.0 or later", p, ErrOlderReplica, ErrTruncated, pv.Total)
			}
			var rows []Poll
			for _, r := range pv.Pollers {
				if q.Filter.Match(r.Backend, r.Server) {
					rows = append(rows, r)
				}
			}
			pv.Pollers, pv.Total, pv.Selectors = rows, len(rows), q.Filter.Strings()
		}
		if page == 0 {
			out = pv
		} else {
			out.Pollers = append(out.Pollers, pv.Pollers...)
			out.Replicas = mergeAnswers(out.Replicas, pv.Replicas)
		}
		switch {
		case pv.Next == "" && pv.Truncated && !older:
			return out, fmt.Errorf("GET %s: %w: the replicas know %d polls and answered %d", p, ErrTruncated, pv.Total, len(out.Pollers))
		case pv.Next == "":
			out.Next, out.Truncated = "", false
			return out, nil
		case page+1 >= maxPages:
			return out, fmt.Errorf("GET %s: %w: more than %d pages", p, ErrTruncated, maxPages)
		}
		q.After = pv.Next
	}
}

// mergeAnswers keeps, per replica, the worst answer over the pages: one
// that failed on any page did not answer the whole list.
func mergeAnswers(a, b []ReplicaAnswer) []ReplicaAnswer {
	out := slices.Clone(a)
	for _, r := range b {
		i := slices.IndexFunc(out, func(x ReplicaAnswer) bool { return x.ID == r.ID })
		switch {
		case i < 0:
			out = append(out, r)
		case !r.Answered:
			out[i] = r
		}
	}
	return out
}

func appendNew(list []string, s string) []string {
	if slices.Contains(list, s) {
		return list
	}
	return append(list, s)
}

// HAProxies reads the cluster's record of which HAProxy nodes exist, with
// what each replica that answered saw. A replica of a release before
// 0.15.0 has no such endpoint: ErrOlderReplica.
func (c *Client) HAProxies(ctx context.Context) (HAProxiesView, error) {
	var v HAProxiesView
	err := c.Get(ctx, "/v1/haproxies", &v)
	var se *StatusError
	if errors.As(err, &se) && se.Code == http.StatusNotFound {
		return v, fmt.Errorf("GET /v1/haproxies: %w (0.15.0 and later record which HAProxy nodes exist)", ErrOlderReplica)
	}
	return v, err
}

// Cluster reads the replica's view of the raft cluster.
func (c *Client) Cluster(ctx context.Context) (ClusterInfo, error) {
	var v ClusterInfo
	return v, c.Get(ctx, "/v1/cluster", &v)
}

// failingReader fails every read with err.
type failingReader struct{ err error }

func (r failingReader) Read([]byte) (int, error) { return 0, r.err }
