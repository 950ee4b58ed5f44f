package state

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Admin is the administrative state HAProxy is told to apply.
type Admin uint8

// The administrative states, in the words of the agent protocol.
const (
	Ready Admin = iota
	Drain
	Maint
)

func (a Admin) String() string {
	switch a {
	case Drain:
		return "drain"
	case Maint:
		return "maint"
	default:
		return "ready"
	}
}

// MaxWeight is the largest N accepted in an "N%" value (HAProxy caps the
// scaled weight at 256).
const MaxWeight = 256

// ValidForms lists the accepted value forms; error messages show it so that
// an operator who typed a wrong value sees what to type instead.
// (DESIGN.md: a state key holds one plain word; a JSON object is still
// read, but is no form to offer).
const ValidForms = `ready | drain | maint | N% (N = 0..256), one plain word; reason, expiry and ramp go in the meta key (hastate drain --reason --for --ramp)`

// Errors returned by the parsers. Callers match them with errors.Is; the
// wrapped message names the offending input.
var (
	// ErrInvalidValue: a KV value that is not one of ValidForms.
	ErrInvalidValue = errors.New("invalid value")
	// ErrInvalidKey: a key under <prefix>state/ that is not state/<backend>/<server>.
	ErrInvalidKey = errors.New("invalid key")
	// ErrMalformedRequest: an agent-check request that is not <backend>/<server>.
	ErrMalformedRequest = errors.New("malformed request")
	// ErrAboveMax: ParsePercent read a whole percentage above its maximum
	// (the rest of its errors are not percentages at all).
	ErrAboveMax = errors.New("percentage above the maximum")
)

// Value is one parsed desired state.
type Value struct {
	Admin Admin
	// WeightSet and RampSet say whether Weight and Ramp hold a value.
	// They sit next to Admin so that the three share one word.
	WeightSet bool
	RampSet   bool
	// Weight is the weight in percent for an explicit "N%" value; it is
	// meaningful only when WeightSet is true (then Admin is Ready).
	Weight int
	// Reason and By are free text from the JSON form, shown in status.
	Reason string
	By     string
	// Ramp overrides the undrain ramp duration for this key when RampSet
	// is true; zero means no ramp.
	Ramp time.Duration
	// Until, when set, is when the state expires: after it the leader
	// treats the key as absent. At is when the CLI wrote the value.
	Until time.Time
	At    time.Time
}

// String renders the value in its short form ("drain", "25%", ...).
func (v Value) String() string {
	if v.WeightSet {
		return strconv.Itoa(v.Weight) + "%"
	}
	return v.Admin.String()
}

type jsonValue struct {
	State  *string `json:"state"`
	Reason string  `json:"reason"`
	By     string  `json:"by"`
	Ramp   *string `json:"ramp"`
	Until  *string `json:"until"`
	At     *string `json:"at"`
}

// ParseValue parses a KV value: a word (ready, drain, maint; any case), a
// weight "N%" with N in 0..MaxWeight, or a JSON object with a required
// "state" (one of the former) and optional "reason", "by" and "ramp"
// (a Go duration such as "10m", or "0" for no ramp). Surrounding
// whitespace is ignored. Errors wrap ErrInvalidValue.
func ParseValue(raw string) (Value, error) {
	s := strings.TrimSpace(raw)
	if strings.HasPrefix(s, "{") {
		return parseJSON(s)
	}
	v, err := parseShort(s)
	if err != nil {
		return Value{}, invalid(raw, err.Error())
	}
	return v, nil
}

func parseJSON(s string) (Value, error) {
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	var j jsonValue
	if err := dec.Decode(&j); err != nil {
		return Value{}, invalid(s, "bad JSON: "+err.Error())
	}
	// dec.More reports false before a stray '}' or ']', so ask for the next
	// token instead: anything but EOF is trailing data.
	if _, err := dec.Token(); err != io.EOF {
		return Value{}, invalid(s, "bad JSON: trailing data after the object")
	}
	v, err := j.value()
	if err != nil {
		return Value{}, invalid(s, err.Error())
	}
	return v, nil
}

// value checks a decoded JSON object (a state key's JSON form or a meta
// key) and returns the value it means.
func (j jsonValue) value() (Value, error) {
	if j.State == nil {
		return Value{}, errors.New(`JSON needs a "state" field`)
	}
	v, err := parseShort(strings.TrimSpace(*j.State))
	if err != nil {
		return Value{}, fmt.Errorf("state: %v", err)
	}
	v.Reason, v.By = j.Reason, j.By
	if j.Ramp != nil {
		d, err := ParseRamp(*j.Ramp)
		if err != nil {
			return Value{}, err
		}
		v.Ramp, v.RampSet = d, true
	}
	for _, f := range []struct {
		name string
		in   *string
		out  *time.Time
	}{{"until", j.Until, &v.Until}, {"at", j.At, &v.At}} {
		if f.in == nil {
			continue
		}
		t, err := time.Parse(time.RFC3339, strings.TrimSpace(*f.in))
		if err != nil {
			return Value{}, fmt.Errorf("%s %q: want an RFC 3339 time such as 2026-12-01T15:04:05Z", f.name, cut(*f.in, 40))
		}
		// In UTC, so that the same instant written at another offset
		// makes an equal Value: entries share equal values (Entry.last).
		*f.out = t.UTC()
	}
	return v, nil
}

// ParseRamp parses a ramp duration: a Go duration ("90s", "10m") up to
// MaxRampDuration, or "0".
func ParseRamp(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if s == "0" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 || d > MaxRampDuration {
		return 0, fmt.Errorf("ramp %q: want a duration up to %s such as \"10m\", or \"0\" for no ramp", cut(s, 40), MaxRampDuration)
	}
	return d, nil
}

// cut shortens s to at most n bytes for an error message.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

func parseShort(s string) (Value, error) {
	switch lowerASCII(s) {
	case "ready":
		return Value{Admin: Ready, Weight: 100}, nil
	case "drain":
		return Value{Admin: Drain}, nil
	case "maint":
		return Value{Admin: Maint}, nil
	case "":
		return Value{}, errors.New("empty")
	}
	if !strings.HasSuffix(s, "%") || strings.TrimSpace(s) != s {
		return Value{}, errors.New("not a known state")
	}
	n, err := ParsePercent(s, MaxWeight)
	switch {
	case errors.Is(err, ErrAboveMax):
		return Value{}, fmt.Errorf("weight %v", err)
	case err != nil:
		return Value{}, errors.New("not a known state")
	}
	return Value{Admin: Ready, Weight: n, WeightSet: true}, nil
}

// lowerASCII lowers s if it is all ASCII and returns it unchanged otherwise,
// so that only ASCII case differences are forgiven: strings.ToLower would
// also turn "MAİNT" (with U+0130) into "maint".
func lowerASCII(s string) string {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return s
		}
	}
	return strings.ToLower(s)
}

// ParsePercent reads a whole percentage from 0% to max%: "25%" or "25"
// (1 to 3 digits, surrounding space ignored). It is the one percentage
// parser of hastate: KV weights, ramp starts, flags and the CLI. The error
// says what to write.
func ParsePercent(s string, max int) (int, error) {
	t := strings.TrimSuffix(strings.TrimSpace(s), "%")
	n := 0
	for i := 0; i < len(t); i++ {
		c := t[i]
		if c < '0' || c > '9' || len(t) > 3 {
			return 0, fmt.Errorf("%q: want a whole percentage from 0%% to %d%%, such as 25%%", cut(s, 20), max)
		}
		n = n*10 + int(c-'0')
	}
	switch {
	case t == "":
		return 0, fmt.Errorf("%q: want a whole percentage from 0%% to %d%%, such as 25%%", cut(s, 20), max)
	case n > max:
		return 0, aboveMaxError{n, max}
	}
	return n, nil
}

// aboveMaxError is ParsePercent's error for a whole percentage above the
// maximum; it matches ErrAboveMax.
type aboveMaxError struct{ n, max int }

func (e aboveMaxError) Error() string {
	return fmt.Sprintf("%d%% is above %d%%: want 0%% to %d%%", e.n, e.max, e.max)
}

func (e aboveMaxError) Unwrap() error { return ErrAboveMax }

func invalid(raw, why string) error {
	return fmt.Errorf("%w %q: %s; valid forms: %s", ErrInvalidValue, cut(raw, 80), why, ValidForms)
}

// ParseRequest splits an agent-check request into backend and server. It
// accepts a trailing LF or CRLF. A request that is empty, longer than
// MaxRequest bytes, without '/', with more than one '/' (no key can name
// such a server), or with an empty backend or server is malformed. It does
// not allocate.
func ParseRequest(req []byte) (backend, server []byte, err error) {
	if len(req) > MaxRequest {
		return nil, nil, errTooLong
	}
	req = bytes.TrimSuffix(req, []byte{'\n'})
	req = bytes.TrimSuffix(req, []byte{'\r'})
	i := bytes.IndexByte(req, '/')
	if i <= 0 || i == len(req)-1 || bytes.IndexByte(req[i+1:], '/') >= 0 {
		if len(req) == 0 {
			return nil, nil, errEmpty
		}
		return nil, nil, errShape
	}
	return req[:i], req[i+1:], nil
}

// MaxRequest is the longest request accepted, terminator included.
const MaxRequest = 256

// ProbeMarker is the line a manual probe (`hastate probe`) sends right
// after its request, in the same write: a replica that reads it with the
// request answers as usual but does not record the prober as an HAProxy
// (HAProxy's agent-send never carries it, and a replica that does not know
// it ignores what follows the request's LF).
const ProbeMarker = "hastate-probe\n"

var (
	errTooLong = fmt.Errorf("%w: longer than %d bytes", ErrMalformedRequest, MaxRequest)
	errEmpty   = fmt.Errorf("%w: empty", ErrMalformedRequest)
	errShape   = fmt.Errorf("%w: want <backend>/<server>", ErrMalformedRequest)
)
