package server

import (
	"bytes"
	"encoding/json"
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
	const sources, servers = 100, 10_000
	p := benchTable(b, servers, sources)
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

// summaryBenchCases are the answers BenchmarkPollSummaryEncode and
// BenchmarkPollSummaryDecode write and read.
func summaryBenchCases() []summaryBenchCase {
	return []summaryBenchCase{{"counts-1M", 10_000, 100, true}, {"polls-250k", 2_500, 100, false}}
}

type summaryBenchCase struct {
	name             string
	servers, sources int
	counts           bool
}

// BenchmarkPollSummaryEncode: what the replica holding the table spends
// writing its answer line to a peer's poll-summary, by encoding/json
// (marshalAt, how every answer was written before) and by hand
// (appendJSONLineAt, the same bytes). counts-1M and polls-250k as in
// BenchmarkPollSummaryDecode.
//
//	go test -run '^$' -bench PollSummaryEncode -benchmem ./server/
func BenchmarkPollSummaryEncode(b *testing.B) {
	for _, c := range summaryBenchCases() {
		s := benchSummary(b, c.servers, c.sources, c.counts)
		at := time.Now().UnixMilli()
		b.Run(c.name+"/encoding-json", func(b *testing.B) {
			for b.Loop() {
				if _, err := s.marshalAt(at); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(c.name+"/by-hand", func(b *testing.B) {
			for b.Loop() {
				_ = s.appendJSONLineAt(nil, at)
			}
		})
	}
}

// benchTable is a table of servers x sources pairs, each polled twice
// now, the same answer ("ready 100%").
func benchTable(tb testing.TB, servers, sources int) *Pollers {
	p, err := NewPollers(PollersOptions{Max: servers*sources + 100_000})
	if err != nil {
		tb.Fatal(err)
	}
	addrs := make([]net.TCPAddr, sources)
	for s := range addrs {
		addrs[s] = net.TCPAddr{IP: net.IPv4(127, 0, byte(s/250), byte(10+s%250)), Port: 40000}
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
	return p
}

// benchSummary is benchTable's summary of every server: its polls, or
// their counts.
func benchSummary(tb testing.TB, servers, sources int, counts bool) PollSummary {
	return benchTable(tb, servers, sources).Summary(time.Now().Add(-PollerWindow), SummaryArg{Counts: counts})
}

// oldSummary is a PollSummary decoded as before the one-pass reading:
// by encoding/json alone.
type oldSummary struct{ PollSummary }

func (s *oldSummary) UnmarshalJSON(b []byte) error { return s.unmarshalJSON(b) }

// BenchmarkPollSummaryDecode: what the asker of a peer's poll-summary
// spends decoding its answer line, before (encoding/json: the raft
// port's json.Decoder into a json.RawMessage, json.Unmarshal of it into
// a *PollSummary, and UnmarshalJSON's json.Unmarshal into the wire form)
// and now (PollSummary.DecodeJSONLine on the line as read). counts-1M is
// an answer of counts of 1,000,000 pairs (10,000 servers, 100 sources
// each: BenchmarkFleetOperator's), polls-250k one of polls, a chunk
// (peerSummaryChunk) of 2,500 servers' 250,000 polls.
//
//	go test -run '^$' -bench PollSummaryDecode -benchmem ./server/
func BenchmarkPollSummaryDecode(b *testing.B) {
	for _, c := range summaryBenchCases() {
		s := benchSummary(b, c.servers, c.sources, c.counts)
		line := s.AppendJSONLine(nil)
		check := func(b *testing.B, got PollSummary) {
			if len(got.Servers) != c.servers {
				b.Fatalf("%d servers decoded, want %d", len(got.Servers), c.servers)
			}
		}
		b.Run(c.name+"/encoding-json", func(b *testing.B) {
			b.SetBytes(int64(len(line)))
			for b.Loop() {
				var raw json.RawMessage
				if err := json.NewDecoder(bytes.NewReader(line)).Decode(&raw); err != nil {
					b.Fatal(err)
				}
				var ans *oldSummary
				if err := json.Unmarshal(raw, &ans); err != nil {
					b.Fatal(err)
				}
				check(b, ans.PollSummary)
			}
		})
		b.Run(c.name+"/one-pass", func(b *testing.B) {
			b.SetBytes(int64(len(line)))
			for b.Loop() {
				var got PollSummary
				if !got.DecodeJSONLine(line) {
					b.Fatal("the fast path refused MarshalJSON's form")
				}
				check(b, got)
			}
		})
	}
}
