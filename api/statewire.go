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

// A /v1/state is chunked, its length unknown; io.ReadAll grows its
// buffer a quarter at a time, each time a fresh one, and a process that
// lives for one read (`status -o json`) pays a page fault for every page
// it touches first: half the CPU of `status -o json` of 10,000 servers
// (a 3 MB body) was the kernel's. readChunks reads the body once into
// chunks it keeps, each (but the last) cut after a row, and
// readStateView reads the rows from the chunks as they stand, in place
// into a list allocated once, with few strings (rowReader.last): the
// body and the rows are each touched once, and nothing is collected
// (page faults 5,170 -> 2,460 a run, CPU 40 -> 25 ms: server/DESIGN.md,
// "The CLI's own cost").

// readChunks reads r to its end as io.ReadAll does (what was read, and
// the error that stopped it; none at io.EOF), into chunks of doubling
// size from first to most bytes. A full chunk is cut after its last
// rowEnd, if it has one, and what follows opens the next chunk: a row
// AppendRowJSON writes at depth 2 ends so, and no row holds a raw
// newline, so every row of a chunk ends in it.
func readChunks(r io.Reader, first, most int) ([][]byte, error) {
	var chunks [][]byte
	var carry []byte
	for size := first; ; size = min(2*size, most) {
		c := append(make([]byte, 0, max(size, 2*len(carry))), carry...)
		var err error
		for len(c) < cap(c) && err == nil {
			var n int
			n, err = r.Read(c[len(c):cap(c)])
			c = c[:len(c)+n]
		}
		carry = nil
		if err == nil {
			if i := bytes.LastIndex(c, []byte(rowEnd)); i >= 0 {
				c, carry = c[:i+len(rowEnd)], c[i+len(rowEnd):]
			}
		}
		if len(c) > 0 {
			chunks = append(chunks, c)
		}
		switch {
		case err == io.EOF:
			return chunks, nil
		case err != nil:
			return chunks, err
		}
	}
}

// The chunks readChunks reads a body into: the first holds a few hundred
// rows, the largest a few thousand.
const (
	firstChunk = 64 << 10
	maxChunk   = 1 << 20
)

// rowEnd ends a row of /v1/state's servers.
const rowEnd = "\n    }"

// chunksReader reads the chunks one after the other.
func chunksReader(chunks [][]byte) io.Reader {
	rs := make([]io.Reader, len(chunks))
	for i, c := range chunks {
		rs[i] = bytes.NewReader(c)
	}
	return io.MultiReader(rs...)
}

// decodeState reads a /v1/state body, in chunks, as json.Decoder reads
// its first value into a StateView (which it does when readStateView
// does not: its errors are encoding/json's own).
func decodeState(chunks [][]byte) (StateView, error) {
	if v, ok := readStateView(chunks); ok {
		return v, nil
	}
	var v StateView
	err := json.NewDecoder(chunksReader(chunks)).Decode(&v)
	return v, err
}

// rowLines is the fewest lines a row of /v1/state's servers spans: its
// braces' and its ten fields that omitempty does not leave out.
const rowLines = 12

// stateList is where the servers' list begins in a replica's answer,
// after scope and holds_state.
const stateList = "\n  \"servers\": ["

// readStateView reads a body, in chunks, by hand when its servers are
// in AppendRowJSON's form (false: not that form, a row across two chunks,
// or an error, which encoding/json is to report).
func readStateView(chunks [][]byte) (StateView, bool) {
	if len(chunks) == 0 {
		return StateView{}, false
	}
	// The fields before the list, in their order: the list is the view's.
	r := rowReader{Reader: jsonstr.Reader{B: chunks[0]}}
	var scope string
	var holds bool
	if !r.Lit("{\n  \"scope\": ") || !r.str(slotScope, &scope) || !r.Lit(",\n  \"holds_state\": ") || !r.bool(&holds) || !r.Lit(",") {
		return StateView{}, false
	}
	at := r.I
	if !r.Lit(stateList) || r.I >= len(r.B) || r.B[r.I] == ']' {
		return StateView{}, false
	}
	// A row begins on a line of its own: no string holds a raw newline.
	// A row has a '{' and rowLines lines or more: the fewer of the two
	// counts (each of one byte, which bytes.Count counts fastest) bounds
	// the rows read. A row begins in one chunk and ends in the next only
	// where a chunk has no rowEnd: this reads as far as that chunk and
	// leaves the body to encoding/json.
	braces, lines := 0, 0
	for _, c := range chunks {
		braces += bytes.Count(c, []byte("{"))
		lines += bytes.Count(c, []byte("\n"))
	}
	n := min(braces, lines/rowLines)
	rows := make([]ServerState, 0, n)
	next := 1
	for {
		if !r.Lit("\n    ") {
			return StateView{}, false
		}
		// Read in place, not copied in.
		rows = append(rows, ServerState{})
		row := &rows[len(rows)-1]
		if !r.row(row) {
			return StateView{}, false
		}
		if row.Kind == "" {
			row.Kind, row.Weight = kindOfAnswer(*row)
		}
		if r.I == len(r.B) && next < len(chunks) {
			// r.last keeps pointing into the chunks it read.
			r.B, r.I, next = chunks[next], 0, next+1
		}
		if r.Lit(",") {
			continue
		}
		if !r.Lit("\n  ]") {
			return StateView{}, false
		}
		break
	}
	rest := r.B[r.I:]
	if next < len(chunks) {
		rest = bytes.Join(append([][]byte{rest}, chunks[next:]...), nil)
	}
	// A second "servers" would replace the first in encoding/json.
	if bytes.Contains(rest, []byte(`"servers"`)) {
		return StateView{}, false
	}
	head := make([]byte, 0, at+len(stateList)+1+len(rest))
	head = append(append(append(head, chunks[0][:at+len(stateList)]...), ']'), rest...)
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
	// last is, per string field (a slot), the two values last read, the
	// latest first, each with its JSON text (quotes and escapes) in the
	// body: a value whose text is one of them is that string, not a new
	// one. Most fields repeat from one row to the next, or alternate (a
	// backend's name over its servers, "absent" and a key, "ready 100%"
	// and "drain", a reason given to many): 10,000 rows were some 40,000
	// strings, most of them equal to one of the two before.
	last [slots][2]interned
}

// interned is a string read and the JSON text it was read from.
type interned struct {
	text []byte
	s    string
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

// A row's fields, each on a line of its own, and a ramp's: a field is
// read as one literal, its comma, its line and its name.
const (
	rowField  = "\n      \""
	rampField = "\n        \""
	rowNext   = "," + rowField
	rampNext  = "," + rampField
)

// str reads a string into slot: one of the slot's last two when its
// JSON text is the same (the same text reads as the same string), else
// by hand when it has no escapes, else by encoding/json (its escapes,
// U+2028, invalid UTF-8).
func (r *rowReader) str(slot int, s *string) bool {
	return r.strLike(slot, s, "")
}

// strLike is str, with like (a string of the row read before: the key,
// for a source that is its key) taken as it is when it is the value.
func (r *rowReader) strLike(slot int, s *string, like string) bool {
	from := r.I
	if start, end, ok := r.Str(); ok {
		text := r.B[from:r.I]
		v, ok := r.known(slot, text)
		if !ok {
			if v = like; string(r.B[start:end]) != like {
				v = string(r.B[start:end])
			}
			r.keep(slot, text, v)
		}
		*s = v
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
	text := r.B[r.I : end+1]
	v, ok := r.known(slot, text)
	if !ok {
		// Not into s, nor v: what Unmarshal is handed is on the heap,
		// and a row whose string it was (the row, when read into a
		// variable; kind, v) was allocated for every row.
		u := new(string)
		if json.Unmarshal(text, u) != nil {
			return false
		}
		v = *u
		r.keep(slot, text, v)
	}
	*s = v
	r.I = end + 1
	return true
}

// known is the string of the slot's last two read from text, if one was.
func (r *rowReader) known(slot int, text []byte) (string, bool) {
	l := &r.last[slot]
	switch string(text) {
	case string(l[0].text):
		return l[0].s, true
	case string(l[1].text):
		l[0], l[1] = l[1], l[0]
		return l[0].s, true
	}
	return "", false
}

// keep makes s, read from text, the slot's latest.
func (r *rowReader) keep(slot int, text []byte, s string) {
	l := &r.last[slot]
	l[1], l[0] = l[0], interned{text, s}
}

// optStr reads an optional string field, if it is there (field: its
// comma, line and name).
func (r *rowReader) optStr(field string, slot int, s *string) bool {
	return !r.Lit(field) || r.str(slot, s)
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

func (r *rowReader) optTime(field string, t **time.Time) bool {
	if !r.Lit(field) {
		return true
	}
	*t = new(time.Time)
	return r.time(*t)
}

// row reads the fields of s in their struct order, omitempty kept.
func (r *rowReader) row(s *ServerState) bool {
	var kind string
	ok := r.Lit("{"+rowField+"backend\": ") && r.str(slotBackend, &s.Backend) &&
		r.Lit(rowNext+"server\": ") && r.str(slotServer, &s.Server) &&
		r.optStr(rowNext+"key\": ", slotKey, &s.Key) &&
		r.Lit(rowNext+"source\": ") && r.strLike(slotSource, &s.Source, s.Key) &&
		r.optStr(rowNext+"value\": ", slotValue, &s.Value) &&
		r.optStr(rowNext+"desired\": ", slotDesired, &s.Desired) &&
		r.Lit(rowNext+"valid\": ") && r.bool(&s.Valid) &&
		r.optStr(rowNext+"error\": ", slotError, &s.Error) &&
		r.optStr(rowNext+"note\": ", slotNote, &s.Note) &&
		r.optStr(rowNext+"reason\": ", slotReason, &s.Reason) &&
		r.optStr(rowNext+"by\": ", slotBy, &s.By) &&
		r.optStr(rowNext+"ramp\": ", slotRamp, &s.Ramp) &&
		r.Lit(rowNext+"answer\": ") && r.str(slotAnswer, &s.Answer) &&
		r.Lit(rowNext+"withheld\": ") && r.bool(&s.Withheld) &&
		r.Lit(rowNext+"kind\": ") && r.str(slotKind, &kind) &&
		r.Lit(rowNext+"weight\": ") && r.int(&s.Weight)
	if !ok {
		return false
	}
	s.Kind = Kind(kind)
	if r.Lit(rowNext + "ramping\": {") {
		p := new(RampProgress)
		s.Ramping = p
		if !(r.Lit(rampField+"target\": ") && r.str(slotTarget, &p.Target) &&
			r.Lit(rampNext+"weight_percent\": ") && r.int(&p.WeightPercent) &&
			r.Lit(rampNext+"started\": ") && r.time(&p.Started) &&
			r.Lit(rampNext+"eta\": ") && r.time(&p.ETA) &&
			r.Lit(rampNext+"duration\": ") && r.str(slotDuration, &p.Duration) &&
			r.Lit(rampNext+"interval\": ") && r.str(slotInterval, &p.Interval) &&
			r.Lit("\n      }")) {
			return false
		}
	}
	return r.optTime(rowNext+"since\": ", &s.Since) &&
		r.optTime(rowNext+"until\": ", &s.Until) &&
		r.optStr(rowNext+"expired\": ", slotExpired, &s.Expired) &&
		r.optTime(rowNext+"expired_at\": ", &s.ExpiredAt) &&
		r.Lit(rowNext+"polled\": ") && r.int(&s.Polled) &&
		r.Lit(rowNext+"told\": ") && r.int(&s.Told) &&
		r.optStr(rowNext+"keeps\": ", slotKeeps, &s.Keeps) &&
		r.Lit("\n    }")
}
