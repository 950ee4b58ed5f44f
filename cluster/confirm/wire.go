package confirm

// This file holds the lines of the read-index and ack queries as they go
// over the raft port, written and read without fmt or reflection: a round
// sends one request line and reads one answer line, and encoding/json's
// reflection and fmt's scanning were the larger part of a round's CPU
// besides the write itself (cluster/DESIGN.md, "Pipelining"). The bytes
// are those encoding/json and fmt wrote and read before: a replica of
// the release before reads these lines, and these readers fall back to
// encoding/json for any line not in the form they write.

import (
	"errors"
	"strconv"
	"strings"

	"github.com/hastate/hastate/internal/jsonstr"
)

// errRequestLine: a request line is not "<id> <n>..." as a replica sends it.
var errRequestLine = errors.New("malformed request line")

// requestLine is "<id> <n1> <n2>...\n", as the requests are sent.
func requestLine(id string, ns ...uint64) string {
	b := make([]byte, 0, len(id)+1+21*len(ns))
	b = append(b, id...)
	for _, n := range ns {
		b = strconv.AppendUint(append(b, ' '), n, 10)
	}
	return string(append(b, '\n'))
}

// parseRequestLine reads "<id> <n1> ... <nk>" (k = len(ns), no LF) into
// id and ns, as fmt.Sscanf("%s %d ...") did for every line a replica sends.
func parseRequestLine(line string, ns ...*uint64) (id string, err error) {
	id, rest, ok := strings.Cut(line, " ")
	if !ok || id == "" {
		return "", errRequestLine
	}
	for i, n := range ns {
		field := rest
		if i < len(ns)-1 {
			if field, rest, ok = strings.Cut(rest, " "); !ok {
				return "", errRequestLine
			}
		}
		if *n, err = strconv.ParseUint(field, 10, 64); err != nil {
			return "", errRequestLine
		}
	}
	return id, nil
}

// AppendJSONLine writes a as encoding/json does (raftport.LineAnswer).
func (a readIndexAnswer) AppendJSONLine(b []byte) []byte {
	b = jsonstr.Append(append(b, `{"id":`...), a.ID)
	if a.Index != 0 {
		b = strconv.AppendUint(append(b, `,"index":`...), a.Index, 10)
	}
	if a.Error != "" {
		b = jsonstr.Append(append(b, `,"error":`...), a.Error)
	}
	return append(b, "}\n"...)
}

// DecodeJSONLine reads a line AppendJSONLine wrote (raftport.LineDecoder).
func (a *readIndexAnswer) DecodeJSONLine(line []byte) bool {
	s := jsonLine{b: line, ok: true}
	s.lit(`{"id":`)
	a.ID = s.str()
	if s.has(`,"index":`) {
		a.Index = s.uint()
	}
	if s.has(`,"error":`) {
		a.Error = s.str()
	}
	s.lit("}")
	if !s.end() {
		*a = readIndexAnswer{}
		return false
	}
	return true
}

// AppendJSONLine writes a as encoding/json does (raftport.LineAnswer).
func (a ackAnswer) AppendJSONLine(b []byte) []byte {
	b = jsonstr.Append(append(b, `{"id":`...), a.ID)
	b = strconv.AppendUint(append(b, `,"term":`...), a.Term, 10)
	b = strconv.AppendUint(append(b, `,"seq":`...), a.Seq, 10)
	return append(b, "}\n"...)
}

// DecodeJSONLine reads a line AppendJSONLine wrote (raftport.LineDecoder).
func (a *ackAnswer) DecodeJSONLine(line []byte) bool {
	s := jsonLine{b: line, ok: true}
	s.lit(`{"id":`)
	a.ID = s.str()
	s.lit(`,"term":`)
	a.Term = s.uint()
	s.lit(`,"seq":`)
	a.Seq = s.uint()
	s.lit("}")
	if !s.end() {
		*a = ackAnswer{}
		return false
	}
	return true
}

// jsonLine reads the answer lines AppendJSONLine writes; ok turns false
// at the first byte not in that form.
type jsonLine struct {
	b  []byte
	ok bool
}

// lit consumes p.
func (s *jsonLine) lit(p string) {
	s.ok = s.ok && s.has(p)
}

// has consumes p if the line goes on with it.
func (s *jsonLine) has(p string) bool {
	if !s.ok || len(s.b) < len(p) || string(s.b[:len(p)]) != p {
		return false
	}
	s.b = s.b[len(p):]
	return true
}

// str consumes a JSON string without escapes.
func (s *jsonLine) str() string {
	if !s.ok || len(s.b) == 0 || s.b[0] != '"' {
		s.ok = false
		return ""
	}
	for i := 1; i < len(s.b); i++ {
		switch c := s.b[i]; {
		case c == '"':
			v := string(s.b[1:i])
			s.b = s.b[i+1:]
			return v
		case c == '\\' || c < 0x20:
			s.ok = false
			return ""
		}
	}
	s.ok = false
	return ""
}

// uint consumes a decimal number.
func (s *jsonLine) uint() uint64 {
	i := 0
	for i < len(s.b) && s.b[i] >= '0' && s.b[i] <= '9' {
		i++
	}
	if !s.ok || i == 0 {
		s.ok = false
		return 0
	}
	n, err := strconv.ParseUint(string(s.b[:i]), 10, 64)
	s.ok = err == nil
	s.b = s.b[i:]
	return n
}

// end reports whether the whole line was read (an LF may end it).
func (s *jsonLine) end() bool {
	return s.ok && (len(s.b) == 0 || string(s.b) == "\n")
}
