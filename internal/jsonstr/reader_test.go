package jsonstr

import (
	"encoding/json"
	"testing"
)

// TestReaderStr: a string without escapes is read as its bytes, as
// encoding/json reads it; a backslash, a control character, invalid
// UTF-8 (encoding/json reads U+FFFD) or a missing quote is refused, and
// I stays where it was.
func TestReaderStr(t *testing.T) {
	for _, c := range []struct {
		in string
		ok bool
	}{
		{`""`, true},
		{`"web"`, true},
		{`"ready 50% <b>&amp;</b> 'a'"`, true},
		{`"naïve café 日本"`, true},
		{"\"\u2028\u2029\"", true},
		{"\"\x7f del\"", true},
		{"\"\xf0\x9f\x98\x80 emoji\"", true},
		{`"a\"b"`, false},
		{`"back\\slash"`, false},
		{`"\u0041"`, false},
		{"\"tab\there\"", false},
		{"\"nul\x00\"", false},
		{"\"\x1f\"", false},
		{"\"lf\n\"", false},
		{"\"bad \xff\"", false},
		{"\"cut \xc3\"", false},
		{"\"overlong \xc0\xaf\"", false},
		{"\"surrogate \xed\xa0\x80\"", false},
		{`"unterminated`, false},
		{`"`, false},
		{``, false},
		{`web`, false},
		{`null`, false},
		{` "lead"`, false},
	} {
		r := Reader{B: []byte(c.in + `,`)}
		start, end, ok := r.Str()
		if ok != c.ok {
			t.Errorf("%q: read %v, want %v", c.in, ok, c.ok)
			continue
		}
		if !ok {
			if r.I != 0 {
				t.Errorf("%q: refused, but I moved to %d", c.in, r.I)
			}
			continue
		}
		var want string
		if err := json.Unmarshal([]byte(c.in), &want); err != nil {
			t.Fatalf("%q: encoding/json: %v", c.in, err)
		}
		if got := string(r.B[start:end]); got != want || r.I != len(c.in) {
			t.Errorf("%q: read %q (I %d), encoding/json reads %q (I %d)", c.in, got, r.I, want, len(c.in))
		}
	}
}

// TestReaderInts: integers as JSON writes them, within int64 (Int) or
// uint64 (Uint), are read as encoding/json reads them; leading zeros, a
// plus, a fraction, an exponent, overflow and a bare minus are refused,
// and so is any minus (even "-0") by Uint. Each of those encoding/json
// refuses too (into an int64 or a uint64), so a refusal never makes an
// error of what it reads. "-0" is read by Int as 0, as encoding/json
// reads it. A refusal leaves I where it was; whatever follows the digits
// is not read.
func TestReaderInts(t *testing.T) {
	for _, c := range []struct {
		in            string
		asInt, asUint bool
	}{
		{"0", true, true},
		{"7", true, true},
		{"1234567890", true, true},
		{"-0", true, false},
		{"-1", true, false},
		{"9223372036854775807", true, true},
		{"9223372036854775808", false, true},
		{"-9223372036854775808", true, false},
		{"-9223372036854775809", false, false},
		{"18446744073709551615", false, true},
		{"18446744073709551616", false, false},
		{"18446744073709551620", false, false},
		{"99999999999999999999", false, false},
		{"184467440737095516150", false, false},
		{"00", false, false},
		{"007", false, false},
		{"-01", false, false},
		{"+1", false, false},
		{"-", false, false},
		{"--1", false, false},
		{"1.0", false, false},
		{"1.", false, false},
		{"1e3", false, false},
		{"1E3", false, false},
		{"0e0", false, false},
		{"", false, false},
		{"x", false, false},
		{`"1"`, false, false},
	} {
		for _, follow := range []string{"", ",", "]", "}", "\n"} {
			r := Reader{B: []byte(c.in + follow)}
			n, ok := r.Int()
			checkNumber(t, "Int", c.in, follow, n, ok, c.asInt, r.I)
			r = Reader{B: []byte(c.in + follow)}
			u, ok := r.Uint()
			checkNumber(t, "Uint", c.in, follow, u, ok, c.asUint, r.I)
		}
	}
}

// checkNumber: the read of num (then follow) reported ok (want wantOK),
// got, and moved I to i. Read: got is what encoding/json reads from num
// and I is past num; refused: encoding/json refuses num into an N too,
// and I did not move.
func checkNumber[N int64 | uint64](t *testing.T, read, num, follow string, got N, ok, wantOK bool, i int) {
	t.Helper()
	var want N
	err := json.Unmarshal([]byte(num), &want)
	switch {
	case ok != wantOK:
		t.Errorf("%s %q then %q: read %v, want %v", read, num, follow, ok, wantOK)
	case ok && (err != nil || got != want || i != len(num)):
		t.Errorf("%s %q then %q: read %d, I %d; encoding/json reads %d (%v), I past it is %d", read, num, follow, got, i, want, err, len(num))
	case !ok && err == nil:
		t.Errorf("%s %q: refused, though encoding/json reads it (%d)", read, num, want)
	case !ok && i != 0:
		t.Errorf("%s %q then %q: refused, but I moved to %d", read, num, follow, i)
	}
}

// TestReaderLitAndEnds: Lit reads its text as it stands or nothing;
// AtEnd accepts only JSON whitespace after I, AtLineEnd nothing or one LF.
func TestReaderLitAndEnds(t *testing.T) {
	r := Reader{B: []byte(`{"id":"n1"}`)}
	if r.Lit(`{"ID":`) || r.Lit(`{"id":"n1"},`) || r.I != 0 {
		t.Fatalf("Lit read text that is not there (I %d)", r.I)
	}
	if !r.Lit(`{"id":`) || r.I != 6 || !r.Lit("") || r.I != 6 {
		t.Fatalf("Lit did not read text that is there (I %d)", r.I)
	}
	for _, c := range []struct {
		rest             string
		atEnd, atLineEnd bool
	}{
		{"", true, true},
		{"\n", true, true},
		{"\n\n", true, false},
		{"\r\n", true, false},
		{" ", true, false},
		{" \t\r\n ", true, false},
		{"x", false, false},
		{"\nx", false, false},
		{"\v", false, false},
		{"\x00", false, false},
		{"\u00a0", false, false},
	} {
		r := Reader{B: []byte("}" + c.rest), I: 1}
		if got := r.AtEnd(); got != c.atEnd {
			t.Errorf("AtEnd before %q: %v, want %v", c.rest, got, c.atEnd)
		}
		if got := r.AtLineEnd(); got != c.atLineEnd {
			t.Errorf("AtLineEnd before %q: %v, want %v", c.rest, got, c.atLineEnd)
		}
	}
	var zero Reader
	if !zero.AtEnd() || !zero.AtLineEnd() || zero.Lit("x") {
		t.Error("the zero Reader does not read as an empty input")
	}
}

// FuzzReader: whatever Str, Int or Uint reads from the start of an input
// is what encoding/json reads from those bytes.
func FuzzReader(f *testing.F) {
	for _, s := range []string{`"web"`, `"naïve"`, "\"bad \xff\"", `"a\"b"`, "\"\x01\"", `0`, `-0`, `007`, `1e3`,
		`-9223372036854775808`, `18446744073709551615`, `18446744073709551616`, `12,`, `"x"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		r := Reader{B: in}
		if start, end, ok := r.Str(); ok {
			var want string
			if err := json.Unmarshal(in[:r.I], &want); err != nil || want != string(in[start:end]) {
				t.Errorf("Str %q: read %q, encoding/json reads %q (%v)", in[:r.I], in[start:end], want, err)
			}
		}
		r = Reader{B: in}
		if n, ok := r.Int(); ok {
			var want int64
			if err := json.Unmarshal(in[:r.I], &want); err != nil || want != n {
				t.Errorf("Int %q: read %d, encoding/json reads %d (%v)", in[:r.I], n, want, err)
			}
		}
		r = Reader{B: in}
		if u, ok := r.Uint(); ok {
			var want uint64
			if err := json.Unmarshal(in[:r.I], &want); err != nil || want != u {
				t.Errorf("Uint %q: read %d, encoding/json reads %d (%v)", in[:r.I], u, want, err)
			}
		}
	})
}
