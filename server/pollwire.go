package server

import (
	"bytes"
	"encoding/base64"
	"slices"
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
// The strings are cut from one copy of their bytes, the polls of every
// server from one array, the counts too (server/DESIGN.md, "The asker's
// decoding"). The JSON itself (literals, strings without escapes,
// integers, the end) is read by jsonstr.Reader, as the raft port's
// answer lines are (cluster/confirm/wire.go); what is the summary's own
// (base64, the lists, the servers, the source sets) is read here.

// DecodeJSONLine reads the wire form as MarshalJSON writes it (a line of
// it: trailing whitespace is allowed), reporting false, with s left as
// it was, when the line is in another form or is malformed: the caller
// then reads it with encoding/json (json.Unmarshal, UnmarshalJSON), which
// reads any form and reports what is wrong.
func (s *PollSummary) DecodeJSONLine(line []byte) bool {
	d := wireReader{Reader: jsonstr.Reader{B: line}}
	out, ok := d.summary()
	if ok {
		*s = out
	}
	return ok
}

// wireReader reads the wire form from B at I.
type wireReader struct {
	jsonstr.Reader
	strs []wireString // every string read, in order
	size int          // their bytes
}

// wireString is a string of the input, b[off:end], at at in the copy of
// every string.
type wireString struct{ off, end, at int }

// wireServerAt is one server of the input: its names (indexes in strs),
// and its polls' and counts' base64 (b[off:end]; polls null: -1).
type wireServerAt struct {
	backend, server      int
	polls, pollsEnd      int
	counts, countsEnd    int
	pollsNull, hasCounts bool
}

// summary reads the whole input.
func (d *wireReader) summary() (PollSummary, bool) {
	var out PollSummary
	if !d.Lit(`{"at_unix_ms":`) {
		return out, false
	}
	at, ok := d.Int()
	if !ok || !d.Lit(`,"sources":`) {
		return out, false
	}
	sources, sourcesNull, ok := d.strings()
	if !ok || !d.Lit(`,"answers":`) {
		return out, false
	}
	answers, answersNull, ok := d.strings()
	if !ok || !d.Lit(`,"servers":`) {
		return out, false
	}
	servers, ok := d.servers() // null and []: no server (unmarshalJSON's make)
	if !ok {
		return out, false
	}
	var sets [][]int32
	if d.Lit(`,"source_sets":`) {
		if sets, ok = d.sourceSets(); !ok {
			return out, false
		}
	}
	next := -1
	if d.Lit(`,"next":`) {
		if next, ok = d.str(); !ok {
			return out, false
		}
	}
	if !d.Lit("}") || !d.AtEnd() {
		return out, false
	}
	// The strings, from one copy.
	var sb strings.Builder
	sb.Grow(d.size)
	for _, s := range d.strs {
		sb.Write(d.B[s.off:s.end])
	}
	all := sb.String()
	text := func(k int) string { s := d.strs[k]; return all[s.at : s.at+s.end-s.off] }
	list := func(r [2]int, null bool) []string {
		if null {
			return nil
		}
		l := make([]string, r[1]-r[0])
		for k := range l {
			l[k] = text(r[0] + k)
		}
		return l
	}
	out.Sources = list(sources, sourcesNull)
	if out.Answers = list(answers, answersNull); len(out.Answers) == 0 {
		out.Answers = []string{""}
	}
	if next >= 0 {
		out.Next = text(next)
	}
	out.SourceSets = sets
	for _, set := range sets {
		if checkSourceSet(set, len(out.Sources)) != nil {
			return out, false
		}
	}
	if out.Servers, ok = d.unpack(servers, text, at, len(out.Sources), len(out.Answers), len(sets)); !ok {
		return out, false
	}
	return out, true
}

// unpack makes the servers: their base64 decoded into one buffer, their
// polls in one array, their counts in another.
func (d *wireReader) unpack(servers []wireServerAt, text func(int) string, at int64, sources, answers, sets int) ([]ServerPolls, bool) {
	size := 0
	for _, w := range servers {
		size += base64.StdEncoding.DecodedLen(w.pollsEnd-w.polls) + base64.StdEncoding.DecodedLen(w.countsEnd-w.counts)
	}
	raw := make([]byte, size)
	type decoded struct{ polls, counts []byte }
	bufs := make([]decoded, len(servers))
	used, pollInts, countInts, countServers := 0, 0, 0, 0
	dec := func(off, end int) ([]byte, bool) {
		n, err := base64.StdEncoding.Decode(raw[used:], d.B[off:end])
		if err != nil {
			return nil, false
		}
		b := raw[used : used+n : used+n]
		used += n
		return b, true
	}
	for k, w := range servers {
		var ok bool
		if bufs[k].polls, ok = dec(w.polls, w.pollsEnd); !ok {
			return nil, false
		}
		if bufs[k].counts, ok = dec(w.counts, w.countsEnd); !ok {
			return nil, false
		}
		if len(bufs[k].counts) > 0 {
			countServers++
			countInts += varints(bufs[k].counts)
		} else {
			pollInts += varints(bufs[k].polls)
		}
	}
	polls := make([]SourcePoll, 0, pollInts/5)
	counts := make([]ServerCounts, countServers)
	pairs := make([]AnswerCount, 0, max(countInts-5*countServers, 0)/2)
	out := make([]ServerPolls, len(servers))
	var err error
	for k, w := range servers {
		sv := &out[k]
		sv.Backend, sv.Server = text(w.backend), text(w.server)
		if b := bufs[k].counts; len(b) > 0 {
			c := &counts[0]
			counts = counts[1:]
			if pairs, err = unpackCounts(c, pairs, b, sets, answers); err != nil {
				return nil, false
			}
			sv.Counts = c
			continue
		}
		start := len(polls)
		if polls, err = unpackPolls(polls, bufs[k].polls, at, sources, answers); err != nil {
			return nil, false
		}
		if len(polls) > start {
			sv.Polls = polls[start:len(polls):len(polls)]
		}
	}
	return out, true
}

// varints is how many varints b holds (the bytes that end one).
func varints(b []byte) int {
	n := 0
	for _, c := range b {
		if c < 0x80 {
			n++
		}
	}
	return n
}

// str reads a string (jsonstr.Reader.Str) into strs: its index there.
func (d *wireReader) str() (int, bool) {
	off, end, ok := d.Str()
	if !ok {
		return 0, false
	}
	d.strs = append(d.strs, wireString{off: off, end: end, at: d.size})
	d.size += end - off
	return len(d.strs) - 1, true
}

// base64 reads a string of base64 (checked when decoded): B[off:end].
// A CR or LF in it, which base64 skips, is not JSON: refused.
func (d *wireReader) base64() (off, end int, ok bool) {
	if d.I >= len(d.B) || d.B[d.I] != '"' {
		return 0, 0, false
	}
	off = d.I + 1
	k := bytes.IndexByte(d.B[off:], '"')
	if k < 0 || bytes.ContainsAny(d.B[off:off+k], "\r\n") {
		return 0, 0, false
	}
	end = off + k
	d.I = end + 1
	return off, end, true
}

// strings reads null or a list of strings: their indexes in strs.
func (d *wireReader) strings() (r [2]int, null, ok bool) {
	if d.Lit("null") {
		return r, true, true
	}
	if !d.Lit("[") {
		return r, false, false
	}
	r[0] = len(d.strs)
	if end := bytes.IndexByte(d.B[d.I:], ']'); end > 0 { // a guess: a name may hold ] or ","
		d.strs = slices.Grow(d.strs, bytes.Count(d.B[d.I:d.I+end], []byte(`","`))+1)
	}
	if d.Lit("]") {
		r[1] = r[0]
		return r, false, true
	}
	for {
		if _, ok := d.str(); !ok {
			return r, false, false
		}
		if d.Lit("]") {
			r[1] = len(d.strs)
			return r, false, true
		}
		if !d.Lit(",") {
			return r, false, false
		}
	}
}

// servers reads null or the list of servers.
func (d *wireReader) servers() ([]wireServerAt, bool) {
	if d.Lit("null") {
		return nil, true
	}
	if !d.Lit("[") {
		return nil, false
	}
	n := bytes.Count(d.B[d.I:], []byte(`{"backend":"`))
	l := make([]wireServerAt, 0, n)
	d.strs = slices.Grow(d.strs, 2*n+1) // their names, and next
	if d.Lit("]") {
		return l, true
	}
	for {
		var w wireServerAt
		var ok bool
		if !d.Lit(`{"backend":`) {
			return nil, false
		}
		if w.backend, ok = d.str(); !ok || !d.Lit(`,"server":`) {
			return nil, false
		}
		if w.server, ok = d.str(); !ok || !d.Lit(`,"polls":`) {
			return nil, false
		}
		if w.pollsNull = d.Lit("null"); !w.pollsNull {
			if w.polls, w.pollsEnd, ok = d.base64(); !ok {
				return nil, false
			}
		}
		if w.hasCounts = d.Lit(`,"counts":`); w.hasCounts {
			// MarshalJSON writes polls or counts, not both.
			if !w.pollsNull {
				return nil, false
			}
			if w.counts, w.countsEnd, ok = d.base64(); !ok {
				return nil, false
			}
		}
		if !d.Lit("}") {
			return nil, false
		}
		l = append(l, w)
		if d.Lit("]") {
			return l, true
		}
		if !d.Lit(",") {
			return nil, false
		}
	}
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
