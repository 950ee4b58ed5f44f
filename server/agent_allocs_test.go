//go:build !race

// The race detector makes sync.Pool drop items at random, so allocation
// counts are only meaningful without it; `make test` runs this file in a
// pass without -race.

package server

import (
	"testing"
	"time"

	"github.com/hastate/hastate/state"
)

// TestAgentServeConnAllocs: serving a probe allocates nothing beyond what
// the connection itself needs.
func TestAgentServeConnAllocs(t *testing.T) {
	s := newTestServer(t, AgentOptions{Source: staticSource(t, testKV)})
	for _, tc := range handlerCases() {
		t.Run(tc.name, func(t *testing.T) {
			c := newFakeConn(tc.script...)
			allocs := testing.AllocsPerRun(1000, func() {
				c.reset()
				s.serveConn(c, time.Now(), nil)
			})
			if allocs != 0 {
				t.Errorf("serveConn allocates %v times per probe, want 0", allocs)
			}
			if string(c.written) != tc.want {
				t.Errorf("answer %q, want %q", c.written, tc.want)
			}
		})
	}
}

// TestAgentServeConnWithArrivalAllocs: answering from an ArrivalSource
// (the arrival taken at accept, handed back once the request is read)
// allocates nothing either.
func TestAgentServeConnWithArrivalAllocs(t *testing.T) {
	src := fixedArrival{snap: buildSnapshot(t, testKV), arrival: new(int)}
	s := newTestServer(t, AgentOptions{Source: src})
	c := newFakeConn(fakeRead{data: "web/a\n"})
	allocs := testing.AllocsPerRun(1000, func() {
		c.reset()
		s.serveConn(c, time.Now(), s.arrivals.Arrived())
	})
	if allocs != 0 {
		t.Errorf("serveConn with an arrival allocates %v times per probe, want 0", allocs)
	}
	if string(c.written) != "drain\n" {
		t.Errorf("answer %q, want %q", c.written, "drain\n")
	}
}

// fixedArrival is an ArrivalSource that allocates nothing: one arrival
// for every probe.
type fixedArrival struct {
	snap    *state.Snapshot
	arrival *int
}

func (f fixedArrival) Arrived() any                      { return f.arrival }
func (f fixedArrival) Snapshot() *state.Snapshot         { return f.snap }
func (f fixedArrival) SnapshotSince(any) *state.Snapshot { return f.snap }
