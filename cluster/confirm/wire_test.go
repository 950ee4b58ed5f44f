package confirm

import (
	"bytes"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/hastate/hastate/cluster/raftport"
	"github.com/hastate/hastate/internal/testenv"
	"go.uber.org/zap"
)

// TestAnswerLinesAreWhatEncodingJSONWrites: the answers written without
// reflection are byte for byte what json.Encoder wrote before (a replica
// of the release before reads them), and read back as encoding/json reads
// them; a line not in the written form (an escaped string) is left to
// encoding/json.
func TestAnswerLinesAreWhatEncodingJSONWrites(t *testing.T) {
	for _, a := range []readIndexAnswer{
		{ID: "n1", Index: 12345},
		{ID: "n1"},
		{ID: "replica-a.example", Error: "not the leader"},
		{ID: "n1", Index: 1, Error: `term 3, not the follower's 2`},
		{ID: "n1", Error: "quote \" backslash \\ tab \t <html> & é"},
		{Error: `read-index request "x": want "<id> <term>"`},
		{ID: "n1", Index: 1<<64 - 1},
	} {
		checkAnswerLine(t, a)
	}
	for _, a := range []ackAnswer{{ID: "n2", Term: 7, Seq: 99}, {ID: "n2"}, {ID: "a\"b", Term: 1, Seq: 2}} {
		checkAnswerLine(t, a)
	}
	// Lines in another form are not read (encoding/json reads them).
	for _, line := range []string{`{"index":5,"id":"n1"}`, `{"id":"n1","index":5} x`, `{"id":"n1","index":-5}`, `{"id":"n1"`, `null`, `{"id": "n1"}`} {
		var a readIndexAnswer
		if a.DecodeJSONLine([]byte(line + "\n")) {
			t.Errorf("%q read as %+v", line, a)
		}
		var k ackAnswer
		if k.DecodeJSONLine([]byte(line + "\n")) {
			t.Errorf("%q read as %+v", line, k)
		}
	}
}

// TestAnswerLinesOutOfFormReadByEncodingJSON: an answer line whose
// strings hold invalid UTF-8 (which no replica writes: jsonstr.Append
// writes U+FFFD, as encoding/json does) or whose number has a leading
// zero is refused by DecodeJSONLine and read by the raft port's fallback,
// encoding/json, exactly as encoding/json reads it alone: U+FFFD for the
// invalid bytes, its error for the number. The lines go over a real raft
// port on loopback (raftport.LineConn.Ask), as a round's answers do.
func TestAnswerLinesOutOfFormReadByEncodingJSON(t *testing.T) {
	lines := []string{ // what the peer answers, request i: lines[i]
		"{\"id\":\"n\xff1\",\"index\":5}\n",
		"{\"id\":\"n1\",\"error\":\"bad \xc3( byte\"}\n",
		"{\"id\":\"\xed\xa0\x80\",\"term\":3,\"seq\":4}\n",
		"{\"id\":\"n1\",\"index\":05}\n",
		"{\"id\":\"n1\",\"term\":007,\"seq\":4}\n",
		"{\"id\":\"n1\",\"index\":5}\n", // in form: read by DecodeJSONLine
		"{\"id\":\"n1\",\"term\":3,\"seq\":4}\n",
	}
	limits, err := raftport.Limits{}.WithDefaults()
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	port, err := raftport.New(raftport.Config{Bind: addr, Advertise: addr, Log: zap.NewNop(), Metrics: raftport.NewMetrics(), Limits: limits,
		Lines: map[string]raftport.LineHandler{"raw": func(_ *x509.Certificate, req string) (any, bool) {
			var i int
			_, err := fmt.Sscan(req, &i)
			return rawLine(lines[i]), err == nil
		}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { port.Close() })
	port.ServeQueries()
	lc := port.LineConn()
	defer lc.Close()
	for i, line := range lines {
		inForm := i >= 5
		askOverRaftPort[readIndexAnswer](t, lc, addr, i, line, inForm && bytes.Contains([]byte(line), []byte("index")))
		askOverRaftPort[ackAnswer](t, lc, addr, i, line, inForm && bytes.Contains([]byte(line), []byte("seq")))
	}
}

// rawLine is an answer the raft port writes as these bytes (LineAnswer).
type rawLine string

func (l rawLine) AppendJSONLine(b []byte) []byte { return append(b, l...) }

// askOverRaftPort: request i, answered line, is read by Ask into an A as
// json.Unmarshal reads line (its value, or an error where it errs), and
// by DecodeJSONLine (fast) or not, as told.
func askOverRaftPort[A comparable, P answerLine[A]](t *testing.T, lc *raftport.LineConn, addr string, i int, line string, fast bool) {
	t.Helper()
	var want, got, decoded, zero A
	wantErr := json.Unmarshal([]byte(line), &want)
	known, err := lc.Ask(addr, "raw", fmt.Sprintf("%d\n", i), time.Now().Add(5*time.Second), &got)
	if !known || (err == nil) != (wantErr == nil) || got != want {
		t.Errorf("%q: Ask read %+v (known %v, %v); encoding/json reads %+v (%v)", line, got, known, err, want, wantErr)
	}
	if P(&decoded).DecodeJSONLine([]byte(line)) != fast || (!fast && decoded != zero) {
		t.Errorf("%q: DecodeJSONLine read %+v, want it read: %v", line, decoded, fast)
	}
}

// TestRequestLines: the request lines are those fmt wrote ("%s %d\n",
// "%s %d %d\n") and read back; a line in another form is refused.
func TestRequestLines(t *testing.T) {
	if got := requestLine("n2", 7); got != "n2 7\n" {
		t.Errorf("read-index request %q", got)
	}
	if got := requestLine("n1", 3, 18446744073709551615); got != "n1 3 18446744073709551615\n" {
		t.Errorf("ack request %q", got)
	}
	var term, seq uint64
	if id, err := parseRequestLine("n1 3 42", &term, &seq); err != nil || id != "n1" || term != 3 || seq != 42 {
		t.Errorf("ack request read as %q %d %d, %v", id, term, seq, err)
	}
	if id, err := parseRequestLine("n2 9", &term); err != nil || id != "n2" || term != 9 {
		t.Errorf("read-index request read as %q %d, %v", id, term, err)
	}
	for _, bad := range []string{"", "n2", "n2 ", " 5", "n2 x", "n2 -1", "n2 5 6"} {
		if id, err := parseRequestLine(bad, &term); err == nil {
			t.Errorf("%q read as a read-index request from %q", bad, id)
		}
	}
	if _, err := parseRequestLine("n1 3", &term, &seq); err == nil {
		t.Error("an ack request without its sequence number was read")
	}
}

// answerLine is an answer written and read without reflection: A its
// value, P the pointer that reads it.
type answerLine[A any] interface {
	*A
	DecodeJSONLine(line []byte) bool
}

// checkAnswerLine: a writes the bytes json.Encoder writes, and reads back
// as encoding/json reads them, or (an escaped string) is left to it.
func checkAnswerLine[A interface {
	comparable
	AppendJSONLine(b []byte) []byte
}, P answerLine[A]](t *testing.T, a A) {
	t.Helper()
	var want bytes.Buffer
	if err := json.NewEncoder(&want).Encode(a); err != nil {
		t.Fatal(err)
	}
	if got := a.AppendJSONLine(nil); !bytes.Equal(got, want.Bytes()) {
		t.Errorf("%+v: wrote %q, encoding/json writes %q", a, got, want.Bytes())
	}
	var fast, std, zero A
	if err := json.Unmarshal(want.Bytes(), &std); err != nil {
		t.Fatal(err)
	}
	if P(&fast).DecodeJSONLine(want.Bytes()) {
		if fast != std {
			t.Errorf("%q: read %+v, encoding/json reads %+v", want.Bytes(), fast, std)
		}
	} else if fast != zero || !bytes.Contains(want.Bytes(), []byte(`\`)) {
		t.Errorf("%q: not read (left %+v), though only an escaped string is left to encoding/json", want.Bytes(), fast)
	}
}

// BenchmarkAnswerLineDecode: the answer lines of a round read without
// reflection (the id's string is the one allocation of each).
//
//	go test -run '^$' -bench AnswerLineDecode -benchmem ./cluster/confirm/
func BenchmarkAnswerLineDecode(b *testing.B) {
	b.Run("read-index", func(b *testing.B) {
		line := readIndexAnswer{ID: "replica-2", Index: 1234567}.AppendJSONLine(nil)
		for b.Loop() {
			var a readIndexAnswer
			if !a.DecodeJSONLine(line) {
				b.Fatalf("%q not read", line)
			}
		}
	})
	b.Run("ack", func(b *testing.B) {
		line := ackAnswer{ID: "replica-2", Term: 12, Seq: 987654321}.AppendJSONLine(nil)
		for b.Loop() {
			var a ackAnswer
			if !a.DecodeJSONLine(line) {
				b.Fatalf("%q not read", line)
			}
		}
	})
}
