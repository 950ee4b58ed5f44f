package api

import (
	"fmt"
	"strconv"
	"strings"
)

// Rotation counts servers the way every command and the status page say
// it, so that the numbers add up: In servers are in rotation (HAProxy
// sends them new sessions; Ramping and Weighted say how many of those
// ramp or hold a set weight), and each other server is out for one
// reason: Drain, Maint, Zero (ready at 0%: HAProxy shows it as DRAIN) or
// Never (withheld and never told: HAProxy keeps its own state, unknown
// here). In+Drain+Maint+Zero+Never == Servers. Kept counts the withheld
// servers whose HAProxy nodes keep the last answer they were told; they
// are counted by that answer, in the other fields too.
type Rotation struct {
	Servers, In       int
	Ramping, Weighted int
	Drain, Maint      int
	Zero, Never       int
	Kept              int
}

// Add counts one server (not a backend-wide key's row).
func (r *Rotation) Add(s ServerState) {
	r.Servers++
	if s.Withheld && s.Keeps != "" {
		r.Kept++
	}
	k, w := s.KeptKind()
	switch {
	case s.InRotation():
		r.In++
		switch k {
		case KindRamping:
			r.Ramping++
		case KindWeight:
			r.Weighted++
		}
	case w == 0 && (k == KindWeight || k == KindRamping):
		r.Zero++
	case k == KindDrain:
		r.Drain++
	case k == KindMaint:
		r.Maint++
	default:
		r.Never++
	}
}

// Merge adds o's counts to r's.
func (r *Rotation) Merge(o Rotation) {
	r.Servers += o.Servers
	r.In += o.In
	r.Ramping += o.Ramping
	r.Weighted += o.Weighted
	r.Drain += o.Drain
	r.Maint += o.Maint
	r.Zero += o.Zero
	r.Never += o.Never
	r.Kept += o.Kept
}

// Full reports whether every server is in rotation at full weight, with
// nothing ramping, weighted or withheld.
func (r Rotation) Full() bool {
	return r.In == r.Servers && r.Ramping+r.Weighted+r.Kept == 0
}

// RotationPart is one part of a Rotation's line. Class names what it
// counts: ready (the servers in rotation), ramping, weight, drain, maint,
// zero, withheld (never told), kept (withheld, counted by what HAProxy
// keeps).
type RotationPart struct {
	Class, Text string
}

// Parts are the pieces of the line, in order: in rotation ("5 of 9
// servers in rotation"; servers is the noun, "" for none), how many of
// those ramp or hold a weight ("of which 1 ramping", "1 at a set weight"),
// the servers out of rotation by reason ("out: 3 drain", "1 maint", "1 at
// 0% (HAProxy shows DRAIN)"), then the withheld servers.
func (r Rotation) Parts(noun bool) []RotationPart {
	head := fmt.Sprintf("%s of %s in rotation", thousands(r.In), thousands(r.Servers))
	if noun {
		head = fmt.Sprintf("%s of %s in rotation", thousands(r.In), Plural(r.Servers, "server", "servers"))
	}
	parts := []RotationPart{{"ready", head}}
	of := "of which "
	for _, p := range []struct {
		n           int
		class, text string
	}{{r.Ramping, "ramping", "ramping"}, {r.Weighted, "weight", "at a set weight"}} {
		if p.n > 0 {
			parts = append(parts, RotationPart{p.class, of + thousands(p.n) + " " + p.text})
			of = ""
		}
	}
	out := "out: "
	for _, p := range []struct {
		n           int
		class, text string
	}{{r.Drain, "drain", "drain"}, {r.Maint, "maint", "maint"}, {r.Zero, "zero", "at 0% (HAProxy shows DRAIN)"},
		{r.Never, "withheld", "withheld and never told (HAProxy keeps its own state)"}} {
		if p.n > 0 {
			parts = append(parts, RotationPart{p.class, out + thousands(p.n) + " " + p.text})
			out = ""
		}
	}
	if r.Kept > 0 {
		parts = append(parts, RotationPart{"kept", thousands(r.Kept) + " withheld: HAProxy keeps the last answer it was told, counted there"})
	}
	return parts
}

// String is the line: "5 of 9 servers in rotation (of which 1 ramping,
// 1 at a set weight); out: 3 drain, 1 maint; 1 withheld: HAProxy keeps
// the last answer it was told, counted there".
func (r Rotation) String() string {
	var head string
	var sub, out, tail []string
	for _, p := range r.Parts(true) {
		switch p.Class {
		case "ready":
			head = p.Text
		case "ramping", "weight":
			sub = append(sub, strings.TrimPrefix(p.Text, "of which "))
		case "kept":
			tail = append(tail, p.Text)
		default:
			out = append(out, strings.TrimPrefix(p.Text, "out: "))
		}
	}
	if len(sub) > 0 {
		head += " (of which " + strings.Join(sub, ", ") + ")"
	}
	if len(out) > 0 {
		head += "; out: " + strings.Join(out, ", ")
	}
	for _, t := range tail {
		head += "; " + t
	}
	return head
}

// Plural is "1 server", "2 servers", "1,024 servers".
func Plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return thousands(n) + " " + many
}

// thousands renders n with commas: 50,000.
func thousands(n int) string {
	s := strconv.Itoa(n)
	if n < 0 {
		return "-" + thousands(-n)
	}
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
