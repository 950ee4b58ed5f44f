// Package ctltest holds the fixtures that the operator library's tests
// share: a cluster view to plan against, and fake replicas and a fake
// Consul served over loopback. It imports no package of the operator
// library, so that every one of them, internal tests included, can use it;
// each test builds its own client (fleet.NewReplica, write.NewWriter) on
// the addresses these return.
package ctltest

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/hastate/hastate/api"
)

// Fleet is a cluster view for planning tests: backends canary_web (web-1,
// web-2 polled; web-2 keeps 50% of its own), canary_api (api-1 polled, a
// drained wildcard), main_web (m-1, m-2 polled, m-3 known only by its key),
// and gke-cny-web in two backends.
func Fleet() *api.StateView {
	row := func(b, s, answer string, polled int, key string) api.ServerState {
		r := api.ServerState{Backend: b, Server: s, Answer: answer, Polled: polled, Told: polled, Source: "absent"}
		r.Kind, r.Weight = KindOf(answer)
		if key != "" {
			r.Key, r.Source, r.Desired = "state/"+b+"/"+key, "state/"+b+"/"+key, answer
		}
		return r
	}
	return &api.StateView{HoldsState: true, KV: api.KVStatus{KVView: api.KVView{Synced: true}}, Replicas: []api.ReplicaAnswer{{ID: "n1", Answered: true}, {ID: "n2", Answered: true}},
		Servers: []api.ServerState{
			row("canary_api", "*", "drain", 0, "*"),
			row("canary_api", "api-1", "drain", 2, "*"),
			row("canary_web", "web-1", "ready 100%", 2, ""),
			row("canary_web", "web-2", "ready 50%", 2, "web-2"),
			row("main_api", "gke-cny-web", "ready 100%", 2, ""),
			row("main_api", "x-us-east1-b", "ready 100%", 1, ""),
			row("main_api", "y-us-east1-c", "ready 100%", 1, ""),
			row("main_web", "gke-cny-web", "ready 100%", 2, ""),
			row("main_web", "m-1", "ready 100%", 2, ""),
			row("main_web", "m-2", "ready 100%", 2, ""),
			row("main_web", "m-3", "maint", 0, "m-3"),
		}}
}

// KindOf is the kind and weight a replica gives a row with answer (no ramp).
func KindOf(answer string) (api.Kind, int) {
	switch answer {
	case "drain":
		return api.KindDrain, 0
	case "maint":
		return api.KindMaint, 0
	case "ready 100%":
		return api.KindReady, 100
	}
	w, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(answer, "ready "), "%"))
	return api.KindWeight, w
}

// Identity is the Consul cluster that FakeConsul and the fake replicas
// name.
func Identity() api.ConsulIdentity {
	return api.ConsulIdentity{Datacenter: "dc1", Cluster: "127.0.0.1:8300"}
}

// FakeConsul is a Consul, at host:port, that answers every KV read with
// no keys at index, and names the cluster Identity.
func FakeConsul(t testing.TB, index int) string {
	t.Helper()
	id := Identity()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Consul-Index", strconv.Itoa(index))
		switch r.URL.Path {
		case "/v1/status/peers":
			_ = json.NewEncoder(w).Encode(strings.Split(id.Cluster, ","))
			return
		case "/v1/agent/self":
			_ = json.NewEncoder(w).Encode(map[string]any{"Config": map[string]string{"Datacenter": id.Datacenter}})
			return
		}
		w.WriteHeader(http.StatusNotFound)
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// Replica is a replica, at the returned URL, that reads prefix hastate/ of
// the Consul cluster id and has applied Consul index synced; its
// /v1/state is view(n) at its n-th read (from 0), its /v1/pollers is
// polls, as answered by two replicas.
func Replica(t testing.TB, id api.ConsulIdentity, synced uint64, polls []api.Poll, view func(n int) *api.StateView) string {
	t.Helper()
	var (
		mu sync.Mutex
		n  int
	)
	if polls == nil {
		polls = []api.Poll{}
	}
	replica := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/cluster":
			_ = json.NewEncoder(w).Encode(api.ClusterInfo{NodeID: "n1", State: "leader", LeaderID: "n1", KV: api.KVView{SyncedIndex: synced}, KVPrefix: "hastate/", Consul: &id})
		case "/v1/pollers":
			_ = json.NewEncoder(w).Encode(api.PollersView{Pollers: polls,
				Replicas: []api.ReplicaAnswer{{ID: "n1", Answered: true}, {ID: "n2", Answered: true}}})
		default:
			mu.Lock()
			v := view(n)
			n++
			mu.Unlock()
			_ = json.NewEncoder(w).Encode(v)
		}
	}))
	t.Cleanup(replica.Close)
	return replica.URL
}

// Gate is a fake Consul (host:port) whose prefix is at index 5, and a
// replica (URL) that has applied it and serves v as /v1/state.
func Gate(t testing.TB, v *api.StateView) (consulAddr, replicaURL string) {
	t.Helper()
	return FakeConsul(t, 5), Replica(t, Identity(), 5, nil, func(int) *api.StateView { return v })
}
