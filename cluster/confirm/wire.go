package confirm

// This file holds the lines of the read-index and ack queries as they go
// over the raft port, written and read without fmt or reflection: a round
// sends one request line and reads one answer line, and encoding/json's
// reflection and fmt's scanning were the larger part of a round's CPU
// besides the write itself (cluster/DESIGN.md, "Pipelining"). The bytes
// are those encoding/json and fmt wrote and read before: a replica of
// the release before reads these lines, and these readers fall back to
// encoding/json for any line not in the form they write. The answers are
// read with jsonstr.Reader (as a peer's poll summary is, in server),
// which refuses whatever encoding/json would read otherwise (invalid
// UTF-8, a leading zero), so the fallback reads it as it always would.

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
	r := jsonstr.Reader{B: line}
	ok := r.Lit(`{"id":`) && str(&r, &a.ID) &&
		(!r.Lit(`,"index":`) || num(&r, &a.Index)) &&
		(!r.Lit(`,"error":`) || str(&r, &a.Error)) &&
		r.Lit("}") && r.AtLineEnd()
	if !ok {
		*a = readIndexAnswer{}
	}
	return ok
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
	r := jsonstr.Reader{B: line}
	ok := r.Lit(`{"id":`) && str(&r, &a.ID) &&
		r.Lit(`,"term":`) && num(&r, &a.Term) &&
		r.Lit(`,"seq":`) && num(&r, &a.Seq) &&
		r.Lit("}") && r.AtLineEnd()
	if !ok {
		*a = ackAnswer{}
	}
	return ok
}

// str reads a string without escapes into s (jsonstr.Reader.Str).
func str(r *jsonstr.Reader, s *string) bool {
	start, end, ok := r.Str()
	if ok {
		*s = string(r.B[start:end])
	}
	return ok
}

// num reads an unsigned integer into n (jsonstr.Reader.Uint).
func num(r *jsonstr.Reader, n *uint64) bool {
	v, ok := r.Uint()
	*n = v
	return ok
}
