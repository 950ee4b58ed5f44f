package server

import (
	"bytes"
	"encoding/base64"
	"slices"
	"strings"
	"unicode/utf8"
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
// decoding").

// DecodeJSONLine reads the wire form as MarshalJSON writes it (a line of
// it: trailing whitespace is allowed), reporting false, with s left as
// it was, when the line is in another form or is malformed: the caller
// then reads it with encoding/json (json.Unmarshal, UnmarshalJSON), which
// reads any form and reports what is wrong.
func (s *PollSummary) DecodeJSONLine(line []byte) bool {
	d := wireReader{b: line}
	out, ok := d.summary()
	if ok {
		*s = out
	}
	return ok
}

// wireReader reads the wire form from b at i.
type wireReader struct {
	b    []byte
	i    int
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
	if !d.lit(`{"at_unix_ms":`) {
		return out, false
	}
	at, ok := d.int()
	if !ok || !d.lit(`,"sources":`) {
		return out, false
	}
	sources, sourcesNull, ok := d.strings()
	if !ok || !d.lit(`,"answers":`) {
		return out, false
	}
	answers, answersNull, ok := d.strings()
	if !ok || !d.lit(`,"servers":`) {
		return out, false
	}
	servers, ok := d.servers() // null and []: no server (unmarshalJSON's make)
	if !ok {
		return out, false
	}
	var sets [][]int32
	if d.lit(`,"source_sets":`) {
		if sets, ok = d.sourceSets(); !ok {
			return out, false
		}
	}
	next := -1
	if d.lit(`,"next":"`) {
		d.i--
		if next, ok = d.str(); !ok {
			return out, false
		}
	}
	if !d.lit("}") || len(bytes.TrimLeft(d.b[d.i:], " \t\r\n")) > 0 {
		return out, false
	}
	// The strings, from one copy.
	var sb strings.Builder
	sb.Grow(d.size)
	for _, s := range d.strs {
		sb.Write(d.b[s.off:s.end])
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
		n, err := base64.StdEncoding.Decode(raw[used:], d.b[off:end])
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

// lit reads s as it stands.
func (d *wireReader) lit(s string) bool {
	if len(d.b)-d.i < len(s) || string(d.b[d.i:d.i+len(s)]) != s {
		return false
	}
	d.i += len(s)
	return true
}

// str reads a string without escapes, as encoding/json reads it (valid
// UTF-8, no control character), adding it to strs; its index there.
func (d *wireReader) str() (int, bool) {
	if d.i >= len(d.b) || d.b[d.i] != '"' {
		return 0, false
	}
	off := d.i + 1
	end := off
	ascii := true
	for ; end < len(d.b); end++ {
		c := d.b[end]
		if c == '"' {
			break
		}
		if c == '\\' || c < 0x20 {
			return 0, false
		}
		if c >= 0x80 {
			ascii = false
		}
	}
	if end >= len(d.b) || (!ascii && !utf8.Valid(d.b[off:end])) {
		return 0, false
	}
	d.i = end + 1
	d.strs = append(d.strs, wireString{off: off, end: end, at: d.size})
	d.size += end - off
	return len(d.strs) - 1, true
}

// base64 reads a string of base64 (checked when decoded): b[off:end].
// A CR or LF in it, which base64 skips, is not JSON: refused.
func (d *wireReader) base64() (off, end int, ok bool) {
	if d.i >= len(d.b) || d.b[d.i] != '"' {
		return 0, 0, false
	}
	off = d.i + 1
	k := bytes.IndexByte(d.b[off:], '"')
	if k < 0 || bytes.ContainsAny(d.b[off:off+k], "\r\n") {
		return 0, 0, false
	}
	end = off + k
	d.i = end + 1
	return off, end, true
}

// strings reads null or a list of strings: their indexes in strs.
func (d *wireReader) strings() (r [2]int, null, ok bool) {
	if d.lit("null") {
		return r, true, true
	}
	if !d.lit("[") {
		return r, false, false
	}
	r[0] = len(d.strs)
	if end := bytes.IndexByte(d.b[d.i:], ']'); end > 0 { // a guess: a name may hold ] or ","
		d.strs = slices.Grow(d.strs, bytes.Count(d.b[d.i:d.i+end], []byte(`","`))+1)
	}
	if d.lit("]") {
		r[1] = r[0]
		return r, false, true
	}
	for {
		if _, ok := d.str(); !ok {
			return r, false, false
		}
		if d.lit("]") {
			r[1] = len(d.strs)
			return r, false, true
		}
		if !d.lit(",") {
			return r, false, false
		}
	}
}

// servers reads null or the list of servers.
func (d *wireReader) servers() ([]wireServerAt, bool) {
	if d.lit("null") {
		return nil, true
	}
	if !d.lit("[") {
		return nil, false
	}
	n := bytes.Count(d.b[d.i:], []byte(`{"backend":"`))
	l := make([]wireServerAt, 0, n)
	d.strs = slices.Grow(d.strs, 2*n+1) // their names, and next
	if d.lit("]") {
		return l, true
	}
	for {
		var w wireServerAt
		var ok bool
		if !d.lit(`{"backend":`) {
			return nil, false
		}
		if w.backend, ok = d.str(); !ok || !d.lit(`,"server":`) {
			return nil, false
		}
		if w.server, ok = d.str(); !ok || !d.lit(`,"polls":`) {
			return nil, false
		}
		if w.pollsNull = d.lit("null"); !w.pollsNull {
			if w.polls, w.pollsEnd, ok = d.base64(); !ok {
				return nil, false
			}
		}
		if w.hasCounts = d.lit(`,"counts":`); w.hasCounts {
			// MarshalJSON writes polls or counts, not both.
			if !w.pollsNull {
				return nil, false
			}
			if w.counts, w.countsEnd, ok = d.base64(); !ok {
				return nil, false
			}
		}
		if !d.lit("}") {
			return nil, false
		}
		l = append(l, w)
		if d.lit("]") {
			return l, true
		}
		if !d.lit(",") {
			return nil, false
		}
	}
}

// sourceSets reads null or the lists of indexes, into one array.
func (d *wireReader) sourceSets() ([][]int32, bool) {
	if d.lit("null") {
		return nil, true
	}
	if !d.lit("[") {
		return nil, false
	}
	type ref struct{ start, end int } // start -1: null
	// What follows is the sets and next, at most: no more indexes
	// than commas, and sets than brackets.
	rest := d.b[d.i:]
	all := make([]int32, 0, bytes.Count(rest, []byte(","))+1)
	refs := make([]ref, 0, bytes.Count(rest, []byte("[")))
	if d.lit("]") {
		return [][]int32{}, true
	}
	for {
		r := ref{start: -1}
		if !d.lit("null") {
			if !d.lit("[") {
				return nil, false
			}
			r.start = len(all)
			if !d.lit("]") {
				for {
					x, ok := d.int()
					if !ok || x < -1<<31 || x >= 1<<31 {
						return nil, false
					}
					all = append(all, int32(x))
					if d.lit("]") {
						break
					}
					if !d.lit(",") {
						return nil, false
					}
				}
			}
			r.end = len(all)
		}
		refs = append(refs, r)
		if d.lit("]") {
			break
		}
		if !d.lit(",") {
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

// int reads an integer as JSON writes it (no fraction or exponent),
// within int64.
func (d *wireReader) int() (int64, bool) {
	neg := d.lit("-")
	start := d.i
	var x uint64
	for d.i < len(d.b) && d.b[d.i] >= '0' && d.b[d.i] <= '9' {
		if x > (1<<63)/10 {
			return 0, false
		}
		x = x*10 + uint64(d.b[d.i]-'0')
		d.i++
	}
	n := d.i - start
	if n == 0 || (n > 1 && d.b[start] == '0') || x > 1<<63 || (!neg && x == 1<<63) {
		return 0, false
	}
	if d.i < len(d.b) && (d.b[d.i] == '.' || d.b[d.i] == 'e' || d.b[d.i] == 'E') {
		return 0, false
	}
	if neg {
		return -int64(x), true
	}
	return int64(x), true
}
