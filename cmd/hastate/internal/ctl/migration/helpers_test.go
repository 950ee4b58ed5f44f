package migration

import (
	"testing"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/fleet"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/internal/ctltest"
)

// fakeGate is a Consul whose prefix is at index 5 and a replica that has
// applied it and serves v as /v1/state.
func fakeGate(t *testing.T, v *api.StateView, sels []ctl.Selector) fleet.GateOptions {
	t.Helper()
	consulAddr, replicaURL := ctltest.Gate(t, v)
	c, err := consulapi.NewClient(&consulapi.Config{Address: consulAddr})
	if err != nil {
		t.Fatal(err)
	}
	r, err := fleet.NewReplica(replicaURL)
	if err != nil {
		t.Fatal(err)
	}
	return fleet.GateOptions{Consul: c, ConsulAddr: consulAddr, Prefix: "hastate/", Replica: r, Selectors: sels}
}
