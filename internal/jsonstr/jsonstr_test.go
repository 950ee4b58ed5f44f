package jsonstr

import (
	"encoding/json"
	"testing"
)

// TestAppendIsEncodingJSONs: every byte below 0x80 alone and among
// others, the characters encoding/json escapes for HTML, multi-byte
// UTF-8, U+2028 and invalid UTF-8 are quoted as json.Marshal quotes them.
func TestAppendIsEncodingJSONs(t *testing.T) {
	cases := []string{"", "web", "ready 50%", `say "hi"`, `back\slash`, "<b>&amp;</b>", "line\nbreak\ttab\r",
		"\x00\x1f control \b\f\x7f", "naïve café", "\u2028\u2029", "bad \xff\xfe utf-8", "日本", "a+b'c"}
	for c := range 0x80 {
		cases = append(cases, string(rune(c)), "x"+string(rune(c))+"y")
	}
	for _, s := range cases {
		want, _ := json.Marshal(s)
		if got := Append([]byte("prefix"), s); string(got) != "prefix"+string(want) {
			t.Errorf("%q: appended %q, encoding/json writes %q", s, got[len("prefix"):], want)
		}
	}
}
