// Package jsonstr writes and reads JSON by hand, without reflection, as
// encoding/json would. Append quotes a string as encoding/json writes
// it: the hand-written JSON of the hot lines (the raft port's read-index
// and ack answers) and of the large answers (/v1/state's rows) quote
// their strings with it. Reader reads back the form those writers write
// (the answer lines in cluster/confirm, a peer's poll summary in
// server), refusing anything else so that its caller falls back to
// encoding/json.
package jsonstr

import "encoding/json"

const hexDigits = "0123456789abcdef"

// Append appends s quoted as encoding/json quotes it, HTML escapes
// included. ASCII is escaped here; a string with any other byte takes
// encoding/json's own path (its \u2028 and invalid UTF-8 rules).
func Append(b []byte, s string) []byte {
	start := len(b)
	b = append(b, '"')
	done := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x80 {
			q, _ := json.Marshal(s) // a string always encodes
			return append(b[:start], q...)
		}
		if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
			continue
		}
		b = append(b, s[done:i]...)
		done = i + 1
		switch c {
		case '"', '\\':
			b = append(b, '\\', c)
		case '\b':
			b = append(b, `\b`...)
		case '\f':
			b = append(b, `\f`...)
		case '\n':
			b = append(b, `\n`...)
		case '\r':
			b = append(b, `\r`...)
		case '\t':
			b = append(b, `\t`...)
		default:
			b = append(b, `\u00`...)
			b = append(b, hexDigits[c>>4], hexDigits[c&0xf])
		}
	}
	b = append(b, s[done:]...)
	return append(b, '"')
}
