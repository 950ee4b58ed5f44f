package write

import (
	"context"
	"testing"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/fleet"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/internal/ctltest"
	"github.com/hastate/hastate/internal/testenv"
	"github.com/hastate/hastate/kvsync"
)

// realConsul starts a Consul and returns its KV and a Writer for prefix
// hastate/.
func realConsul(t *testing.T) (*consulapi.KV, Writer) {
	t.Helper()
	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	w, err := NewWriter(consul.Addr(), "hastate/")
	if err != nil {
		t.Fatal(err)
	}
	return consul.Client(t).KV(), w
}

// identityOf is the identity of the Consul w writes to, as a replica
// reports it.
func identityOf(t *testing.T, w Writer) api.ConsulIdentity {
	t.Helper()
	id, err := kvsync.ReadIdentity(context.Background(), w.Client)
	if err != nil {
		t.Fatal(err)
	}
	return api.ConsulIdentity{Datacenter: id.Datacenter, Cluster: id.Cluster}
}

// scriptedReplicaOf is a replica of the Consul cluster id that has applied
// Consul index synced, whose /v1/state is view(n) at its n-th read and
// whose /v1/pollers is polls.
func scriptedReplicaOf(t *testing.T, id api.ConsulIdentity, synced uint64, polls []api.Poll, view func(n int) *api.StateView) *fleet.Replica {
	t.Helper()
	return replicaAt(t, ctltest.Replica(t, id, synced, polls, view))
}

// pollsReplica is a replica at Consul index 5 that serves ctltest.Fleet()
// and polls.
func pollsReplica(t *testing.T, polls []api.Poll) *fleet.Replica {
	return scriptedReplicaOf(t, ctltest.Identity(), 5, polls, func(int) *api.StateView { return ctltest.Fleet() })
}

func replicaAt(t *testing.T, addr string) *fleet.Replica {
	t.Helper()
	r, err := fleet.NewReplica(addr)
	if err != nil {
		t.Fatal(err)
	}
	return r
}
