package api

import (
	"strconv"
	"time"

	"github.com/hastate/hastate/internal/jsonstr"
)

// The largest JSON hastate writes is lists of rows: /v1/state's servers
// (the replica, server/statejson.go) and `hastate status -o json`'s (the
// CLI). AppendRowJSON writes a row as encoding/json indents it, without
// reflection and without a second pass to indent (about a sixth of
// encoding/json's CPU: server's BenchmarkStateViewJSON); server's
// TestStateViewJSONIsWriteJSONs and the status package's
// TestStatusJSONIsEncodingJSONs compare the two byte for byte.

// rowSpaces holds the indentations AppendRowJSON cuts: a newline and up
// to three levels below the deepest row it writes.
const rowSpaces = "\n                "

// AppendRowJSON appends r as json.Encoder with SetIndent("", "  ")
// writes it at depth (1: an element of a top-level list, as `status -o
// json` writes them; 2: of a list in an object, /v1/state's servers; at
// most 6), the fields in their struct order, omitempty kept. The newline
// and indentation before it are the caller's. A time whose year is outside
// 0-9999, which MarshalJSON refuses and no row holds, is written as
// AppendFormat writes it.
func AppendRowJSON(b []byte, r *ServerState, depth int) []byte {
	rowIndent := rowSpaces[:1+2*(depth+1)]
	rampIndent := rowSpaces[:1+2*(depth+2)]
	b = append(b, '{')
	b = jsonField(b, rowIndent, "backend", false)
	b = jsonstr.Append(b, r.Backend)
	b = jsonField(b, rowIndent, "server", true)
	b = jsonstr.Append(b, r.Server)
	b = optString(b, rowIndent, "key", r.Key)
	b = jsonField(b, rowIndent, "source", true)
	b = jsonstr.Append(b, r.Source)
	b = optString(b, rowIndent, "value", r.Value)
	b = optString(b, rowIndent, "desired", r.Desired)
	b = jsonField(b, rowIndent, "valid", true)
	b = strconv.AppendBool(b, r.Valid)
	b = optString(b, rowIndent, "error", r.Error)
	b = optString(b, rowIndent, "note", r.Note)
	b = optString(b, rowIndent, "reason", r.Reason)
	b = optString(b, rowIndent, "by", r.By)
	b = optString(b, rowIndent, "ramp", r.Ramp)
	b = jsonField(b, rowIndent, "answer", true)
	b = jsonstr.Append(b, r.Answer)
	b = jsonField(b, rowIndent, "withheld", true)
	b = strconv.AppendBool(b, r.Withheld)
	b = jsonField(b, rowIndent, "kind", true)
	b = jsonstr.Append(b, string(r.Kind))
	b = jsonField(b, rowIndent, "weight", true)
	b = strconv.AppendInt(b, int64(r.Weight), 10)
	if p := r.Ramping; p != nil {
		b = jsonField(b, rowIndent, "ramping", true)
		b = append(b, '{')
		b = jsonField(b, rampIndent, "target", false)
		b = jsonstr.Append(b, p.Target)
		b = jsonField(b, rampIndent, "weight_percent", true)
		b = strconv.AppendInt(b, int64(p.WeightPercent), 10)
		b = jsonField(b, rampIndent, "started", true)
		b = jsonTime(b, p.Started)
		b = jsonField(b, rampIndent, "eta", true)
		b = jsonTime(b, p.ETA)
		b = jsonField(b, rampIndent, "duration", true)
		b = jsonstr.Append(b, p.Duration)
		b = jsonField(b, rampIndent, "interval", true)
		b = jsonstr.Append(b, p.Interval)
		b = append(b, rowIndent...)
		b = append(b, '}')
	}
	b = optTime(b, rowIndent, "since", r.Since)
	b = optTime(b, rowIndent, "until", r.Until)
	b = optString(b, rowIndent, "expired", r.Expired)
	b = optTime(b, rowIndent, "expired_at", r.ExpiredAt)
	b = jsonField(b, rowIndent, "polled", true)
	b = strconv.AppendInt(b, int64(r.Polled), 10)
	b = jsonField(b, rowIndent, "told", true)
	b = strconv.AppendInt(b, int64(r.Told), 10)
	b = optString(b, rowIndent, "keeps", r.Keeps)
	b = append(b, rowSpaces[:1+2*depth]...)
	return append(b, '}')
}

// jsonField appends a field's name (a plain one: no escaping) after the
// previous field's comma, when not the first, and its indentation.
func jsonField(b []byte, indent, name string, comma bool) []byte {
	return pollField(b, indent, ": ", name, comma)
}

func optString(b []byte, indent, name, s string) []byte {
	if s == "" {
		return b
	}
	return jsonstr.Append(jsonField(b, indent, name, true), s)
}

func optTime(b []byte, indent, name string, t *time.Time) []byte {
	if t == nil {
		return b
	}
	return jsonTime(jsonField(b, indent, name, true), *t)
}

// jsonTime appends t as its MarshalJSON does (RFC 3339 with nanoseconds).
func jsonTime(b []byte, t time.Time) []byte {
	b = append(b, '"')
	b = t.AppendFormat(b, time.RFC3339Nano)
	return append(b, '"')
}
