package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http/httptest"
	"reflect"
	"testing"
	"time"

	"github.com/hastate/hastate/api"
)

// randomPolls returns n polls whose every field is set at random
// (randomValue: strings that need escaping, invalid UTF-8, zero and
// non-zero times in four zones, omitempty fields empty or set).
func randomPolls(r *rand.Rand, n int) []api.Poll {
	out := make([]api.Poll, n)
	for i := range out {
		randomValue(r, reflect.ValueOf(&out[i]).Elem())
	}
	return out
}

// randomAnswer is a PollsAnswer of 0-40 random polls, its list nil, empty
// or not, its total any int.
func randomAnswer(r *rand.Rand) PollsAnswer {
	var a PollsAnswer
	switch r.IntN(6) {
	case 0: // null
	case 1:
		a.Polls = []api.Poll{}
	default:
		a.Polls = randomPolls(r, 1+r.IntN(40))
	}
	a.Total = []int{0, 1, 1000, -1, 1<<63 - 1, -1 << 63}[r.IntN(6)]
	return a
}

// lineOf is the line a peer wrote for a before AppendJSONLine: json.Marshal
// and LF (raftport's appendJSONLine).
func lineOf(t testing.TB, a PollsAnswer) []byte {
	t.Helper()
	j, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	return append(j, '\n')
}

// stdAnswer reads line as the asker read it before DecodeJSONLine
// (decodeAnswer's json.Unmarshal).
func stdAnswer(line []byte) (*PollsAnswer, error) {
	var a *PollsAnswer
	err := json.Unmarshal(line, &a)
	return a, err
}

// decodeAnswerBoth checks that DecodeJSONLine, when it reads line, reads
// what encoding/json reads, and leaves its value alone when it does not;
// it reports whether it read it.
func decodeAnswerBoth(t *testing.T, line []byte) bool {
	t.Helper()
	want, werr := stdAnswer(line)
	got := PollsAnswer{Total: -7} // left as it was when refused
	if !got.DecodeJSONLine(line) {
		if !reflect.DeepEqual(got, PollsAnswer{Total: -7}) {
			t.Fatalf("DecodeJSONLine refused %q but changed the answer: %+v", line, got)
		}
		return false
	}
	if werr != nil || want == nil {
		t.Fatalf("DecodeJSONLine read %q, which encoding/json reads as %v (%v)", line, want, werr)
	}
	if !reflect.DeepEqual(got, *want) {
		t.Fatalf("DecodeJSONLine read %q as\n%+v\nencoding/json as\n%+v", line, got, *want)
	}
	return true
}

// A peer's answer line is the bytes json.Marshal wrote, on random
// answers (escapes, invalid UTF-8, zero times and four zones, omitempty
// fields empty and set, null and empty lists); the asker reads it as
// encoding/json reads it, in one pass whenever no string holds an escape
// or invalid UTF-8.
func TestPollsAnswerLineIsEncodingJSONs(t *testing.T) {
	r := rand.New(rand.NewPCG(46, 7))
	fast := 0
	for round := range 600 {
		a := randomAnswer(r)
		want := lineOf(t, a)
		got := a.AppendJSONLine([]byte("prefix"))
		if !bytes.Equal(got[len("prefix"):], want) {
			t.Fatalf("round %d: AppendJSONLine wrote\n%s\njson.Marshal\n%s", round, got, want)
		}
		if decodeAnswerBoth(t, want) {
			fast++
		} else if plain(want) {
			t.Fatalf("round %d: DecodeJSONLine left its own form to encoding/json:\n%s", round, want)
		}
	}
	if fast < 100 {
		t.Fatalf("DecodeJSONLine read %d of 600 lines itself: the test's answers are not in its form", fast)
	}
}

// plain: no string of line holds a backslash (an escape) or a byte
// outside ASCII (among the test's strings, all invalid UTF-8 is).
func plain(line []byte) bool {
	for _, c := range line {
		if c == '\\' || c >= 0x80 {
			return false
		}
	}
	return true
}

// What a replica answers (Select's polls: UTC, no escapes) reads back as
// it was, in one pass, across releases' writers (AppendJSONLine and
// json.Marshal write the same line).
func TestPollsAnswerRoundTrip(t *testing.T) {
	at := time.Date(2026, 12, 7, 19, 0, 0, 123456789, time.UTC)
	for _, a := range []PollsAnswer{
		{},
		{Polls: []api.Poll{}, Total: 3},
		{Polls: []api.Poll{
			{HAProxy: "127.0.0.1", Backend: "web", Server: "a", LastAsked: at, Answer: "ready 100%", Count: 3, Replica: "n1"},
			{HAProxy: "::1", Backend: "web", Server: "a", LastAsked: at.Add(time.Second).Truncate(time.Second), Withheld: true, Kept: "drain", Count: 1 << 40},
			{HAProxy: "", Backend: "", Server: "", Withheld: true}, // zero time
		}, Total: 1000001},
	} {
		line := a.AppendJSONLine(nil)
		var got PollsAnswer
		if !got.DecodeJSONLine(line) {
			t.Fatalf("DecodeJSONLine refused its own line %s", line)
		}
		if !reflect.DeepEqual(got, a) {
			t.Fatalf("%s read back as\n%+v, was\n%+v", line, got, a)
		}
	}
}

// A line out of AppendJSONLine's form (another release's, whitespace,
// escapes, another order, a cut or a changed byte) is read as
// encoding/json reads it, or fails as it fails: DecodeJSONLine reads it
// only when it would read the same, and refuses the forms listed here.
func TestPollsAnswerOutOfFormReadByEncodingJSON(t *testing.T) {
	const p = `{"haproxy":"127.0.0.1","backend":"web","server":"a","last_asked":"2026-12-07T19:00:00.5Z","answer":"ready 100%","withheld":false,"count":3}`
	for _, c := range []struct {
		line string
		fast bool // read in one pass
	}{
		{`null`, false},
		{`{"polls":[` + p + `],"total":1} `, true}, // read: whitespace after it
		{`{"polls":[` + p + `],"total":1}` + "\n", true},
		{`{"polls":[` + p + "],\n" + `"total":1}`, false},
		{`{"total":1,"polls":[` + p + `]}`, false},
		{`{"polls":[` + p + `],"total":1,"more":2}`, false},
		{`{"Polls":[` + p + `],"total":1}`, false},
		{`{"polls":[` + p + `,null],"total":1}`, false},
		{`{"polls":[` + p + `],"total":1.0}`, false},
		{`{"polls":[` + p + `],"total":01}`, false},
		{`{"polls":[` + p + `],"total":-0}`, true},
		{`{"polls":[` + p + `],"total":9223372036854775808}`, false},
		{`{"polls":[],"total":1}`, true},
		{`{"polls":[,],"total":1}`, false},
		{`{"polls":[` + p + `,],"total":1}`, false},
		{`{"polls":[` + p + p + `],"total":1}`, false},
		{`{"polls":null,"total":1}`, true},
		{`{"polls":[` + bytesReplace(p, `"count":3`, `"count":-0`) + `],"total":1}`, false},
		{`{"polls":[` + bytesReplace(p, `"count":3`, `"count":18446744073709551616`) + `],"total":1}`, false},
		{`{"polls":[` + bytesReplace(p, `"count":3`, `"count":3,"kept":"x"`) + `],"total":1}`, false},
		{`{"polls":[` + bytesReplace(p, `"count":3`, `"count":3,"replica":"n1"`) + `],"total":1}`, true},
		{`{"polls":[` + bytesReplace(p, `"withheld":false`, `"withheld":true,"kept":"drain"`) + `],"total":1}`, true},
		{`{"polls":[` + bytesReplace(p, `"withheld":false`, `"withheld":null`) + `],"total":1}`, false},
		{`{"polls":[` + bytesReplace(p, `"withheld":false`, `"withheld":falsey`) + `],"total":1}`, false},
		{`{"polls":[` + bytesReplace(p, `"withheld":false`, `"withheld":`) + `],"total":1}`, false},
		{`{"polls":[` + bytesReplace(p, `"withheld":false`, `"withheld":true`) + `],"total":1}`, true},
		{`{"polls":[` + bytesReplace(p, `web`, `w\u0065b`) + `],"total":1}`, false},
		{`{"polls":[` + bytesReplace(p, `web`, "w\xffb") + `],"total":1}`, false},
		{`{"polls":[` + bytesReplace(p, `web`, "w\tb") + `],"total":1}`, false},
		{`{"polls":[` + bytesReplace(p, `web`, "wéb") + `],"total":1}`, true},
		{`{"polls":[` + bytesReplace(p, `.5Z`, `.5+01:00`) + `],"total":1}`, true},
		{`{"polls":[` + bytesReplace(p, `.5Z`, `.5+24:00`) + `],"total":1}`, true}, // as UnmarshalJSON reads it,
		{`{"polls":[` + bytesReplace(p, `.5Z`, `.5`) + `],"total":1}`, false},
		{`{"polls":[` + bytesReplace(p, `2026`, `\u0032026`) + `],"total":1}`, false},
		{`{"polls":[` + bytesReplace(p, `"2026-12-07T19:00:00.5Z"`, `null`) + `],"total":1}`, false},
		{`{"polls":[` + bytesReplace(p, `"2026-12-07T19:00:00.5Z"`, `"0001-01-01T00:00:00Z"`) + `],"total":1}`, true},
		{`{"polls":[` + bytesReplace(p, `"2026-12-07T19:00:00.5Z"`, `"10000-01-01T00:00:00Z"`) + `],"total":1}`, false},
	} {
		if got := decodeAnswerBoth(t, []byte(c.line)); got != c.fast {
			t.Errorf("%s: read in one pass %v, want %v", c.line, got, c.fast)
		}
	}
	r := rand.New(rand.NewPCG(46, 8))
	fast := 0
	for range 300 {
		line := lineOf(t, randomAnswer(r))
		if r.IntN(2) == 0 {
			line = lineOf(t, plainAnswer(r))
		}
		for range 20 {
			bad := bytes.Clone(line)
			switch i := r.IntN(len(bad)); r.IntN(4) {
			case 0:
				bad = bad[:i]
			case 1:
				const junk = "{}[],:\"\\ \n09-+.aeEtxZT"
				bad[i] = junk[r.IntN(len(junk))]
			case 2:
				bad = append(bad[:i:i], bad[i+1:]...)
			default:
				bad = append(bad[:i:i], append([]byte(`,"count":1`), bad[i:]...)...)
			}
			if decodeAnswerBoth(t, bad) {
				fast++
			}
		}
	}
	t.Logf("%d of 6000 changed lines read in one pass (each as encoding/json reads it)", fast)
}

// plainAnswer is an answer of 1-5 polls in DecodeJSONLine's form (no
// escape, no invalid UTF-8), in random zones, some of them zero.
func plainAnswer(r *rand.Rand) PollsAnswer {
	a := benchPollsAnswer(1 + r.IntN(5))
	zones := []*time.Location{time.UTC, time.FixedZone("", -7*3600), time.FixedZone("X", 5*3600+1800), time.Local}
	for i := range a.Polls {
		p := &a.Polls[i]
		if p.LastAsked = p.LastAsked.In(zones[r.IntN(len(zones))]); r.IntN(5) == 0 {
			p.LastAsked = time.Time{}
		}
		if r.IntN(3) == 0 {
			p.Replica = ""
		}
	}
	return a
}

func bytesReplace(s, old, new string) string {
	return string(bytes.Replace([]byte(s), []byte(old), []byte(new), 1))
}

// A decode of 1,000 polls takes a few allocations (the list, one copy
// of the line's strings), not some per poll (encoding/json: several).
func TestPollsAnswerDecodeAllocs(t *testing.T) {
	line := benchPollsAnswer(1000).AppendJSONLine(nil)
	var a PollsAnswer
	allocs := testing.AllocsPerRun(5, func() {
		if !a.DecodeJSONLine(line) {
			t.Fatal("DecodeJSONLine refused its own line")
		}
	})
	if allocs > 8 {
		t.Errorf("%.0f allocations a decode of 1,000 polls, want at most 8", allocs)
	}
}

// FuzzPollsAnswerDecode: whatever DecodeJSONLine reads, encoding/json
// reads the same; what it refuses it leaves as it was.
func FuzzPollsAnswerDecode(f *testing.F) {
	r := rand.New(rand.NewPCG(46, 9))
	for range 20 {
		f.Add(lineOf(f, randomAnswer(r)))
	}
	f.Add(benchPollsAnswer(3).AppendJSONLine(nil))
	f.Fuzz(func(t *testing.T, line []byte) { decodeAnswerBoth(t, line) })
}

// TestPollersViewJSONIsWriteJSONs: writePollersView writes the bytes
// writeJSON (encoding/json, indented) writes, for pages of 0, 1, 2 and
// 600 random polls (across the yields), both scopes, with and without
// replicas, selectors and a next cursor.
func TestPollersViewJSONIsWriteJSONs(t *testing.T) {
	r := rand.New(rand.NewPCG(46, 10))
	for _, n := range []int{0, 1, 2, 600} {
		for round := range 6 {
			v := api.PollersView{Scope: pick(r, jsonStrings), Pollers: randomPolls(r, n), Total: r.IntN(2000) - 1, Truncated: round%2 == 0}
			if round%3 != 0 {
				v.Replicas = []api.ReplicaAnswer{{ID: "n1", Answered: true}, {ID: pick(r, jsonStrings), Error: pick(r, jsonStrings)}}
				v.Selectors = []string{"web/*", pick(r, jsonStrings)}
				v.Next = pick(r, jsonStrings)
			}
			if n == 0 && round%2 == 1 {
				v.Pollers = []api.Poll{}
			}
			want, got := httptest.NewRecorder(), httptest.NewRecorder()
			writeJSON(want, 200, v)
			writePollersView(got, v)
			sameAnswer(t, fmt.Sprintf("%d polls, round %d", n, round), got, want)
		}
	}
}

// benchPollsAnswer is a peer's answer to a read of one page (1,000 rows
// and the one more that tells whether more follow, when n is 1,001): 50
// servers of 20 HAProxy nodes each, as Select answers it.
func benchPollsAnswer(n int) PollsAnswer {
	at := time.Date(2026, 12, 7, 19, 0, 0, 0, time.UTC)
	a := PollsAnswer{Polls: make([]api.Poll, n), Total: 1_000_000}
	for i := range a.Polls {
		p := &a.Polls[i]
		p.Backend, p.Server = fmt.Sprintf("be%03d", i/1000), fmt.Sprintf("srv-%05d", i/20)
		p.HAProxy = fmt.Sprintf("127.0.0.%d", 1+i%20)
		p.LastAsked = at.Add(time.Duration(i) * 1234567 * time.Nanosecond)
		p.Answer, p.Count, p.Replica = "ready 100%", uint64(300+i%7), "n1"
		if i%10 == 0 {
			p.Answer, p.Withheld, p.Kept = "", true, "drain"
		}
	}
	return a
}

// BenchmarkPollsAnswer: a peer's answer of 1,001 polls (a page of 1,000
// and one more) written (as raftport wrote it: json.Marshal and LF;
// AppendJSONLine) and read (json.Unmarshal, as decodeAnswer did;
// DecodeJSONLine), and the page of 1,000 written (writeJSON;
// writePollersView).
func BenchmarkPollsAnswer(b *testing.B) {
	a := benchPollsAnswer(1001)
	line := a.AppendJSONLine(nil)
	view := api.PollersView{Scope: "cluster", Pollers: a.Polls[:1000], Total: 1_000_000, Truncated: true,
		Replicas: []api.ReplicaAnswer{{ID: "n1", Answered: true}, {ID: "n2", Answered: true}, {ID: "n3", Answered: true}}}
	var buf []byte
	for _, c := range []struct {
		name string
		run  func(b *testing.B)
	}{
		{"encode/encoding-json", func(b *testing.B) {
			j, err := json.Marshal(a)
			if err != nil {
				b.Fatal(err)
			}
			buf = append(append(buf[:0], j...), '\n')
		}},
		{"encode/hand", func(*testing.B) { buf = a.AppendJSONLine(buf[:0]) }},
		{"decode/encoding-json", func(b *testing.B) {
			if _, err := stdAnswer(line); err != nil {
				b.Fatal(err)
			}
		}},
		{"decode/hand", func(b *testing.B) {
			var got PollsAnswer
			if !got.DecodeJSONLine(line) {
				b.Fatal("refused")
			}
		}},
		{"page/encoding-json", func(*testing.B) { writeJSON(httptest.NewRecorder(), 200, view) }},
		{"page/hand", func(*testing.B) { writePollersView(httptest.NewRecorder(), view) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				c.run(b)
			}
		})
	}
}

// A time json.Marshal refuses (year outside 0-9999, a zone 24 hours or
// more away), which no poll holds, is refused here too: the line is
// nothing (the raft port wrote nothing when json.Marshal failed), the
// page what writeJSON writes.
func TestPollsAnswerUnencodableTimes(t *testing.T) {
	ok := time.Date(2026, 12, 7, 19, 0, 0, 0, time.UTC)
	for _, bad := range []time.Time{
		time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC),
		ok.In(time.FixedZone("", 24*3600)),
		ok.In(time.FixedZone("", -24*3600)),
	} {
		a := benchPollsAnswer(3)
		a.Polls[1].LastAsked = bad
		if _, err := json.Marshal(a); err == nil {
			t.Fatalf("%v: json.Marshal encodes it: this test's time is not one it refuses", bad)
		}
		if got := a.AppendJSONLine([]byte("x")); string(got) != "x" {
			t.Errorf("%v: AppendJSONLine wrote %s, json.Marshal failed", bad, got)
		}
		v := api.PollersView{Scope: "cluster", Pollers: a.Polls}
		want, got := httptest.NewRecorder(), httptest.NewRecorder()
		writeJSON(want, 200, v)
		writePollersView(got, v)
		sameAnswer(t, bad.String(), got, want)
	}
	// Just within: encoded as json.Marshal encodes them.
	a := benchPollsAnswer(4)
	a.Polls[0].LastAsked = time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC)
	a.Polls[1].LastAsked = time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC)
	a.Polls[2].LastAsked = ok.In(time.FixedZone("", 24*3600-60))
	a.Polls[3].LastAsked = ok.In(time.FixedZone("", -24*3600+1))
	if got, want := a.AppendJSONLine(nil), lineOf(t, a); !bytes.Equal(got, want) {
		t.Errorf("AppendJSONLine wrote\n%s\njson.Marshal\n%s", got, want)
	}
}
