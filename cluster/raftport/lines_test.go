package raftport

import (
	"bytes"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
)

// lineAnswer is an answer that writes and reads itself (LineAnswer,
// LineDecoder) in the form encoding/json gives {"n":N,"s":"..."}.
type lineAnswer struct {
	N       int    `json:"n"`
	S       string `json:"s"`
	decoded bool   // read by DecodeJSONLine
}

func (a lineAnswer) AppendJSONLine(b []byte) []byte {
	return append(b, `{"n":7,"s":"by hand"}`+"\n"...)
}

func (a *lineAnswer) DecodeJSONLine(line []byte) bool {
	if string(line) != `{"n":7,"s":"by hand"}`+"\n" {
		return false
	}
	a.N, a.S, a.decoded = 7, "by hand", true
	return true
}

// TestLineQueryAnswers: answers on a kept-open line connection, written
// by hand (LineAnswer) or by encoding/json, read by hand (LineDecoder) or
// by encoding/json, a line longer than the reader's buffer included; an
// unknown query is answered null (a release without it), and Ask says so.
func TestLineQueryAnswers(t *testing.T) {
	limits, err := Limits{}.WithDefaults()
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("x", 3000)
	s, err := New(Config{Bind: "127.0.0.1:0", Advertise: "127.0.0.1:1", Log: zap.NewNop(), Metrics: NewMetrics(), Limits: limits,
		Lines: map[string]LineHandler{"q": func(_ *x509.Certificate, line string) (any, bool) {
			switch line {
			case "hand":
				return lineAnswer{}, true
			case "long":
				return map[string]any{"n": 1, "s": long}, true
			}
			return map[string]any{"n": 2, "s": line}, true
		}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	s.ServeQueries()
	addr := s.ln.Addr().String()
	lc := s.LineConn()
	defer lc.Close()
	deadline := time.Now().Add(5 * time.Second)
	for _, c := range []struct {
		line string
		want lineAnswer
	}{
		{"hand\n", lineAnswer{N: 7, S: "by hand", decoded: true}},
		{"json\n", lineAnswer{N: 2, S: "json"}},
		{"long\n", lineAnswer{N: 1, S: long}},
		{"hand\n", lineAnswer{N: 7, S: "by hand", decoded: true}},
	} {
		var got lineAnswer
		known, err := lc.Ask(addr, "q", c.line, deadline, &got)
		if err != nil || !known || got != c.want {
			t.Fatalf("ask %q: %+v known %v err %v; want %+v", c.line, got, known, err, c.want)
		}
	}
	var got lineAnswer
	if known, err := s.LineConn().Ask(addr, "unknown", "x\n", deadline, &got); known || err != nil {
		t.Fatalf("an unknown query: known %v err %v, want it answered null", known, err)
	}
}

// TestNamedQueryAnswerBytes: a named query's answer is the line
// json.Encoder writes; one that writes itself (LineAnswer, as a peer's
// poll-summary does) is written as it writes itself, not encoded again.
func TestNamedQueryAnswerBytes(t *testing.T) {
	limits, err := Limits{}.WithDefaults()
	if err != nil {
		t.Fatal(err)
	}
	byJSON := map[string]any{"n": 2, "s": "<a & b>", "l": []int{1, 2}}
	s, err := New(Config{Bind: "127.0.0.1:0", Advertise: "127.0.0.1:1", Log: zap.NewNop(), Metrics: NewMetrics(), Limits: limits,
		ArgQueries: map[string]func(json.RawMessage) any{
			"hand": func(json.RawMessage) any { return lineAnswer{} },
			"json": func(json.RawMessage) any { return byJSON },
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	s.ServeQueries()
	var encoded bytes.Buffer
	if err := json.NewEncoder(&encoded).Encode(byJSON); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, want string }{
		{"hand", `{"n":7,"s":"by hand"}` + "\n"},
		{"json", encoded.String()},
		{"unknown", "null\n"},
	} {
		conn, err := s.dial(s.ln.Addr().String(), KindQuery, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := conn.Write([]byte(c.name + "\n{}\n")); err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(conn)
		conn.Close()
		if err != nil || string(got) != c.want {
			t.Fatalf("query %s: answered %q (%v), want %q", c.name, got, err, c.want)
		}
	}
}

// rawAnswer is an answer that writes itself as these bytes, whatever
// they are (LineAnswer).
type rawAnswer string

func (a rawAnswer) AppendJSONLine(b []byte) []byte { return append(b, a...) }

// TestQueryWithAnswerAsWritten: QueryWith hands over a named query's
// answer line as the peer wrote it, without scanning it: a malformed
// line is the caller's json.Unmarshal's *json.SyntaxError (it was
// QueryWith's before); an answer cut short (the connection closed before
// its LF) is io.ErrUnexpectedEOF and none io.EOF, as they were; a whole
// value without its LF, or of 3 MB, is read.
func TestQueryWithAnswerAsWritten(t *testing.T) {
	limits, err := Limits{}.WithDefaults()
	if err != nil {
		t.Fatal(err)
	}
	long := `{"s":"` + strings.Repeat("x", 3<<20) + `"}`
	answers := map[string]rawAnswer{
		"line": `{"n":1}` + "\n", "malformed": `{"n":]` + "\n", "nolf": `{"n":2}`,
		"cut": `{"n":[1,`, "empty": "", "long": rawAnswer(long + "\n"),
	}
	aq := map[string]func(json.RawMessage) any{}
	for name, a := range answers {
		aq[name] = func(json.RawMessage) any { return a }
	}
	s, err := New(Config{Bind: "127.0.0.1:0", Advertise: "127.0.0.1:1", Log: zap.NewNop(), Metrics: NewMetrics(), Limits: limits, ArgQueries: aq})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	s.ServeQueries()
	addr := s.ln.Addr().String()
	for _, c := range []struct {
		name, raw string
		err       error
	}{
		{"line", `{"n":1}`, nil}, {"malformed", `{"n":]`, nil}, {"nolf", `{"n":2}`, nil},
		{"cut", "", io.ErrUnexpectedEOF}, {"empty", "", io.EOF}, {"unknown", "null", nil}, {"long", long, nil},
	} {
		raw, err := s.QueryWith(addr, c.name, []byte("{}"), 5*time.Second)
		if err != c.err || string(raw) != c.raw {
			t.Errorf("query %s: %.40q (%v), want %.40q (%v)", c.name, raw, err, c.raw, c.err)
		}
	}
	raw, err := s.QueryWith(addr, "malformed", []byte("{}"), 5*time.Second)
	var v any
	var syntax *json.SyntaxError
	if err != nil || !errors.As(json.Unmarshal(raw, &v), &syntax) {
		t.Errorf("a malformed answer: %q (%v), decoded: %v, want a *json.SyntaxError", raw, err, json.Unmarshal(raw, &v))
	}
}
