package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
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
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return fmt.Errorf("GET %s: %w", path, err)
	}
	return nil
}

// State reads every server and invalid key the replica knows; cluster
// also merges what the other replicas' HAProxy nodes polled (see
// StateView.Replicas). It fails with ErrTruncated rather than return a cut
// list.
func (c *Client) State(ctx context.Context, cluster bool) (StateView, error) {
	var v StateView
	p := fmt.Sprintf("/v1/state?limit=%d", MaxLimit)
	if cluster {
		p += "&scope=cluster"
	}
	if err := c.Get(ctx, p, &v); err != nil {
		return v, err
	}
	if v.Truncated {
		return v, fmt.Errorf("GET %s: %w: the replica knows %d servers and answered %d", p, ErrTruncated, v.Total, len(v.Servers))
	}
	return v, nil
}

// Pollers reads which HAProxy asked for which server; cluster merges every
// replica's (see PollersView.Replicas). It fails with ErrTruncated rather
// than return a cut list.
func (c *Client) Pollers(ctx context.Context, cluster bool) (PollersView, error) {
	var v PollersView
	p := fmt.Sprintf("/v1/pollers?limit=%d", MaxLimit)
	if cluster {
		p += "&scope=cluster"
	}
	if err := c.Get(ctx, p, &v); err != nil {
		return v, err
	}
	if v.Truncated {
		return v, fmt.Errorf("GET %s: %w: the replicas know %d polls and answered %d", p, ErrTruncated, v.Total, len(v.Pollers))
	}
	return v, nil
}

// Cluster reads the replica's view of the raft cluster.
func (c *Client) Cluster(ctx context.Context) (ClusterInfo, error) {
	var v ClusterInfo
	return v, c.Get(ctx, "/v1/cluster", &v)
}
