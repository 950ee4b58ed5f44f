package server

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/hastate/hastate/api"
)

// fakeAdopter answers AdoptConsul with its function.
type fakeAdopter struct {
	adopt func(confirm string) (api.AdoptResult, error)
}

var _ Adopter = (*fakeAdopter)(nil)

func (f *fakeAdopter) AdoptConsul(_ context.Context, confirm string) (api.AdoptResult, error) {
	return f.adopt(confirm)
}

func TestAdoptEndpoint(t *testing.T) {
	var got string
	ad := &fakeAdopter{adopt: func(confirm string) (api.AdoptResult, error) {
		got = confirm
		switch confirm {
		case "follower":
			return api.AdoptResult{}, &api.AdoptError{Code: http.StatusConflict, LeaderID: "n2", Message: "not the raft leader"}
		case "other":
			return api.AdoptResult{}, &api.AdoptError{Code: http.StatusUnprocessableEntity, Message: "this leader's Consul is another"}
		}
		return api.AdoptResult{Adopted: api.MirrorSource{ClusterID: confirm, Prefix: "hastate/"}, Leader: "n1"}, nil
	}}
	srv := httptest.NewServer(NewHTTPHandler(HTTPOptions{Replica: &fakeReplica{}, Adopter: ad}))
	t.Cleanup(srv.Close)
	c, err := api.NewClient(srv.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.AdoptConsul(t.Context(), "bbbb")
	if err != nil || res.Adopted.ClusterID != "bbbb" || res.Leader != "n1" || got != "bbbb" {
		t.Fatalf("adopt: %+v %v (asked %q)", res, err, got)
	}
	for confirm, code := range map[string]int{"follower": http.StatusConflict, "other": http.StatusUnprocessableEntity} {
		_, err := c.AdoptConsul(t.Context(), confirm)
		ae, ok := err.(*api.AdoptError)
		if !ok || ae.Code != code {
			t.Errorf("adopt %q: %v, want an AdoptError %d", confirm, err, code)
		}
	}
	// A body without a cluster is refused before the Adopter is asked.
	got = ""
	resp, err := http.Post(srv.URL+"/v1/consul/adopt", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || got != "" {
		t.Errorf("adopt without a cluster: HTTP %d, adopter asked %q", resp.StatusCode, got)
	}
	// GET is not an adoption; without an Adopter there is no endpoint.
	if code, _ := get(t, NewHTTPHandler(HTTPOptions{Replica: &fakeReplica{}}), "/v1/consul/adopt"); code != http.StatusNotFound && code != http.StatusMethodNotAllowed {
		t.Errorf("no Adopter: GET /v1/consul/adopt = %d", code)
	}
}
