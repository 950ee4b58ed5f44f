package server

import (
	"bytes"
	"net/http"
	"strconv"
	"time"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/internal/jsonstr"
)

// A read of /v1/pollers?scope=cluster asks each peer for a page of its
// polls (PollsQuery) and writes the merged page: at 1,000,000 pairs, a
// page of 1,000 rows a second, encoding/json's reflection (the peer's
// answer encoded and decoded, the page indented) was most of the reads'
// CPU on the replicas, which the agent shares (server/DESIGN.md, "The
// polls over the raft port"). The answer line and the page are written
// here by hand, exactly as encoding/json writes them (api.AppendPollJSON;
// TestPollsAnswerLineIsEncodingJSONs and TestPollersViewJSONIsWriteJSONs
// compare them byte for byte), and the answer is read back in one pass
// (jsonstr.Reader) when it is in exactly that form; any other form (an
// older release's, a string with escapes, anything unexpected) is left
// to encoding/json, so that an answer never reads otherwise than
// encoding/json reads it (TestPollsAnswerOutOfFormReadByEncodingJSON).

// AppendJSONLine appends a as json.Marshal writes it, and LF
// (raftport.LineAnswer): the line a peer answers PollsQuery with.
// Nothing when it cannot be encoded (a time json.Marshal refuses, which
// no poll holds): the raft port then writes nothing, as when json.Marshal
// failed.
func (a PollsAnswer) AppendJSONLine(b []byte) []byte {
	if !timesMarshal(a.Polls) {
		return b
	}
	b = append(b, `{"polls":`...)
	if a.Polls == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i := range a.Polls {
			if i > 0 {
				b = append(b, ',')
			}
			b = api.AppendPollJSON(b, &a.Polls[i], -1)
		}
		b = append(b, ']')
	}
	b = strconv.AppendInt(append(b, `,"total":`...), int64(a.Total), 10)
	return append(b, "}\n"...)
}

// timesMarshal reports whether every poll's time is one MarshalJSON
// writes: its year within 0-9999, its zone's offset under 24 hours.
func timesMarshal(polls []api.Poll) bool {
	for i := range polls {
		t := polls[i].LastAsked
		_, off := t.Zone()
		if y := t.Year(); y < 0 || y > 9999 || off <= -24*3600 || off >= 24*3600 {
			return false
		}
	}
	return true
}

// DecodeJSONLine reads a line AppendJSONLine wrote (raftport.LineDecoder;
// whitespace after it allowed), reporting false, with a left as it was,
// for a line in any other form or malformed: the caller reads it with
// encoding/json, which reads any form and says what is wrong. The
// polls' strings are cut from one copy of the line.
func (a *PollsAnswer) DecodeJSONLine(line []byte) bool {
	r := pollsReader{Reader: jsonstr.Reader{B: line}}
	out, ok := r.answer()
	if ok {
		*a = out
	}
	return ok
}

// pollsReader reads a PollsAnswer's line from B at I; text is B as a
// string, made by the first string read.
type pollsReader struct {
	jsonstr.Reader
	text string
}

// answer reads the whole line.
func (r *pollsReader) answer() (PollsAnswer, bool) {
	var out PollsAnswer
	if !r.Lit(`{"polls":`) {
		return out, false
	}
	if !r.Lit("null") {
		if !r.Lit("[") {
			return out, false
		}
		out.Polls = make([]api.Poll, 0, bytes.Count(r.B[r.I:], []byte(`{"haproxy":`)))
		for !r.Lit("]") {
			if len(out.Polls) > 0 && !r.Lit(",") {
				return out, false
			}
			var p api.Poll
			if !r.poll(&p) {
				return out, false
			}
			out.Polls = append(out.Polls, p)
		}
	}
	if !r.Lit(`,"total":`) {
		return out, false
	}
	total, ok := r.Int()
	if !ok || int64(int(total)) != total || !r.Lit("}") || !r.AtEnd() {
		return out, false
	}
	out.Total = int(total)
	return out, true
}

// poll reads one poll in AppendPollJSON's compact form.
func (r *pollsReader) poll(p *api.Poll) bool {
	ok := r.Lit(`{"haproxy":`) && r.str(&p.HAProxy) &&
		r.Lit(`,"backend":`) && r.str(&p.Backend) &&
		r.Lit(`,"server":`) && r.str(&p.Server) &&
		r.Lit(`,"last_asked":`) && r.time(&p.LastAsked) &&
		r.Lit(`,"answer":`) && r.str(&p.Answer) &&
		r.Lit(`,"withheld":`) && r.bool(&p.Withheld) &&
		(!r.Lit(`,"kept":`) || r.str(&p.Kept)) &&
		r.Lit(`,"count":`)
	if !ok {
		return false
	}
	if p.Count, ok = r.Uint(); !ok {
		return false
	}
	return (!r.Lit(`,"replica":`) || r.str(&p.Replica)) && r.Lit("}")
}

// str reads a string without escapes (jsonstr.Reader.Str) into s, cut
// from the copy of the line.
func (r *pollsReader) str(s *string) bool {
	start, end, ok := r.Str()
	if !ok {
		return false
	}
	if r.text == "" {
		r.text = string(r.B)
	}
	*s = r.text[start:end]
	return true
}

// time reads a string without escapes into t as encoding/json does:
// t's UnmarshalJSON of the quoted string.
func (r *pollsReader) time(t *time.Time) bool {
	start, end, ok := r.Str()
	return ok && t.UnmarshalJSON(r.B[start-1:end+1]) == nil
}

// bool reads true or false.
func (r *pollsReader) bool(v *bool) bool {
	if r.Lit("true") {
		*v = true
		return true
	}
	*v = false
	return r.Lit("false")
}

// writePollersView writes v as the body of a 200 answer: exactly what
// writeJSON writes (encoding/json, indented by two spaces), its polls
// through api.AppendPollJSON, yielding now and then (yield.go), as
// writeStateView writes /v1/state's rows. A time MarshalJSON refuses
// (which no poll holds) leaves the page to writeJSON.
func writePollersView(w http.ResponseWriter, v api.PollersView) {
	rows, empty := v.Pollers, v
	empty.Pollers = []api.Poll{}
	if !timesMarshal(rows) {
		rows = nil // encoding/json's error, its empty body
	}
	// "pollers" is the second field, after a string (which holds no
	// line break): its empty list is the first line of this form.
	writeIndentedList(w, func() any { return v }, empty, "\n  \"pollers\": [", len(rows), func(b []byte, i int) []byte {
		return api.AppendPollJSON(b, &rows[i], 2)
	})
}
