package server

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/hastate/hastate/api"
	"github.com/hastate/hastate/internal/jsonstr"
)

// The /v1/state body of a big fleet is the largest answer a replica gives
// (10,000 rows are about 6 MB), and the agent shares the replica's CPU
// with whoever asks for it. writeStateView writes exactly what writeJSON
// would (encoding/json, indented by two spaces: TestStateViewJSONIsWriteJSONs
// compares them byte for byte), but its rows through appendRow, which
// knows api.ServerState's fields: no reflection and no second pass to
// indent, about a sixth of encoding/json's CPU (BenchmarkStateViewJSON), and it
// yields to the agent now and then (yield.go).

// writeStateView writes v as the body of a 200 answer.
func writeStateView(w http.ResponseWriter, v api.StateView) {
	rows := v.Servers
	if len(rows) == 0 {
		writeJSON(w, http.StatusOK, v)
		return
	}
	v.Servers = []api.ServerState{}
	var head bytes.Buffer
	enc := json.NewEncoder(&head)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
	// "servers" is the third field, after a string and a bool: its
	// empty list is the first line of this form.
	const list = "\n  \"servers\": ["
	at := bytes.Index(head.Bytes(), []byte(list+"]"))
	if at < 0 {
		v.Servers = rows
		writeJSON(w, http.StatusOK, v) // not that form: encoding/json alone
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriterSize(w, 64<<10)
	_, _ = bw.Write(head.Bytes()[:at+len(list)])
	buf := make([]byte, 0, 2048)
	var yield yielder
	for i := range rows {
		buf = buf[:0]
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = append(buf, "\n    "...)
		buf = appendRow(buf, &rows[i])
		_, _ = bw.Write(buf)
		yield.step()
	}
	_, _ = bw.WriteString("\n  ]")
	_, _ = bw.Write(head.Bytes()[at+len(list)+1:])
	_ = bw.Flush()
}

// rowIndent is the indentation of a row's fields in writeStateView's
// answer, and of a ramp's fields one level deeper.
const (
	rowIndent  = "\n      "
	rampIndent = "\n        "
)

// appendRow appends r as encoding/json indents it at a row's depth of a
// StateView's servers, the fields in their struct order, omitempty kept.
func appendRow(b []byte, r *api.ServerState) []byte {
	b = append(b, '{')
	b = jsonField(b, rowIndent, "backend", false)
	b = jsonstr.Append(b, r.Backend)
	b = jsonField(b, rowIndent, "server", true)
	b = jsonstr.Append(b, r.Server)
	b = optString(b, "key", r.Key)
	b = jsonField(b, rowIndent, "source", true)
	b = jsonstr.Append(b, r.Source)
	b = optString(b, "value", r.Value)
	b = optString(b, "desired", r.Desired)
	b = jsonField(b, rowIndent, "valid", true)
	b = strconv.AppendBool(b, r.Valid)
	b = optString(b, "error", r.Error)
	b = optString(b, "note", r.Note)
	b = optString(b, "reason", r.Reason)
	b = optString(b, "by", r.By)
	b = optString(b, "ramp", r.Ramp)
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
	b = optTime(b, "since", r.Since)
	b = optTime(b, "until", r.Until)
	b = optString(b, "expired", r.Expired)
	b = optTime(b, "expired_at", r.ExpiredAt)
	b = jsonField(b, rowIndent, "polled", true)
	b = strconv.AppendInt(b, int64(r.Polled), 10)
	b = jsonField(b, rowIndent, "told", true)
	b = strconv.AppendInt(b, int64(r.Told), 10)
	b = optString(b, "keeps", r.Keeps)
	return append(b, "\n    }"...)
}

// jsonField appends a field's name (a plain one: no escaping) after the
// previous field's comma, when not the first, and its indentation.
func jsonField(b []byte, indent, name string, comma bool) []byte {
	if comma {
		b = append(b, ',')
	}
	b = append(b, indent...)
	b = append(b, '"')
	b = append(b, name...)
	return append(b, "\": "...)
}

func optString(b []byte, name, s string) []byte {
	if s == "" {
		return b
	}
	return jsonstr.Append(jsonField(b, rowIndent, name, true), s)
}

func optTime(b []byte, name string, t *time.Time) []byte {
	if t == nil {
		return b
	}
	return jsonTime(jsonField(b, rowIndent, name, true), *t)
}

// jsonTime appends t as its MarshalJSON does (RFC 3339 with nanoseconds;
// a year outside 0-9999, which MarshalJSON refuses and no row holds, is
// written as AppendFormat writes it).
func jsonTime(b []byte, t time.Time) []byte {
	b = append(b, '"')
	b = t.AppendFormat(b, time.RFC3339Nano)
	return append(b, '"')
}
