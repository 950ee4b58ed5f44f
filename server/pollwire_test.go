package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
)

// randomSummary is a PollSummary of random servers, polls or counts (or
// a mix), names drawn from pieces some of which JSON escapes.
func randomSummary(r *rand.Rand) PollSummary {
	pieces := []string{"web", "fs001", "srv-2", "10.0.0.1:80", "é", "日本", "<b>", "a&b", `"q"`, `back\slash`, "\t", "\u2028", "ready 100%", "drain", ""}
	name := func() string {
		var b strings.Builder
		for range r.IntN(3) {
			b.WriteString(pieces[r.IntN(len(pieces))])
		}
		return b.String()
	}
	plain := r.IntN(2) == 0 // no piece that JSON escapes: the fast path's own
	if plain {
		pieces = []string{"web", "fs001", "srv-2", "10.0.0.1:80", "é", "日本", "ready 100%", "drain", ""}
	}
	s := PollSummary{Answers: []string{""}}
	if r.IntN(8) > 0 {
		s.Sources = []string{}
		for range r.IntN(20) {
			s.Sources = append(s.Sources, name())
		}
	}
	for range r.IntN(6) {
		s.Answers = append(s.Answers, name())
	}
	if len(s.Sources) > 0 && r.IntN(2) == 0 {
		for range 1 + r.IntN(4) {
			var set []int32
			if r.IntN(6) > 0 {
				set = []int32{}
				for range r.IntN(len(s.Sources) + 1) {
					set = append(set, int32(r.IntN(len(s.Sources))))
				}
			}
			s.SourceSets = append(s.SourceSets, set)
		}
	}
	if r.IntN(3) == 0 {
		s.Next = name()
	}
	s.Servers = []ServerPolls{}
	for range r.IntN(30) {
		sv := ServerPolls{Backend: name(), Server: name()}
		if len(s.SourceSets) > 0 && r.IntN(2) == 0 {
			c := &ServerCounts{Sources: int32(r.IntN(len(s.SourceSets))), Polled: r.Int32N(1 << 20), FromHAProxy: r.IntN(2) == 0}
			for _, l := range []*[]AnswerCount{&c.Told, &c.Kept} {
				for range r.IntN(len(s.Answers) + 1) {
					*l = append(*l, AnswerCount{Answer: int32(r.IntN(len(s.Answers))), N: r.Int32N(1 << 30)})
				}
			}
			sv.Counts = c
		} else if len(s.Sources) > 0 {
			for range r.IntN(12) {
				sv.Polls = append(sv.Polls, SourcePoll{Source: int32(r.IntN(len(s.Sources))), Answer: int32(r.IntN(len(s.Answers))),
					Kept: int32(r.IntN(len(s.Answers))), Count: uint32(r.IntN(3)), LastMs: 1_700_000_000_000 + r.Int64N(1<<40)})
			}
		}
		s.Servers = append(s.Servers, sv)
	}
	return s
}

// stdDecode is the summary's decoding by encoding/json alone, as before
// the fast path: the reference.
func stdDecode(raw []byte) (PollSummary, error) {
	var s PollSummary
	err := s.unmarshalJSON(raw)
	return s, err
}

// decodeBoth decodes raw by the fast path, then by UnmarshalJSON (fast
// or fallen back), and checks both against encoding/json's; fast reports
// whether the fast path read it.
func decodeBoth(t *testing.T, raw []byte) (fast bool) {
	t.Helper()
	want, werr := stdDecode(raw)
	var got PollSummary
	fast = got.DecodeJSONLine(raw)
	if fast && (werr != nil || !reflect.DeepEqual(got, want)) {
		t.Fatalf("fast path %+v, encoding/json %+v (%v): %s", got, want, werr, raw)
	}
	if !fast && !reflect.DeepEqual(got, PollSummary{}) {
		t.Fatalf("fast path refused but changed the summary: %+v", got)
	}
	var un PollSummary
	err := json.Unmarshal(raw, &un)
	if (err == nil) != (werr == nil) || (err != nil && err.Error() != werr.Error()) {
		t.Fatalf("UnmarshalJSON: %v, encoding/json: %v: %s", err, werr, raw)
	}
	if err == nil && !reflect.DeepEqual(un, want) {
		t.Fatalf("UnmarshalJSON %+v, encoding/json %+v: %s", un, want, raw)
	}
	return fast
}

// The fast path reads what MarshalJSON writes as encoding/json reads it,
// and refuses, for encoding/json to read, what it does not write: escaped
// strings, another order of the fields, unknown fields, whitespace.
func TestPollSummaryFastDecodeAgrees(t *testing.T) {
	r := rand.New(rand.NewPCG(46, 4))
	fastN := 0
	for range 2000 {
		s := randomSummary(r)
		raw, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		escaped := bytes.IndexByte(raw, '\\') >= 0
		fast := decodeBoth(t, raw)
		if fast == escaped {
			t.Fatalf("fast path %v, escapes %v: %s", fast, escaped, raw)
		}
		if fast {
			fastN++
		}
		// A line as the raft port reads it: LF and all.
		if fast != decodeBoth(t, append(raw, '\n')) {
			t.Fatalf("the line with its LF read otherwise: %s", raw)
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatal(err)
		}
		sorted, _ := json.Marshal(m) // the fields by name: answers first
		var indented bytes.Buffer
		_ = json.Indent(&indented, raw, "", " ")
		extra := append([]byte(`{"zone":"x",`), raw[1:]...)
		for _, other := range [][]byte{sorted, indented.Bytes(), extra} {
			if decodeBoth(t, other) {
				t.Fatalf("fast path read a form MarshalJSON does not write: %s", other)
			}
		}
	}
	if fastN < 500 {
		t.Errorf("the fast path read %d of 2000 summaries, want most of those without escapes", fastN)
	}
}

// A malformed answer is the error encoding/json's reading gives (the fast
// path leaves it to it): cut short anywhere, bad base64, an index beyond
// the tables (errBadSummary), a number out of range.
func TestPollSummaryFastDecodeMalformed(t *testing.T) {
	r := rand.New(rand.NewPCG(46, 5))
	for range 200 {
		s := randomSummary(r)
		raw, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		cut := r.IntN(len(raw))
		if decodeBoth(t, raw[:cut]) {
			t.Fatalf("read a summary cut at %d: %s", cut, raw[:cut])
		}
		if _, err := stdDecode(raw[:cut]); err == nil {
			t.Fatalf("cut at %d, no error: %s", cut, raw[:cut])
		}
	}
	const head = `{"at_unix_ms":1,"sources":["127.0.0.1"],"answers":[""],"servers":[{"backend":"b","server":"s","polls":`
	for _, c := range []struct {
		raw string
		bad bool // errBadSummary; otherwise encoding/json's error
	}{
		{head + `"BQ=="}]}`, true},     // a truncated poll
		{head + `"BQAAAgA="}]}`, true}, // source 5 of 1
		{head + `"AAcAAgA="}]}`, true}, // answer 7 of 1
		{head + `"AAAAAgA"}]}`, false}, // base64 without its padding
		{head + `"AA*AAgA="}]}`, false},
		{head + `"AAAA` + "\n" + `AgA="}]}`, false},  // base64 skips LF; JSON has none in a string
		{head + `null,"counts":"AQEAAAA="}]}`, true}, // set 0 of 0
		{`{"at_unix_ms":1,"sources":["127.0.0.1"],"answers":[""],"servers":[],"source_sets":[[1]]}`, true},
		{`{"at_unix_ms":1,"sources":["127.0.0.1"],"answers":[""],"servers":[],"source_sets":[[4294967296]]}`, false},
		{`{"at_unix_ms":1e3,"sources":[],"answers":[""],"servers":[]}`, false},
		{`{"at_unix_ms":9223372036854775808,"sources":[],"answers":[""],"servers":[]}`, false},
		{`{"at_unix_ms":1,"sources":[],"answers":[""],"servers":[]} x`, false},
		{`{"at_unix_ms":1,"sources":["a` + "\x01" + `"],"answers":[""],"servers":[]}`, false},
	} {
		if decodeBoth(t, []byte(c.raw)) {
			t.Errorf("%s: the fast path read it", c.raw)
		}
		var s PollSummary
		err := json.Unmarshal([]byte(c.raw), &s)
		if err == nil || errors.Is(err, errBadSummary) != c.bad {
			t.Errorf("%s: %v, want an error (errBadSummary: %v)", c.raw, err, c.bad)
		}
	}
	// Invalid UTF-8 is read as encoding/json reads it (U+FFFD), by it.
	raw := []byte(`{"at_unix_ms":1,"sources":["a` + "\xff" + `"],"answers":[""],"servers":[]}`)
	if decodeBoth(t, raw) {
		t.Errorf("%q: the fast path read invalid UTF-8", raw)
	}
}

// A server with both polls and counts, which MarshalJSON never writes, is
// left to encoding/json, which reads its counts alone: the fast path,
// which unpacks the polls as it reads them, refuses it.
func TestPollSummaryFastDecodePollsAndCounts(t *testing.T) {
	raw := []byte(`{"at_unix_ms":1,"sources":["127.0.0.1"],"answers":[""],"servers":[{"backend":"b","server":"s","polls":"AAAAAgA=","counts":"AAEAAAA="}],"source_sets":[[0]]}`)
	if decodeBoth(t, raw) {
		t.Fatalf("the fast path read a server with polls and counts: %s", raw)
	}
	s, err := stdDecode(raw)
	if err != nil || len(s.Servers) != 1 || s.Servers[0].Counts == nil || s.Servers[0].Polls != nil {
		t.Fatalf("encoding/json read %+v (%v), want the counts alone", s, err)
	}
}

// Names that are most of the line (more than the quarter of it that the
// strings' buffer is first made for) are read as encoding/json reads
// them: the buffer grows, and the strings cut before stay as they were.
func TestPollSummaryFastDecodeLongNames(t *testing.T) {
	s := PollSummary{Sources: []string{"127.0.0.1"}, Answers: []string{"", "ready 100%"}, Servers: []ServerPolls{}}
	for i := range 50 {
		s.Servers = append(s.Servers, ServerPolls{Backend: strings.Repeat("b", 100+i), Server: fmt.Sprintf("%s%03d", strings.Repeat("s", 200), i),
			Polls: []SourcePoll{{Source: 0, Answer: 1, Count: 2, LastMs: 1_700_000_000_000}}})
	}
	raw, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	if !decodeBoth(t, raw) {
		t.Fatalf("the fast path refused MarshalJSON's form: %s", raw)
	}
}

// A summary of 1,000 servers is decoded in a few allocations (13 and 10
// measured; more under -race), not some per server or per poll
// (encoding/json: about 5 a server).
func TestPollSummaryFastDecodeAllocs(t *testing.T) {
	for _, counts := range []bool{false, true} {
		raw, err := json.Marshal(benchSummary(t, 1000, 20, counts))
		if err != nil {
			t.Fatal(err)
		}
		var s PollSummary
		allocs := testing.AllocsPerRun(5, func() {
			if !s.DecodeJSONLine(raw) {
				t.Fatalf("the fast path refused MarshalJSON's form")
			}
		})
		if allocs > 32 {
			t.Errorf("counts %v: %.0f allocations a decode of 1,000 servers, want at most 32", counts, allocs)
		}
	}
}

// FuzzPollSummaryDecode: whatever the fast path reads, encoding/json
// reads the same; whatever it refuses, UnmarshalJSON reads as
// encoding/json does.
func FuzzPollSummaryDecode(f *testing.F) {
	r := rand.New(rand.NewPCG(46, 6))
	for range 20 {
		raw, err := json.Marshal(randomSummary(r))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(raw)
	}
	f.Fuzz(func(t *testing.T, raw []byte) { decodeBoth(t, raw) })
}
