package api

import (
	"bytes"
	"encoding/json"
	"io"
	"time"

	"github.com/hastate/hastate/internal/jsonstr"
)

// `hastate status -o json` of 10,000 servers spent most of its CPU
// decoding /v1/state's rows with encoding/json (reflection over a few
// MB). readStateView reads the rows in the one form a replica writes
// them (AppendRowJSON at depth 2, server/statejson.go) by hand, and the
// rest of the view (a few hundred bytes) with encoding/json; anything
// else, it leaves the whole body to encoding/json (decodeState), so that
// what StateOf returns is what encoding/json reads:
// TestReadStateViewIsEncodingJSONs compares the two on random views.

// readBody reads r to its end as io.ReadAll does (what was read, and the
// error that stopped it; none at io.EOF), without io.ReadAll's growth: a
// /v1/state is chunked, its length unknown, and io.ReadAll grows its
// buffer by a quarter at a time, so that reading 3 MB touched 14 MB of
// fresh memory, a page fault a page, in a process that lives for the one
// read (`status -o json`: half its CPU was the kernel's). readBody reads
// into chunks of doubling size that it keeps, then copies them once
// into a buffer of the exact length: about twice the body.
func readBody(r io.Reader) ([]byte, error) {
	var chunks [][]byte
	total := 0
	for size := firstChunk; ; size = min(2*size, maxChunk) {
		c := make([]byte, 0, size)
		var err error
		for len(c) < cap(c) && err == nil {
			var n int
			n, err = r.Read(c[len(c):cap(c)])
			c = c[:len(c)+n]
		}
		total += len(c)
		if err == nil {
			chunks = append(chunks, c)
			continue
		}
		if err == io.EOF {
			err = nil
		}
		if len(chunks) == 0 {
			return c, err
		}
		b := make([]byte, 0, total)
		for _, x := range chunks {
			b = append(b, x...)
		}
		return append(b, c...), err
	}
}

// The chunks readBody reads into: the first holds a page of rows, the
// largest a few hundred thousand rows' worth.
const (
	firstChunk = 64 << 10
	maxChunk   = 1 << 20
)

// decodeState reads a /v1/state body as json.Decoder reads its first
// value into a StateView (which it does when readStateView does not: its
// errors are encoding/json's own).
func decodeState(body []byte) (StateView, error) {
	if v, ok := readStateView(body); ok {
		return v, nil
	}
	var v StateView
	err := json.NewDecoder(bytes.NewReader(body)).Decode(&v)
	return v, err
}

// stateList is where the servers' list begins in a replica's answer,
// after scope and holds_state.
const stateList = "\n  \"servers\": ["

// readStateView reads body by hand when its servers are in
// AppendRowJSON's form (false: not that form, or an error, which
// encoding/json is to report).
func readStateView(body []byte) (StateView, bool) {
	// The fields before the list, in their order: the list is the view's.
	r := rowReader{Reader: jsonstr.Reader{B: body}}
	var scope string
	var holds bool
	if !r.Lit("{\n  \"scope\": ") || !r.str(slotScope, &scope) || !r.Lit(",\n  \"holds_state\": ") || !r.bool(&holds) || !r.Lit(",") {
		return StateView{}, false
	}
	at := r.I
	if !r.Lit(stateList) || r.I >= len(body) || body[r.I] == ']' {
		return StateView{}, false
	}
	// A row begins on a line of its own: no string holds a raw newline.
	rows := make([]ServerState, 0, bytes.Count(body[r.I:], []byte("\n    {")))
	for {
		if !r.Lit("\n    ") {
			return StateView{}, false
		}
		// Read in place: a row read into a variable of its own escaped,
		// and 10,000 rows were each allocated twice.
		rows = append(rows, ServerState{})
		row := &rows[len(rows)-1]
		if !r.row(row) {
			return StateView{}, false
		}
		if row.Kind == "" {
			row.Kind, row.Weight = kindOfAnswer(*row)
		}
		if r.Lit(",") {
			continue
		}
		if !r.Lit("\n  ]") {
			return StateView{}, false
		}
		break
	}
	rest := body[r.I:]
	// A second "servers" would replace the first in encoding/json.
	if bytes.Contains(rest, []byte(`"servers"`)) {
		return StateView{}, false
	}
	head := make([]byte, 0, at+len(stateList)+1+len(rest))
	head = append(append(append(head, body[:at+len(stateList)]...), ']'), rest...)
	var v StateView
	if err := json.NewDecoder(bytes.NewReader(head)).Decode(&v); err != nil || len(v.Servers) != 0 {
		return StateView{}, false
	}
	v.Servers = rows
	return v, true
}

// rowReader reads a row as AppendRowJSON writes it at depth 2.
type rowReader struct {
	jsonstr.Reader
	// last is, per string field (a slot), the previous row's value and
	// its JSON text (quotes and escapes) in B: a value whose text is the
	// same is the same string, not a new one. Most fields repeat from
	// one row to the next (a backend's name over its servers, "absent",
	// "ready 100%", "ready", a reason given to many): 10,000 rows were
	// some 40,000 strings, most of them equal to the one before.
	last [slots]struct {
		text []byte
		s    string
	}
}

// The string fields rowReader reads, each a slot of rowReader.last.
const (
	slotBackend = iota
	slotServer
	slotKey
	slotSource
	slotValue
	slotDesired
	slotError
	slotNote
	slotReason
	slotBy
	slotRamp
	slotAnswer
	slotKind
	slotTarget
	slotDuration
	slotInterval
	slotExpired
	slotKeeps
	slotScope // the view's, read once
	slots
)

const (
	rowField  = "\n      \""
	rampField = "\n        \""
)

// field reads a field's name after its comma (none for the first).
func (r *rowReader) field(indent, name string, first bool) bool {
	if !first && !r.Lit(",") {
		return false
	}
	return r.Lit(indent) && r.Lit(name) && r.Lit("\": ")
}

// str reads a string into slot: the previous row's string of the slot
// when its JSON text is the same (the same text reads as the same
// string), else by hand when it has no escapes, else by encoding/json
// (its escapes, U+2028, invalid UTF-8).
func (r *rowReader) str(slot int, s *string) bool {
	from := r.I
	if start, end, ok := r.Str(); ok {
		last := &r.last[slot]
		if string(r.B[from:r.I]) != string(last.text) {
			last.text, last.s = r.B[from:r.I], string(r.B[start:end])
		}
		*s = last.s
		return true
	}
	if r.I >= len(r.B) || r.B[r.I] != '"' {
		return false
	}
	end := r.I + 1
	for ; end < len(r.B) && r.B[end] != '"'; end++ {
		if r.B[end] == '\\' {
			end++
		}
	}
	if end >= len(r.B) {
		return false
	}
	last := &r.last[slot]
	if text := r.B[r.I : end+1]; string(text) != string(last.text) {
		var v string
		if json.Unmarshal(text, &v) != nil {
			return false
		}
		last.text, last.s = text, v
	}
	*s = last.s
	r.I = end + 1
	return true
}

// opt reads an optional field's name, if it is there.
func (r *rowReader) opt(name string) bool {
	at := r.I
	if r.field(rowField, name, false) {
		return true
	}
	r.I = at
	return false
}

func (r *rowReader) optStr(name string, slot int, s *string) bool {
	return !r.opt(name) || r.str(slot, s)
}

func (r *rowReader) int(x *int) bool {
	n, ok := r.Int()
	*x = int(n)
	return ok && int64(*x) == n
}

func (r *rowReader) bool(x *bool) bool {
	switch {
	case r.Lit("true"):
		*x = true
	case r.Lit("false"):
		*x = false
	default:
		return false
	}
	return true
}

// time reads a time through its UnmarshalJSON, as encoding/json does.
func (r *rowReader) time(t *time.Time) bool {
	from := r.I
	if _, _, ok := r.Str(); !ok {
		return false
	}
	if t.UnmarshalJSON(r.B[from:r.I]) != nil {
		r.I = from
		return false
	}
	return true
}

func (r *rowReader) optTime(name string, t **time.Time) bool {
	if !r.opt(name) {
		return true
	}
	*t = new(time.Time)
	return r.time(*t)
}

// row reads the fields of s in their struct order, omitempty kept.
func (r *rowReader) row(s *ServerState) bool {
	var kind string
	ok := r.Lit("{") &&
		r.field(rowField, "backend", true) && r.str(slotBackend, &s.Backend) &&
		r.field(rowField, "server", false) && r.str(slotServer, &s.Server) &&
		r.optStr("key", slotKey, &s.Key) &&
		r.field(rowField, "source", false) && r.str(slotSource, &s.Source) &&
		r.optStr("value", slotValue, &s.Value) &&
		r.optStr("desired", slotDesired, &s.Desired) &&
		r.field(rowField, "valid", false) && r.bool(&s.Valid) &&
		r.optStr("error", slotError, &s.Error) &&
		r.optStr("note", slotNote, &s.Note) &&
		r.optStr("reason", slotReason, &s.Reason) &&
		r.optStr("by", slotBy, &s.By) &&
		r.optStr("ramp", slotRamp, &s.Ramp) &&
		r.field(rowField, "answer", false) && r.str(slotAnswer, &s.Answer) &&
		r.field(rowField, "withheld", false) && r.bool(&s.Withheld) &&
		r.field(rowField, "kind", false) && r.str(slotKind, &kind) &&
		r.field(rowField, "weight", false) && r.int(&s.Weight)
	if !ok {
		return false
	}
	s.Kind = Kind(kind)
	if r.Lit("," + rowField + "ramping\": {") {
		p := new(RampProgress)
		s.Ramping = p
		if !(r.field(rampField, "target", true) && r.str(slotTarget, &p.Target) &&
			r.field(rampField, "weight_percent", false) && r.int(&p.WeightPercent) &&
			r.field(rampField, "started", false) && r.time(&p.Started) &&
			r.field(rampField, "eta", false) && r.time(&p.ETA) &&
			r.field(rampField, "duration", false) && r.str(slotDuration, &p.Duration) &&
			r.field(rampField, "interval", false) && r.str(slotInterval, &p.Interval) &&
			r.Lit("\n      }")) {
			return false
		}
	}
	return r.optTime("since", &s.Since) &&
		r.optTime("until", &s.Until) &&
		r.optStr("expired", slotExpired, &s.Expired) &&
		r.optTime("expired_at", &s.ExpiredAt) &&
		r.field(rowField, "polled", false) && r.int(&s.Polled) &&
		r.field(rowField, "told", false) && r.int(&s.Told) &&
		r.optStr("keeps", slotKeeps, &s.Keeps) &&
		r.Lit("\n    }")
}
