package fleet_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/fleet"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/internal/ctltest"
	"github.com/hastate/hastate/internal/testenv"
)

// fakeGate is a Consul whose prefix is at index 5 and a replica that has
// applied it and serves v as /v1/state.
func fakeGate(t *testing.T, v *api.StateView, sels []ctl.Selector) fleet.GateOptions {
	t.Helper()
	id := ctltest.Identity()
	replica := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/cluster" {
			_ = json.NewEncoder(w).Encode(api.ClusterInfo{NodeID: "n1", State: "leader", LeaderID: "n1", KV: api.KVView{SyncedIndex: 5}, KVPrefix: "hastate/", Consul: &id})
			return
		}
		_ = json.NewEncoder(w).Encode(v)
	}))
	t.Cleanup(replica.Close)
	addr := ctltest.FakeConsul(t, 5)
	return fleet.GateOptions{Consul: consulAt(t, addr), ConsulAddr: addr, Prefix: "hastate/", Replica: replicaAt(t, replica.URL), Selectors: sels}
}

// consulAt is a Consul client for host:port.
func consulAt(t *testing.T, addr string) *consulapi.Client {
	t.Helper()
	c, err := consulapi.NewClient(&consulapi.Config{Address: addr})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// fakeConsul is a client of ctltest.FakeConsul at index.
func fakeConsul(t *testing.T, index int) *consulapi.Client {
	return consulAt(t, ctltest.FakeConsul(t, index))
}

// scriptedReplica is a replica that has applied Consul index synced,
// whose /v1/state is view(n) at its n-th read (from 0) and whose
// /v1/pollers is polls.
func scriptedReplica(t *testing.T, synced uint64, polls []api.Poll, view func(n int) *api.StateView) *fleet.Replica {
	t.Helper()
	return replicaAt(t, ctltest.Replica(t, ctltest.Identity(), synced, polls, view))
}

// pollsReplica is a replica at Consul index 5 that serves ctltest.Fleet() and polls.
func pollsReplica(t *testing.T, polls []api.Poll) *fleet.Replica {
	return scriptedReplica(t, 5, polls, func(int) *api.StateView { return ctltest.Fleet() })
}

// realConsul starts a Consul and returns its KV, a client and its address.
func realConsul(t *testing.T) (*consulapi.KV, *consulapi.Client, string) {
	t.Helper()
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	c := consul.Client(t)
	return c.KV(), c, consul.Addr()
}

func replicaAt(t *testing.T, addr string) *fleet.Replica {
	t.Helper()
	r, err := fleet.NewReplica(addr)
	if err != nil {
		t.Fatal(err)
	}
	return r
}
