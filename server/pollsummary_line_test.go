package server

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// The answer line of a poll summary is written by hand
// (appendJSONLineAt): it is encoding/json's bytes (marshalAt) and a LF, on
// random summaries of counts, of polls and of both, with strings that
// encoding/json escapes (HTML characters, controls, U+2028, invalid
// UTF-8), nil and empty lists, source sets that are nil, and a cursor or
// none; a server with neither counts nor polls is left to encoding/json.
// (TestPollSummaryAnswerLine reads the line back.)
func TestSummaryLineIsMarshalJSONs(t *testing.T) {
	strs := []string{"", "fs000", "srv01", "ready 100%", "a\"b\\c", "<&>", "tab\there", "nl\n", "\x01\x1f", "é", "\u2028x", "\xff\xfe", "10.0.0.1", "drain"}
	pick := func(rng *rand.Rand) string { return strs[rng.IntN(len(strs))] }
	list := func(rng *rand.Rand) []string {
		switch rng.IntN(4) {
		case 0:
			return nil
		case 1:
			return []string{}
		}
		l := make([]string, 1+rng.IntN(4))
		for i := range l {
			l[i] = pick(rng)
		}
		return l
	}
	counts := func(rng *rand.Rand) []AnswerCount {
		var l []AnswerCount
		for range rng.IntN(3) {
			l = append(l, AnswerCount{Answer: rng.Int32N(300), N: rng.Int32N(100_000)})
		}
		return l
	}
	const at = 1_765_000_000_123
	for seed := range uint64(500) {
		rng := rand.New(rand.NewPCG(seed, 7))
		s := PollSummary{Sources: list(rng), Answers: list(rng)}
		for range rng.IntN(6) {
			sv := ServerPolls{Backend: pick(rng), Server: pick(rng)}
			switch rng.IntN(9) {
			case 0:
				if seed%5 == 0 { // neither: encoding/json's own path
					break
				}
				fallthrough
			case 1, 2, 3, 4:
				sv.Counts = &ServerCounts{Sources: rng.Int32N(1000), Polled: rng.Int32N(200), FromHAProxy: rng.IntN(2) == 0, Told: counts(rng), Kept: counts(rng)}
			default:
				for range 1 + rng.IntN(4) {
					sv.Polls = append(sv.Polls, SourcePoll{Source: rng.Int32N(200), Answer: rng.Int32N(300), Kept: rng.Int32N(300), Count: rng.Uint32N(3), LastMs: at - rng.Int64N(400_000) + 1000})
				}
			}
			s.Servers = append(s.Servers, sv)
		}
		if rng.IntN(2) == 0 {
			s.SourceSets = [][]int32{}
			for range rng.IntN(4) {
				var set []int32
				if rng.IntN(4) > 0 {
					set = []int32{}
					for range rng.IntN(4) {
						set = append(set, rng.Int32N(1<<20))
					}
				}
				s.SourceSets = append(s.SourceSets, set)
			}
		}
		if rng.IntN(3) == 0 {
			s.Next = pick(rng) + "/" + pick(rng)
		}
		want, err := s.marshalAt(at)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, '\n')
		prefix := []byte("prefix ")
		got := s.appendJSONLineAt(bytes.Clone(prefix), at)
		if !bytes.Equal(got, append(bytes.Clone(prefix), want...)) {
			t.Fatalf("seed %d: %+v\nby hand:       %q\nencoding/json: %q", seed, s, got[len(prefix):], want)
		}
	}
}
