package api

import (
	"strconv"

	"github.com/hastate/hastate/internal/jsonstr"
)

// A replica answers a peer's read of its polls (server.PollsAnswer, a
// line over the raft port) and writes the /v1/pollers page with
// AppendPollJSON: the bytes encoding/json writes, without reflection and
// without a second pass to indent (server's TestPollsAnswerLineIsEncodingJSONs
// and TestPollersViewJSONIsWriteJSONs compare them byte for byte).

// AppendPollJSON appends p as encoding/json writes it: compact, as
// json.Marshal writes it, when depth is negative; otherwise as
// json.Encoder with SetIndent("", "  ") writes it at depth (2: an element
// of a list in an object, /v1/pollers' pollers; at most 6), the newline
// and indentation before it being the caller's. The fields are in their
// struct order, omitempty kept. A time whose year is outside 0-9999,
// which MarshalJSON refuses and no poll holds (they are kept as Unix
// nanoseconds), is written as AppendFormat writes it.
func AppendPollJSON(b []byte, p *Poll, depth int) []byte {
	indent, end, colon := "", "", ":"
	if depth >= 0 {
		indent, end, colon = rowSpaces[:1+2*(depth+1)], rowSpaces[:1+2*depth], ": "
	}
	b = append(b, '{')
	b = pollField(b, indent, colon, "haproxy", false)
	b = jsonstr.Append(b, p.HAProxy)
	b = pollField(b, indent, colon, "backend", true)
	b = jsonstr.Append(b, p.Backend)
	b = pollField(b, indent, colon, "server", true)
	b = jsonstr.Append(b, p.Server)
	b = pollField(b, indent, colon, "last_asked", true)
	b = jsonTime(b, p.LastAsked)
	b = pollField(b, indent, colon, "answer", true)
	b = jsonstr.Append(b, p.Answer)
	b = pollField(b, indent, colon, "withheld", true)
	b = strconv.AppendBool(b, p.Withheld)
	if p.Kept != "" {
		b = jsonstr.Append(pollField(b, indent, colon, "kept", true), p.Kept)
	}
	b = pollField(b, indent, colon, "count", true)
	b = strconv.AppendUint(b, p.Count, 10)
	if p.Replica != "" {
		b = jsonstr.Append(pollField(b, indent, colon, "replica", true), p.Replica)
	}
	b = append(b, end...)
	return append(b, '}')
}

// pollField appends a field's name (a plain one) after the previous
// field's comma, when not the first, with its indentation (none when
// compact) and colon.
func pollField(b []byte, indent, colon, name string, comma bool) []byte {
	if comma {
		b = append(b, ',')
	}
	b = append(b, indent...)
	b = append(b, '"')
	b = append(b, name...)
	b = append(b, '"')
	return append(b, colon...)
}
