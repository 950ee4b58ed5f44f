package server

import (
	"bytes"
	"encoding/base64"
	"math"
	"strings"

	"github.com/hastate/hastate/internal/jsonstr"
)

// The asker of a peer's poll-summary reads it in one pass, without
// reflection: at 1,000,000 pairs an answer is about 1 MB, which
// encoding/json scanned several times and decoded by reflection. The
// form read here is exactly what MarshalJSON writes (its fields in that
// order, compact, strings without escapes); anything else (another
// release's form, escapes, whitespace, unknown fields) is left to
// encoding/json (unmarshalJSON), and so is an answer that form reads
// but that is malformed, so that its error is the one it always was.
// Each server is made as it is read: its names cut from one copy of the
// strings' bytes, its base64 decoded into a scratch buffer and unpacked
// at once into one array of every server's polls, or of their counts
// (server/DESIGN.md, "The asker's decoding"). The JSON itself (literals,
// strings without escapes, integers, the end) is read by jsonstr.Reader,
// as the raft port's answer lines are (cluster/confirm/wire.go); what is
// the summary's own (base64, the lists, the servers, the source sets) is
// read here.

// DecodeJSONLine reads the wire form as MarshalJSON writes it (a line of
// it: trailing whitespace is allowed), reporting false, with s left as
// it was, when the line is in another form or is malformed: the caller
// then reads it with encoding/json (json.Unmarshal, UnmarshalJSON), which
// reads any form and reports what is wrong.
func (s *PollSummary) DecodeJSONLine(line []byte) bool {
	d := wireReader{Reader: jsonstr.Reader{B: line}}
	// Every string's bytes go into one buffer, made for a quarter of the
	// line (the names are about 15% of an answer of counts, 3% of one of
	// polls). A string cut from it stays as it was when it grows: the
	// bytes are copied into a new array, the old one is not written again.
	d.text.Grow(len(line) / 4)
	out, ok := d.summary()
	if ok {
		*s = out
	}
	return ok
}

// wireReader reads the wire form from B at I.
type wireReader struct {
	jsonstr.Reader
	text    strings.Builder // every string's bytes
	scratch []byte          // one server's base64 decoded
	// What the servers' packed forms index: numbers of sources and
	// answers, and the greatest source set a counts names (-1: none).
	sources, answers int
	maxSet           int64
	at               int64
	// The arrays the servers' polls and counts are cut from.
	polls  []SourcePoll
	counts []ServerCounts
	pairs  []AnswerCount
}

// summary reads the whole input.
func (d *wireReader) summary() (PollSummary, bool) {
	var out PollSummary
	if !d.Lit(`{"at_unix_ms":`) {
		return out, false
	}
	var ok bool
	if d.at, ok = d.Int(); !ok || !d.Lit(`,"sources":`) {
		return out, false
	}
	if out.Sources, ok = d.strings(); !ok || !d.Lit(`,"answers":`) {
		return out, false
	}
	if out.Answers, ok = d.strings(); !ok || !d.Lit(`,"servers":`) {
		return out, false
	}
	if len(out.Answers) == 0 {
		out.Answers = []string{""}
	}
	d.sources, d.answers, d.maxSet = len(out.Sources), len(out.Answers), -1
	if out.Servers, ok = d.servers(); !ok { // null and []: no server (unmarshalJSON's make)
		return out, false
	}
	if d.Lit(`,"source_sets":`) {
		if out.SourceSets, ok = d.sourceSets(); !ok {
			return out, false
		}
	}
	if d.maxSet >= int64(len(out.SourceSets)) {
		return out, false
	}
	for _, set := range out.SourceSets {
		if checkSourceSet(set, len(out.Sources)) != nil {
			return out, false
		}
	}
	if d.Lit(`,"next":`) {
		if out.Next, ok = d.str(); !ok {
			return out, false
		}
	}
	if !d.Lit("}") || !d.AtEnd() {
		return out, false
	}
	return out, true
}

// str reads a string (jsonstr.Reader.Str), cut from the copy of every
// string.
func (d *wireReader) str() (string, bool) {
	off, end, ok := d.Str()
	if !ok {
		return "", false
	}
	at := d.text.Len()
	d.text.Write(d.B[off:end])
	return d.text.String()[at:], true
}

// base64 decodes a string of base64 into d.scratch. A CR or LF in it,
// which base64 skips, is not JSON: refused.
func (d *wireReader) base64() ([]byte, bool) {
	if d.I >= len(d.B) || d.B[d.I] != '"' {
		return nil, false
	}
	off := d.I + 1
	k := bytes.IndexByte(d.B[off:], '"')
	if k < 0 {
		return nil, false
	}
	span := d.B[off : off+k]
	for _, c := range span {
		if c == '\r' || c == '\n' {
			return nil, false
		}
	}
	if n := base64.StdEncoding.DecodedLen(len(span)); cap(d.scratch) < n {
		d.scratch = make([]byte, max(n, 256))
	}
	n, err := base64.StdEncoding.Decode(d.scratch[:cap(d.scratch)], span)
	if err != nil {
		return nil, false
	}
	d.I = off + k + 1
	return d.scratch[:n], true
}

// strings reads null or a list of strings.
func (d *wireReader) strings() ([]string, bool) {
	if d.Lit("null") {
		return nil, true
	}
	if !d.Lit("[") {
		return nil, false
	}
	var l []string
	if end := bytes.IndexByte(d.B[d.I:], ']'); end > 0 { // a guess: a name may hold ] or ","
		l = make([]string, 0, bytes.Count(d.B[d.I:d.I+end], []byte(`","`))+1)
	}
	if d.Lit("]") {
		return []string{}, true
	}
	for {
		s, ok := d.str()
		if !ok {
			return nil, false
		}
		l = append(l, s)
		if d.Lit("]") {
			return l, true
		}
		if !d.Lit(",") {
			return nil, false
		}
	}
}

// servers reads null or the list of servers, each made as it is read.
func (d *wireReader) servers() ([]ServerPolls, bool) {
	if d.Lit("null") {
		return []ServerPolls{}, true
	}
	if !d.Lit("[") {
		return nil, false
	}
	// No more servers than braces (bytes.Count of one byte is fast).
	l := make([]ServerPolls, 0, bytes.Count(d.B[d.I:], []byte("{")))
	if d.Lit("]") {
		return l, true
	}
	for {
		var sv ServerPolls
		var ok bool
		if !d.Lit(`{"backend":`) {
			return nil, false
		}
		if sv.Backend, ok = d.str(); !ok || !d.Lit(`,"server":`) {
			return nil, false
		}
		if sv.Server, ok = d.str(); !ok || !d.Lit(`,"polls":`) {
			return nil, false
		}
		var polls []byte
		pollsNull := d.Lit("null")
		if !pollsNull {
			if polls, ok = d.base64(); !ok {
				return nil, false
			}
			// Unpacked now: the next base64 reuses the scratch.
			if ok = d.unpackPolls(&sv, polls); !ok {
				return nil, false
			}
		}
		if d.Lit(`,"counts":`) {
			// MarshalJSON writes polls or counts, not both.
			if !pollsNull {
				return nil, false
			}
			counts, ok := d.base64()
			if !ok || (len(counts) > 0 && !d.unpackCounts(&sv, counts, cap(l)-len(l))) {
				return nil, false
			}
		}
		if !d.Lit("}") {
			return nil, false
		}
		l = append(l, sv)
		if d.Lit("]") {
			return l, true
		}
		if !d.Lit(",") {
			return nil, false
		}
	}
}

// unpackPolls unpacks one server's polls into d.polls (unpackPolls),
// made the first time with room for every poll the rest of the input
// can hold (at least 5 packed bytes each, 4 base64 bytes for 3).
func (d *wireReader) unpackPolls(sv *ServerPolls, b []byte) bool {
	if len(b) == 0 {
		return true
	}
	if d.polls == nil {
		d.polls = make([]SourcePoll, 0, len(b)/5+(len(d.B)-d.I)*3/4/5)
	}
	start := len(d.polls)
	var err error
	if d.polls, err = unpackPolls(d.polls, b, d.at, d.sources, d.answers); err != nil {
		return false
	}
	if len(d.polls) > start {
		sv.Polls = d.polls[start:len(d.polls):len(d.polls)]
	}
	return true
}

// unpackCounts unpacks one server's counts into d.counts and d.pairs
// (unpackCounts), made the first time for the servers left (at most
// left, this one included): its source set is checked against the sets
// when they have been read.
func (d *wireReader) unpackCounts(sv *ServerPolls, b []byte, left int) bool {
	if len(d.counts) == cap(d.counts) {
		n := max(left, 1)
		d.counts = make([]ServerCounts, 0, n)
		if cap(d.pairs)-len(d.pairs) < n {
			d.pairs = make([]AnswerCount, 0, 2*n) // a server's HAProxy nodes were told one or two answers
		}
	}
	d.counts = d.counts[:len(d.counts)+1]
	c := &d.counts[len(d.counts)-1]
	var err error
	if d.pairs, err = unpackCounts(c, d.pairs, b, math.MaxInt32, d.answers); err != nil {
		return false
	}
	d.maxSet = max(d.maxSet, int64(c.Sources))
	sv.Counts = c
	return true
}

// sourceSets reads null or the lists of indexes, into one array.
func (d *wireReader) sourceSets() ([][]int32, bool) {
	if d.Lit("null") {
		return nil, true
	}
	if !d.Lit("[") {
		return nil, false
	}
	type ref struct{ start, end int } // start -1: null
	// What follows is the sets and next, at most: no more indexes
	// than commas, and sets than brackets.
	rest := d.B[d.I:]
	all := make([]int32, 0, bytes.Count(rest, []byte(","))+1)
	refs := make([]ref, 0, bytes.Count(rest, []byte("[")))
	if d.Lit("]") {
		return [][]int32{}, true
	}
	for {
		r := ref{start: -1}
		if !d.Lit("null") {
			if !d.Lit("[") {
				return nil, false
			}
			r.start = len(all)
			if !d.Lit("]") {
				for {
					x, ok := d.Int()
					if !ok || x < -1<<31 || x >= 1<<31 {
						return nil, false
					}
					all = append(all, int32(x))
					if d.Lit("]") {
						break
					}
					if !d.Lit(",") {
						return nil, false
					}
				}
			}
			r.end = len(all)
		}
		refs = append(refs, r)
		if d.Lit("]") {
			break
		}
		if !d.Lit(",") {
			return nil, false
		}
	}
	sets := make([][]int32, len(refs))
	for k, r := range refs {
		switch {
		case r.start < 0:
		case r.start == r.end:
			sets[k] = []int32{} // as encoding/json reads []
		default:
			sets[k] = all[r.start:r.end:r.end]
		}
	}
	return sets, true
}
