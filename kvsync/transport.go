package kvsync

// This file is the transport hook. consul/api never hands back a
// listing's body, so the decoding happens in its HTTP transport
// (listingTransport, installed by NewClient): the Watcher marks its List
// call's context with a *capture, the transport decodes the 200 answer's
// body into it (decode.go, merged with the held read by merge.go) and
// hands consul/api an empty array in its place; a 404 is the empty
// prefix. Everything else (address, TLS, token, namespace, X-Consul-Index,
// the ACL-filtered header, status errors) stays consul/api's. This is the
// one way a listing is read: a List that did not pass through the
// transport (a client not built by NewClient) is an error, and the tests
// read fakes of Consul over HTTP through it too.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/hashicorp/consul/api"
)

// NewClient returns the Consul client for addr (see ClientConfig) with the
// transport that lets a Watcher decode its listings itself.
func NewClient(addr string) (*api.Client, error) { return newClient(ClientConfig(addr)) }

// newClient is NewClient for cfg (tests set its HTTP client).
func newClient(cfg *api.Config) (*api.Client, error) {
	c, err := api.NewClient(cfg)
	if err != nil {
		return nil, err
	}
	// api.NewClient fills cfg.HttpClient (for every address form, unix
	// sockets included) and the client shares that *http.Client.
	cfg.HttpClient.Transport = listingTransport{next: cfg.HttpClient.Transport}
	return c, nil
}

// listingTransport decodes the body of a request whose context carries a
// *capture (see withCapture) into it.
type listingTransport struct{ next http.RoundTripper }

func (t listingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	next := t.next
	if next == nil {
		next = http.DefaultTransport
	}
	c, _ := req.Context().Value(captureKey{}).(*capture)
	_, check := req.Context().Value(checkKey{}).(checkKey)
	if c != nil && req.Header.Get("Accept-Encoding") == "" {
		// Consul gzips an answer when asked to, and Go's transport asks
		// by default: 11 MB of JSON at 50,000 keys cost Consul's CPU
		// more than the listing itself and ours again to inflate, while
		// the bytes cross a data centre's network in milliseconds.
		req = req.Clone(req.Context())
		req.Header.Set("Accept-Encoding", "identity")
	}
	resp, err := next.RoundTrip(req)
	if err != nil || (c == nil && !check) {
		return resp, err
	}
	switch resp.StatusCode {
	case http.StatusOK, http.StatusNotFound:
		// Only Consul's own answer counts, a 404 above all: a proxy, a
		// load balancer with no route or another service at the address
		// answers 404 too, and that is not "nothing set".
		if err := checkConsulAnswer(resp.Header); err != nil {
			drain(resp)
			return nil, fmt.Errorf("%s %s: HTTP %d: %w", req.Method, req.URL.Path, resp.StatusCode, err)
		}
	case http.StatusMovedPermanently, http.StatusFound, http.StatusSeeOther, http.StatusTemporaryRedirect, http.StatusPermanentRedirect:
		// Consul redirects a path it cleans (hastate//state/ to
		// hastate/state/): the answer would be another prefix's.
		drain(resp)
		return nil, fmt.Errorf("%s %s: redirected (HTTP %d) to %q: %w: a read must be answered for the path asked",
			req.Method, req.URL.Path, resp.StatusCode, resp.Header.Get("Location"), errNotConsul)
	default:
		return resp, nil // consul/api's status error
	}
	if c == nil {
		return resp, nil
	}
	if resp.StatusCode == http.StatusNotFound {
		// No key under the prefix, said by Consul: consul/api answers
		// no pairs.
		c.done = true
		c.res, err = readListing(func(func(rel, v []byte) error) error { return nil }, c.last.kv)
		return resp, err
	}
	if err := c.consume(resp); err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(strings.NewReader("[]"))
	resp.ContentLength = 2
	resp.Header.Del("Content-Length")
	return resp, nil
}

type captureKey struct{}

// checkKey marks a request whose answer must be Consul's own (see
// checkConsulAnswer); a listing's capture implies it.
type checkKey struct{}

// withCheck marks ctx so that listingTransport refuses an answer to the
// request made with it that is not Consul's.
func withCheck(ctx context.Context) context.Context {
	return context.WithValue(ctx, checkKey{}, checkKey{})
}

// checkConsulAnswer reports whether h are the headers of Consul's answer to
// a consistent KV read: X-Consul-Index present, a number, above 0 (Consul's
// indexes start at 1; consul/api would turn a missing one into 0 and the
// Watcher read that as "the index went backwards"); X-Consul-KnownLeader
// "true" (a consistent read is answered by the leader); and
// X-Consul-LastContact a number. consul/api ignores the error of its own
// header parse, and a missing or garbled X-Consul-LastContact ends that
// parse before X-Consul-Results-Filtered-By-ACLs is read: so the ACL header
// is read here too.
func checkConsulAnswer(h http.Header) error {
	idx := h.Get("X-Consul-Index")
	switch n, err := strconv.ParseUint(idx, 10, 64); {
	case idx == "":
		return fmt.Errorf("%w: no X-Consul-Index header", errNotConsul)
	case err != nil:
		return fmt.Errorf("%w: X-Consul-Index %q is not a number", errNotConsul, idx)
	case n == 0:
		return fmt.Errorf("%w: X-Consul-Index is 0 (Consul's indexes start at 1)", errNotConsul)
	}
	if kl := h.Get("X-Consul-KnownLeader"); kl != "true" {
		return fmt.Errorf("%w: X-Consul-KnownLeader is %q, not \"true\": no Consul leader vouches for the answer", errNotConsul, kl)
	}
	if lc := h.Get("X-Consul-LastContact"); lc == "" {
		return fmt.Errorf("%w: no X-Consul-LastContact header", errNotConsul)
	} else if _, err := strconv.ParseUint(lc, 10, 64); err != nil {
		return fmt.Errorf("%w: X-Consul-LastContact %q is not a number", errNotConsul, lc)
	}
	if h.Get("X-Consul-Results-Filtered-By-ACLs") == "true" {
		return errFilteredByACLs
	}
	return nil
}

// drain reads (a bounded part of) and closes a body that is refused, so
// that the connection can be reused.
func drain(resp *http.Response) {
	_, _ = io.CopyN(io.Discard, resp.Body, 64<<10)
	resp.Body.Close()
}

// withCapture marks ctx so that listingTransport decodes the listing
// answered to the request made with it into c.
func withCapture(ctx context.Context, c *capture) context.Context {
	return context.WithValue(ctx, captureKey{}, c)
}

// capture is one listing request's decoding. The Watcher fills the inputs;
// the transport sets done and the result.
type capture struct {
	prefix string
	index  uint64 // the WaitIndex asked
	last   held   // what the Sink holds; its kv is nil when nothing yet
	// unordered: read in full, not merged with last (see errUnordered).
	unordered bool
	body      *[]byte // reused buffer for the body
	value     *[]byte // reused buffer for one base64-decoded value

	done bool // the transport read the answer (200 or 404)
	res  listing
}

// consume reads and closes resp's body and decodes it into c. An answer at
// the index asked changed nothing (the wait ended, or a write outside the
// prefix woke the query): its body is read but not decoded.
func (c *capture) consume(resp *http.Response) error {
	defer resp.Body.Close()
	if c.index != 0 && resp.Header.Get("X-Consul-Index") == strconv.FormatUint(c.index, 10) {
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			return fmt.Errorf("read KV listing: %w", err)
		}
		c.done, c.res = true, listing{count: len(c.last.kv), unchanged: true}
		return nil
	}
	lr := listingReader{listingDecoder: listingDecoder{b: (*c.body)[:0]}, r: resp.Body}
	var err error
	if c.last.kv == nil || c.unordered {
		c.res, err = readListing(lr.walk(c.prefix, c.value), c.last.kv)
	} else {
		c.res, err = mergeListing(lr.walk(c.prefix, c.value), c.last)
	}
	*c.body = lr.b[:0]
	if err != nil {
		return err
	}
	c.done = true
	return nil
}
