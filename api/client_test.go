package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestNewClientAddresses(t *testing.T) {
	for addr, want := range map[string]string{
		"127.0.0.1:9778":          "http://127.0.0.1:9778",
		"http://127.0.0.1:9778/":  "http://127.0.0.1:9778",
		" https://hastate:9778 ":  "https://hastate:9778",
		"hastate.internal:9778":   "http://hastate.internal:9778",
		"ftp://x:1":               "",
		"http://":                 "",
		"127.0.0.1:9778/%zz/path": "",
	} {
		c, err := NewClient(addr, nil)
		switch {
		case want == "" && err == nil:
			t.Errorf("NewClient(%q) = %s, want an error", addr, c.Addr())
		case want != "" && (err != nil || c.Addr() != want):
			t.Errorf("NewClient(%q) = %v, %v; want %s", addr, c, err, want)
		}
	}
}

// A list cut at MaxLimit is an error, not data; an HTTP error carries the
// replica's message.
func TestClientFailsClosed(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/state":
			fmt.Fprintf(w, `{"servers":[],"total":%d,"truncated":true}`, MaxLimit+1)
		case "/v1/pollers":
			fmt.Fprint(w, `{"pollers":[],"total":1,"truncated":false}`)
		default:
			http.Error(w, "scope must be replica or cluster", http.StatusBadRequest)
		}
	}))
	defer srv.Close()
	c, err := NewClient(strings.TrimPrefix(srv.URL, "http://"), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := c.StateOf(ctx, Query{}, true); !errors.Is(err, ErrTruncated) {
		t.Errorf("State of a cut list: %v, want ErrTruncated", err)
	}
	if _, err := c.PollersOf(ctx, Query{}, true); err != nil {
		t.Errorf("Pollers: %v", err)
	}
	var se *StatusError
	if _, err := c.Cluster(ctx); !errors.As(err, &se) || se.Code != 400 || !strings.Contains(se.Body, "scope must be") {
		t.Errorf("Cluster on a 400: %v, want a StatusError with the body", err)
	}
}

// A row from a replica that predates Kind and Weight gets the kind its
// answer says, so that callers can decide on Kind alone.
func TestServerStateKindFromAnOlderReplica(t *testing.T) {
	for body, want := range map[string]ServerState{
		`{"answer":"drain"}`:                                {Kind: KindDrain},
		`{"answer":"maint"}`:                                {Kind: KindMaint},
		`{"answer":"ready 100%"}`:                           {Kind: KindReady, Weight: 100},
		`{"answer":"ready 0%"}`:                             {Kind: KindWeight, Weight: 0},
		`{"answer":"ready 40%","ramping":{"target":"w/a"}}`: {Kind: KindRamping, Weight: 40},
		`{"answer":"","withheld":true}`:                     {Kind: KindWithheld},
		`{"answer":"ready 0%","kind":"ramping","weight":0}`: {Kind: KindRamping, Weight: 0},
	} {
		var got ServerState
		if err := json.Unmarshal([]byte(body), &got); err != nil {
			t.Fatal(err)
		}
		if got.Kind != want.Kind || got.Weight != want.Weight {
			t.Errorf("%s: kind %q weight %d, want %q %d", body, got.Kind, got.Weight, want.Kind, want.Weight)
		}
		if in := got.InRotation(); in != (got.Weight > 0) {
			t.Errorf("%s: InRotation %v", body, in)
		}
	}
}
