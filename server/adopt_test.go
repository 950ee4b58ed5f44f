package server

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/hastate/hastate/api"
)

// TestAdoptOverHTTPIsGone (issue 43): no HTTP request adopts a Consul;
// POST /v1/consul/adopt, as hastate adopt-consul sent it before issue 43,
// answers 410 with what to do instead, and the replica has no way to
// adopt from it (HTTPOptions holds no adopter).
func TestAdoptOverHTTPIsGone(t *testing.T) {
	srv := httptest.NewServer(NewHTTPHandler(HTTPOptions{Replica: &fakeReplica{}}))
	t.Cleanup(srv.Close)
	resp, err := http.Post(srv.URL+"/v1/consul/adopt", "application/json", strings.NewReader(`{"cluster":"bbbb"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var ae api.AdoptError
	if err := json.NewDecoder(resp.Body).Decode(&ae); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusGone || !strings.HasPrefix(ae.Message, "nothing adopted") || !strings.Contains(ae.Message, "hastate adopt-consul") {
		t.Errorf("POST /v1/consul/adopt: HTTP %d %q, want 410 naming the marker command", resp.StatusCode, ae.Message)
	}
}
