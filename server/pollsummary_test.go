package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/state"
)

// roundTrip sends a summary through its wire form, as a peer's answer
// travels over the raft port.
func roundTrip(t *testing.T, s PollSummary) PollSummary {
	t.Helper()
	raw, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var out PollSummary
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("%v: %s", err, raw)
	}
	return out
}

// oracleTold is what /v1/state counted before summaries: every replica's
// polls as api.Poll, merged by api.MergePolls, then, per server, the last
// answer of each HAProxy polling it ("": withheld) and what the withheld
// ones keep.
func oracleTold(polls []api.Poll, now time.Time) (map[state.Target]map[string]string, map[state.Target]map[string]int) {
	told, kept := map[state.Target]map[string]string{}, map[state.Target]map[string]int{}
	for _, p := range api.MergePolls(polls) {
		if !p.Polling(now) {
			continue
		}
		t := state.Target{Backend: p.Backend, Server: p.Server}
		if told[t] == nil {
			told[t] = map[string]string{}
		}
		answer := p.Answer
		if p.Withheld {
			answer = ""
			if p.Kept != "" {
				if kept[t] == nil {
					kept[t] = map[string]int{}
				}
				kept[t][p.Kept]++
			}
		}
		told[t][p.HAProxy] = answer
	}
	return told, kept
}

// Summaries of several replicas, merged, count what merging every poll
// counted: per server, each HAProxy once (union over the replicas, not a
// sum), told its latest answer, a withheld one keeping what another
// replica told it. Random tables, each replica's through the wire form.
func TestMergeSummariesAgreesWithMergePolls(t *testing.T) {
	now := time.Now().Truncate(time.Millisecond)
	answers := [][]byte{[]byte("ready 100%\n"), []byte("drain\n"), []byte("maint\n"), nil}
	for seed := range uint64(50) {
		rng := rand.New(rand.NewPCG(seed, 1))
		var all []api.Poll
		var sums []PollSummary
		for r := range 3 {
			p := newPollers(t, PollersOptions{})
			for range rng.IntN(300) {
				src := &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(10+rng.IntN(6)))}
				req := fmt.Appendf(nil, "b%d/s%d", rng.IntN(3), rng.IntN(4))
				// Ages across the TTL and the probe grace, in whole
				// milliseconds (the wire's resolution).
				at := now.Add(-time.Duration(rng.IntN(90_000)) * time.Millisecond)
				p.Record(src, req, answers[rng.IntN(len(answers))], at)
			}
			for _, pl := range p.List(time.Time{}) {
				pl.Replica = fmt.Sprint("r", r)
				all = append(all, pl)
			}
			sums = append(sums, roundTrip(t, p.Summary(time.Time{}, SummaryArg{})))
		}
		wantTold, wantKept := oracleTold(all, now)
		merged := MergeSummaries(sums)
		x := indexSummaries(sums, nil)
		for tgt, m := range merged {
			told, kept := toldOf(slices.Values(m), now.UnixMilli(), true)
			if len(wantTold[tgt]) == 0 && told.polled == 0 {
				continue
			}
			if fmt.Sprint(told.by) != fmt.Sprint(wantTold[tgt]) || told.polled != len(wantTold[tgt]) {
				t.Fatalf("seed %d: %v told %v (polled %d), merging every poll: %v", seed, tgt, told.by, told.polled, wantTold[tgt])
			}
			if fmt.Sprint(kept) != fmt.Sprint(wantKept[tgt]) && !(len(kept) == 0 && len(wantKept[tgt]) == 0) {
				t.Fatalf("seed %d: %v keeps %v, merging every poll: %v", seed, tgt, kept, wantKept[tgt])
			}
			// The counts /v1/state takes (without the answers by
			// HAProxy) agree, by index or not.
			fast, fastKept := x.told(x.find(tgt), now.UnixMilli())
			if fast.polled != told.polled || fmt.Sprint(fast.answers) != fmt.Sprint(told.answers) || fmt.Sprint(fastKept) != fmt.Sprint(kept) {
				t.Fatalf("seed %d: %v counted %d %v keeping %v, merged %d %v keeping %v", seed, tgt, fast.polled, fast.answers, fastKept, told.polled, told.answers, kept)
			}
		}
		// One replica's summary alone: the counts by index agree
		// with the counts over its polls.
		for _, one := range sums {
			x := indexSummaries([]PollSummary{one}, nil)
			for i := range x.list {
				tgt := x.list[i].t
				told, kept := toldOf(x.seq(&x.list[i]), now.UnixMilli(), false)
				fast, fastKept := x.told(&x.list[i], now.UnixMilli())
				if fast.polled != told.polled || fmt.Sprint(fast.answers) != fmt.Sprint(told.answers) || fmt.Sprint(fastKept) != fmt.Sprint(kept) {
					t.Fatalf("seed %d: %v alone counted %d %v keeping %v, over its polls %d %v keeping %v", seed, tgt, fast.polled, fast.answers, fastKept, told.polled, told.answers, kept)
				}
			}
		}
		for tgt, w := range wantTold {
			if _, ok := merged[tgt]; !ok && len(w) > 0 {
				t.Fatalf("seed %d: %v missing from the merged summaries", seed, tgt)
			}
		}
	}
}

// An HAProxy that polled one server through two replicas (a load
// balancer's failover) counts once, told the answer of its latest poll.
func TestMergeSummariesOneSourceThroughTwoReplicas(t *testing.T) {
	now := time.Now().Truncate(time.Millisecond)
	src := &net.TCPAddr{IP: net.ParseIP("127.0.0.10")}
	a, b := newPollers(t, PollersOptions{}), newPollers(t, PollersOptions{})
	for i := range 2 {
		a.Record(src, []byte("web/a"), []byte("ready 100%\n"), now.Add(time.Duration(i-10)*time.Second))
	}
	b.Record(src, []byte("web/a"), []byte("drain\n"), now.Add(-time.Second))
	merged := MergeSummaries([]PollSummary{roundTrip(t, a.Summary(time.Time{}, SummaryArg{})), roundTrip(t, b.Summary(time.Time{}, SummaryArg{}))})
	told, _ := toldOf(slices.Values(merged[state.Target{Backend: "web", Server: "a"}]), now.UnixMilli(), true)
	if told.polled != 1 || told.told("drain") != 1 || told.told("ready 100%") != 0 {
		t.Fatalf("told %+v, want one HAProxy told drain", told)
	}
}

// Summary selects, starts after the cursor, and cuts at whole servers,
// naming the last server of a cut answer; following Next reads every
// poll once.
func TestSummaryChunksAtWholeServers(t *testing.T) {
	now := time.Now()
	p := newPollers(t, PollersOptions{})
	for s := range 5 {
		for src := range 3 {
			p.Record(&net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(10+src))}, fmt.Appendf(nil, "web/s%d", s), []byte("ready 100%\n"), now)
		}
	}
	p.Record(&net.TCPAddr{IP: net.IPv4(127, 0, 0, 10)}, []byte("api/x"), []byte("drain\n"), now)

	q := SummaryArg{Selectors: []string{"web"}, Limit: 4}
	var servers []string
	for range 10 {
		s := roundTrip(t, p.Summary(time.Time{}, q))
		if len(s.Servers) == 0 {
			t.Fatal("an answer with no server")
		}
		n := 0
		for _, sv := range s.Servers {
			servers = append(servers, sv.Backend+"/"+sv.Server)
			n += len(sv.Polls)
			if len(sv.Polls) != 3 {
				t.Fatalf("%s/%s: %d polls, want all 3", sv.Backend, sv.Server, len(sv.Polls))
			}
		}
		if n > 4 && len(s.Servers) > 1 {
			t.Fatalf("%d polls in an answer limited to 4", n)
		}
		if s.Next == "" {
			break
		}
		if s.Next != servers[len(servers)-1] {
			t.Fatalf("next %q, last server %q", s.Next, servers[len(servers)-1])
		}
		q.After = s.Next
	}
	if want := []string{"web/s0", "web/s1", "web/s2", "web/s3", "web/s4"}; !slices.Equal(servers, want) {
		t.Fatalf("servers %v, want %v", servers, want)
	}
}

// A malformed or out-of-table answer is an error, not a poll.
func TestPollSummaryRejectsBadWire(t *testing.T) {
	for _, raw := range []string{
		`{"at_unix_ms":1,"sources":["127.0.0.1"],"answers":[""],"servers":[{"backend":"b","server":"s","polls":"BQ=="}]}`,     // a truncated poll
		`{"at_unix_ms":1,"sources":["127.0.0.1"],"answers":[""],"servers":[{"backend":"b","server":"s","polls":"BQAAAgA="}]}`, // source 5 of 1
		`{"at_unix_ms":1,"sources":["127.0.0.1"],"answers":[""],"servers":[{"backend":"b","server":"s","polls":"AAcAAgA="}]}`, // answer 7 of 1
	} {
		var s PollSummary
		if err := json.Unmarshal([]byte(raw), &s); err == nil {
			t.Errorf("%s: decoded %+v, want an error", raw, s)
		}
	}
}

// The summary a peer answers holds no pointer per poll and, at fleet
// size, a few bytes a poll on the wire.
func TestPollSummaryWireSize(t *testing.T) {
	p := newPollers(t, PollersOptions{})
	now := time.Now()
	for s := range 200 {
		for src := range 100 {
			p.Record(&net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(10+src))}, fmt.Appendf(nil, "fs%03d/srv%02d", s/10, s%10), []byte("ready 100%\n"), now)
		}
	}
	raw, err := json.Marshal(p.Summary(time.Time{}, SummaryArg{}))
	if err != nil {
		t.Fatal(err)
	}
	if per := float64(len(raw)) / 20_000; per > 12 {
		t.Errorf("%.1f bytes a poll on the wire, want at most 12", per)
	}
	if polls := len(roundTrip(t, p.Summary(time.Time{}, SummaryArg{})).Servers); polls != 200 {
		t.Errorf("%d servers after the round trip, want 200", polls)
	}
}

// A summary writes its own answer line for the raft port
// (AppendJSONLine), which writes it without encoding/json's pass over it:
// one line of compact JSON, HTML characters escaped as json.Encoder
// escapes them, that reads back as the summary (its polls, or its
// counts). Server names and answers with HTML and non-ASCII characters.
func TestPollSummaryAnswerLine(t *testing.T) {
	p := newPollers(t, PollersOptions{})
	now := time.Now()
	for s := range 30 {
		for src := range 5 + s%3 {
			req := fmt.Appendf(nil, "b<%d>&é/s%d", s%4, s)
			line := []byte("ready 100%\n")
			if s%5 == 0 {
				line = []byte("drain <&>\n")
			}
			p.Record(&net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(10+src))}, req, line, now)
			p.Record(&net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(10+src))}, req, line, now)
		}
	}
	for _, q := range []SummaryArg{{}, {Counts: true}} {
		sum := p.Summary(time.Time{}, q)
		line := sum.AppendJSONLine([]byte("x"))
		if !bytes.HasPrefix(line, []byte("x")) || !bytes.HasSuffix(line, []byte("\n")) {
			t.Fatalf("counts %v: %q is not appended as one line", q.Counts, line)
		}
		body := line[1 : len(line)-1]
		var compact, escaped bytes.Buffer
		if err := json.Compact(&compact, body); err != nil || bytes.IndexByte(body, '\n') >= 0 {
			t.Fatalf("counts %v: not one line of JSON (%v): %s", q.Counts, err, body)
		}
		json.HTMLEscape(&escaped, body)
		if !bytes.Equal(compact.Bytes(), body) || !bytes.Equal(escaped.Bytes(), body) {
			t.Fatalf("counts %v: not compact, HTML escaped JSON as json.Encoder writes it: %s", q.Counts, body)
		}
		var back PollSummary
		if err := json.Unmarshal(body, &back); err != nil {
			t.Fatal(err)
		}
		want := roundTrip(t, sum)
		text := func(s PollSummary) string {
			if q.Counts {
				return describeCounts(s)
			}
			return fmt.Sprint(s.Sources, s.Answers, s.Servers)
		}
		if len(back.Servers) != 30 || text(back) != text(want) {
			t.Fatalf("counts %v: the line reads back as\n%+v\nwant\n%+v", q.Counts, back, want)
		}
	}
}

// What /v1/state counts from its own table read in place and its peers'
// counts (SummaryArg.Counts, through the wire form), with the polls of
// the servers a source polled through two replicas asked again by exact
// selectors (overlaps, detail), agrees with merging every poll: polled,
// told, kept and whether an HAProxy polls it, for every server. Random
// tables whose replicas see the same sources (most servers overlap), or
// each its own (none does); server names with glob characters.
func TestViewCountsAgreeWithMergePolls(t *testing.T) {
	now := time.Now().Truncate(time.Millisecond)
	since := now.Add(-time.Hour)
	answers := [][]byte{[]byte("ready 100%\n"), []byte("ready 50%\n"), []byte("drain\n"), nil}
	backends := []string{"b0", "b[1]", "b*2"}
	overlapped := 0
	for seed := range uint64(60) {
		rng := rand.New(rand.NewPCG(seed, 2))
		apart := seed%3 == 0 // each replica polled by its own sources
		var all []api.Poll
		var full []PollSummary // every replica's polls: the merged path
		reps := make([]*Pollers, 3)
		for r := range reps {
			p := newPollers(t, PollersOptions{})
			reps[r] = p
			for range rng.IntN(300) {
				src := byte(10 + rng.IntN(6))
				if apart {
					src += byte(6 * r)
				}
				req := fmt.Appendf(nil, "%s/s%d", backends[rng.IntN(len(backends))], rng.IntN(4))
				at := now.Add(-time.Duration(rng.IntN(90_000)) * time.Millisecond)
				p.Record(&net.TCPAddr{IP: net.IPv4(127, 0, 0, src)}, req, answers[rng.IntN(len(answers))], at)
			}
			for _, pl := range p.List(since) {
				pl.Replica = fmt.Sprint("r", r)
				all = append(all, pl)
			}
			full = append(full, roundTrip(t, p.Summary(since, SummaryArg{})))
		}
		// Replica 0 answers /v1/state: its own table in place, its
		// peers' counts, then the polls of what overlaps.
		var sums []PollSummary
		for _, p := range reps[1:] {
			sums = append(sums, roundTrip(t, p.summary(since, now.UnixMilli(), SummaryArg{Counts: true})))
		}
		x := indexSummaries(sums, reps[0].own(since, now.UnixMilli(), api.Filter{}))
		over := x.overlaps()
		if apart && len(over) > 0 {
			t.Fatalf("seed %d: replicas polled by different sources, yet %v overlap", seed, over)
		}
		overlapped += len(over)
		if len(over) > 0 {
			sels := exactSelectors(over)
			var detail []PollSummary
			for _, p := range reps[1:] {
				detail = append(detail, roundTrip(t, p.Summary(since, SummaryArg{Selectors: sels})))
			}
			for _, d := range detail {
				for _, sv := range d.Servers {
					if !slices.Contains(over, state.Target{Backend: sv.Backend, Server: sv.Server}) {
						t.Fatalf("seed %d: selectors %q selected %s/%s too", seed, sels, sv.Backend, sv.Server)
					}
				}
			}
			x.detail(over, detail)
		}
		merged := indexSummaries(full, nil)
		wantTold, wantKept := oracleTold(all, now)
		if len(x.list) != len(merged.list) {
			t.Fatalf("seed %d: %d servers seen, merging every poll %d", seed, len(x.list), len(merged.list))
		}
		for i := range x.list {
			e := &x.list[i]
			tgt := e.t
			if m := merged.find(tgt); m == nil || m != &merged.list[i] {
				t.Fatalf("seed %d: %v seen at %d, not so merging every poll", seed, tgt, i)
			}
			told, kept := x.told(e, now.UnixMilli())
			want := map[string]int{}
			for _, a := range wantTold[tgt] {
				want[a]++
			}
			if told.polled != len(wantTold[tgt]) || fmt.Sprint(told.answers) != fmt.Sprint(want) {
				t.Fatalf("seed %d: %v polled %d told %v, merging every poll %d %v", seed, tgt, told.polled, told.answers, len(wantTold[tgt]), want)
			}
			if fmt.Sprint(kept) != fmt.Sprint(wantKept[tgt]) && !(len(kept) == 0 && len(wantKept[tgt]) == 0) {
				t.Fatalf("seed %d: %v keeps %v, merging every poll %v (overlap %v, refs %v, own %v, apart %v)", seed, tgt, kept, wantKept[tgt], slices.Contains(over, tgt), x.places(e), e.sp != nil, x.apart(e))
			}
			if got, want := x.fromHAProxy(e, now.UnixMilli()), merged.fromHAProxy(&merged.list[i], now.UnixMilli()); got != want {
				t.Fatalf("seed %d: %v from HAProxy %v, merging every poll %v", seed, tgt, got, want)
			}
		}
	}
	if overlapped == 0 {
		t.Fatal("no server overlapped: the detail path was not tested")
	}
}

// Exact selectors select the name they were made of, glob characters
// and all, and nothing else; too many names for one peer query are none
// (every server is asked for instead).
func TestExactSelectors(t *testing.T) {
	ts := []state.Target{{Backend: "b*", Server: "s?1"}, {Backend: `b\[x]`, Server: "s"}}
	f, err := api.ParseFilter(exactSelectors(ts))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		b, s string
		want bool
	}{{"b*", "s?1", true}, {"bx", "s?1", false}, {"b*", "sa1", false}, {`b\[x]`, "s", true}, {`b\x`, "s", false}, {"b[x]", "s", false}} {
		if got := f.Match(c.b, c.s); got != c.want {
			t.Errorf("%s/%s matched %v, want %v", c.b, c.s, got, c.want)
		}
	}
	many := make([]state.Target, 5000)
	for i := range many {
		many[i] = state.Target{Backend: "backend", Server: fmt.Sprintf("server-%05d", i)}
	}
	if sels := exactSelectors(many); sels != nil {
		t.Errorf("%d selectors for 5,000 servers, want none (too long for a peer query)", len(sels))
	}
}

// A malformed server's counts, or a source set out of the table, are an
// error.
func TestPollSummaryRejectsBadCounts(t *testing.T) {
	for _, raw := range []string{
		`{"at_unix_ms":1,"sources":["127.0.0.1"],"answers":[""],"source_sets":[[0]],"servers":[{"backend":"b","server":"s","polls":null,"counts":"AAE="}]}`,         // cut short
		`{"at_unix_ms":1,"sources":["127.0.0.1"],"answers":[""],"source_sets":[[0]],"servers":[{"backend":"b","server":"s","polls":null,"counts":"AQEAAAA="}]}`,     // set 1 of 1
		`{"at_unix_ms":1,"sources":["127.0.0.1"],"answers":[""],"source_sets":[[3]],"servers":[{"backend":"b","server":"s","polls":null,"counts":"AAEAAAA="}]}`,     // source 3 of 1
		`{"at_unix_ms":1,"sources":["127.0.0.1"],"answers":[""],"source_sets":[[0]],"servers":[{"backend":"b","server":"s","polls":null,"counts":"AAEAAQUBAA=="}]}`, // answer 5 of 1
	} {
		var s PollSummary
		if err := json.Unmarshal([]byte(raw), &s); err == nil {
			t.Errorf("%s: decoded %+v, want an error", raw, s)
		}
	}
	// The same with every index in its table decodes.
	var s PollSummary
	ok := `{"at_unix_ms":1,"sources":["127.0.0.1"],"answers":[""],"source_sets":[[0]],"servers":[{"backend":"b","server":"s","polls":null,"counts":"AAEAAQABAA=="}]}`
	if err := json.Unmarshal([]byte(ok), &s); err != nil || s.Servers[0].Counts == nil || s.Servers[0].Counts.Polled != 1 {
		t.Errorf("%s: %+v, %v", ok, s, err)
	}
}

// Counts cost bytes a server (its name, mostly), not a poll: at 100
// sources a server a peer's answer is a fraction of its polls'.
func TestPollSummaryCountsWireSize(t *testing.T) {
	p := newPollers(t, PollersOptions{})
	now := time.Now()
	for s := range 200 {
		for src := range 100 {
			for range 2 {
				p.Record(&net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(10+src))}, fmt.Appendf(nil, "fs%03d/srv%02d", s/10, s%10), []byte("ready 100%\n"), now)
			}
		}
	}
	polls, err := json.Marshal(p.Summary(time.Time{}, SummaryArg{}))
	if err != nil {
		t.Fatal(err)
	}
	counts, err := json.Marshal(p.Summary(time.Time{}, SummaryArg{Counts: true}))
	if err != nil {
		t.Fatal(err)
	}
	if per := len(counts) / 200; per > 100 || len(counts)*5 > len(polls) {
		t.Errorf("counts %d bytes (%d a server), polls %d: want at most 100 a server, a fifth of the polls'", len(counts), per, len(polls))
	}
	s := roundTrip(t, p.Summary(time.Time{}, SummaryArg{Counts: true}))
	if len(s.Servers) != 200 || len(s.SourceSets) != 1 || s.Servers[0].Counts.Polled != 100 || !s.Servers[0].Counts.FromHAProxy {
		t.Errorf("counts of 200 servers polled by the same 100 sources: %d servers, %d source sets, %+v", len(s.Servers), len(s.SourceSets), s.Servers[0].Counts)
	}
}
