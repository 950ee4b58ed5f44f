package jsonstr

import "unicode/utf8"

// Reader reads JSON in the one form this service's hand-written writers
// write (compact, fields in their order, strings without escapes),
// without reflection, for the readers of the raft port's answer lines
// (cluster/confirm) and of a peer's poll summary (server). Each read
// reports false for anything else, and for any value encoding/json would
// read differently or refuse, so that its caller can leave the whole
// input to encoding/json: whatever a Reader reads, encoding/json reads
// the same. A read that reports false leaves I where it was.
//
// The zero Reader reads an empty input.
type Reader struct {
	B []byte // the input
	I int    // where the next read starts
}

// Lit reads s as it stands.
func (r *Reader) Lit(s string) bool {
	if len(r.B)-r.I < len(s) || string(r.B[r.I:r.I+len(s)]) != s {
		return false
	}
	r.I += len(s)
	return true
}

// Str reads a string without escapes: B[start:end] is its value. A
// backslash, a control character or invalid UTF-8 (which encoding/json
// reads as U+FFFD) in it is refused.
func (r *Reader) Str() (start, end int, ok bool) {
	if r.I >= len(r.B) || r.B[r.I] != '"' {
		return 0, 0, false
	}
	start = r.I + 1
	var high byte // every byte ORed: 0x80 set if one is not ASCII
	for end = start; end < len(r.B); end++ {
		c := r.B[end]
		if c == '"' {
			if high >= 0x80 && !utf8.Valid(r.B[start:end]) {
				return 0, 0, false
			}
			r.I = end + 1
			return start, end, true
		}
		if c == '\\' || c < 0x20 {
			return 0, 0, false
		}
		high |= c
	}
	return 0, 0, false
}

// Int reads an integer as JSON writes it, within int64: an optional
// minus, no leading zero, no fraction or exponent. "-0" reads as 0, as
// encoding/json reads it into an int64.
func (r *Reader) Int() (int64, bool) {
	i := r.I
	neg := i < len(r.B) && r.B[i] == '-'
	if neg {
		i++
	}
	x, end, ok := r.digits(i)
	if !ok || x > 1<<63 || (!neg && x == 1<<63) {
		return 0, false
	}
	r.I = end
	if neg {
		return -int64(x), true // x == 1<<63: wraps to -1<<63, its value
	}
	return int64(x), true
}

// Uint reads an unsigned integer as JSON writes it, within uint64: no
// sign (encoding/json refuses "-0" for a uint64), no leading zero, no
// fraction or exponent.
func (r *Reader) Uint() (x uint64, ok bool) {
	x, r.I, ok = r.digits(r.I)
	return x, ok
}

// digits reads the digits of a JSON integer from B[i:] (no leading zero,
// not followed by a fraction or an exponent, within uint64): its value
// and where it ends (refused: 0 and i).
func (r *Reader) digits(i int) (x uint64, end int, ok bool) {
	const maxTenth, maxLast = (1<<64 - 1) / 10, (1<<64 - 1) % 10
	for end = i; end < len(r.B); end++ {
		d := r.B[end] - '0' // a byte below '0' wraps above 9
		if d > 9 {
			break
		}
		if x > maxTenth || (x == maxTenth && d > maxLast) {
			return 0, i, false
		}
		x = x*10 + uint64(d)
	}
	if end == i || (end-i > 1 && r.B[i] == '0') {
		return 0, i, false
	}
	if end < len(r.B) && (r.B[end] == '.' || r.B[end] == 'e' || r.B[end] == 'E') {
		return 0, i, false
	}
	return x, end, true
}

// AtEnd reports whether only JSON whitespace (space, tab, CR, LF) is
// left after I, as encoding/json allows after a value.
func (r *Reader) AtEnd() bool {
	for _, c := range r.B[r.I:] {
		if c != ' ' && c != '\t' && c != '\r' && c != '\n' {
			return false
		}
	}
	return true
}

// AtLineEnd reports whether nothing, or one LF, is left after I: a line
// as the raft port's answers end.
func (r *Reader) AtLineEnd() bool {
	rest := r.B[r.I:]
	return len(rest) == 0 || (len(rest) == 1 && rest[0] == '\n')
}
