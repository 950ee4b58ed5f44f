package server

import (
	"fmt"
	"net"
	"testing"
	"time"
)

// BenchmarkPollTableReads: what a replica holding 1,000,000 pairs (100
// sources x 10,000 servers, each polled twice) spends on the reads its
// peers make of its whole table, beside its agent: a poll-summary of
// counts of every server (what a peer's /v1/state, `status -o json` and
// the status page ask it), and its sightings (what the leader gathers
// from every replica each HAProxySyncEvery). The table does not change
// between reads, as in steady state, where each HAProxy's every check
// refreshes a poll with the answer it was told.
//
//	go test -run '^$' -bench PollTableReads ./server/
func BenchmarkPollTableReads(b *testing.B) {
	p, err := NewPollers(PollersOptions{Max: 1_100_000})
	if err != nil {
		b.Fatal(err)
	}
	const sources, servers = 100, 10_000
	addrs := make([]net.TCPAddr, sources)
	for s := range addrs {
		addrs[s] = net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(10+s)), Port: 40000}
	}
	now := time.Now()
	line := []byte("ready 100%\n")
	for i := range servers {
		req := fmt.Appendf(nil, "fs%03d/srv%02d", i/10, i%10)
		for s := range addrs {
			p.Record(&addrs[s], req, line, now)
			p.Record(&addrs[s], req, line, now)
		}
	}
	b.Run("summary-counts", func(b *testing.B) {
		for b.Loop() {
			if s := p.Summary(time.Now().Add(-PollerWindow), SummaryArg{Counts: true}); len(s.Servers) != servers || s.Servers[0].Counts.Polled != sources {
				b.Fatalf("%d servers, the first polled by %d, want %d and %d", len(s.Servers), s.Servers[0].Counts.Polled, servers, sources)
			}
		}
	})
	b.Run("sightings", func(b *testing.B) {
		for b.Loop() {
			if n := len(p.Sightings(time.Now().Add(-PollerWindow), time.Now())); n != sources {
				b.Fatalf("%d sources seen, want %d", n, sources)
			}
		}
	})
}
