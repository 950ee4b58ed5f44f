//go:build !race

// The race detector makes sync.Pool drop items at random, so allocation
// counts are only meaningful without it; `make test` runs this file in a
// pass without -race.

package server

import (
	"testing"
	"time"
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
				s.serveConn(c, time.Now())
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
