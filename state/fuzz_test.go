package state_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/hastate/hastate/state"
)

func FuzzParseValue(f *testing.F) {
	for _, seed := range []string{
		"ready", "DRAIN", "Maint", " drain\n", "0%", "25%", "256%", "257%", "300%",
		"-1%", "25 %", "%", "abc", "", "007%", "1000%", "MA\u0130NT",
		`{"state":"drain","reason":"zonal maintenance","by":"alice","ramp":"10m"}`,
		`{"state":"ready","ramp":"0"}`, `{"state":"ready","ramp":"abc"}`,
		`{"state":"ready","ramp":"-5m"}`, `{"reason":"x"}`, `{"state":"drain"`,
		`{"state":"drain","x":1}`, `{"state":"25%"}`, `{"state":"drain"}}`,
		`{"state":"drain"}]`, `{"state":null}`, `{"STATE":"maint"}`,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		v, err := state.ParseValue(raw)
		if err != nil {
			if !errors.Is(err, state.ErrInvalidValue) || !strings.Contains(err.Error(), state.ValidForms) {
				t.Fatalf("ParseValue(%q) error %q: want ErrInvalidValue and the valid forms", raw, err)
			}
			if v != (state.Value{}) {
				t.Fatalf("ParseValue(%q) = %+v with an error", raw, v)
			}
			return
		}
		switch v.Admin {
		case state.Ready, state.Drain, state.Maint:
		default:
			t.Fatalf("ParseValue(%q) = %+v: unknown admin state", raw, v)
		}
		if v.WeightSet && (v.Weight < 0 || v.Weight > state.MaxWeight || v.Admin != state.Ready) {
			t.Fatalf("ParseValue(%q) = %+v: weight outside 0..%d or not ready", raw, v, state.MaxWeight)
		}
		if v.RampSet && v.Ramp < 0 {
			t.Fatalf("ParseValue(%q) = %+v: negative ramp", raw, v)
		}
		if !v.RampSet && v.Ramp != 0 {
			t.Fatalf("ParseValue(%q) = %+v: ramp without RampSet", raw, v)
		}
		again, err := state.ParseValue(v.String())
		if err != nil {
			t.Fatalf("ParseValue(%q) = %+v, but its String() %q does not parse: %v", raw, v, v.String(), err)
		}
		if again.Admin != v.Admin || again.Weight != v.Weight || again.WeightSet != v.WeightSet {
			t.Fatalf("ParseValue(%q) = %+v, re-parsed from %q = %+v", raw, v, v.String(), again)
		}
		a := state.ValueAnswer(v)
		if a.Withheld || a.String() == "" || strings.ContainsAny(a.String(), "\r\n") {
			t.Fatalf("ValueAnswer(%+v) = %+v %q: want a one-line answer", v, a, a.String())
		}
	})
}

func FuzzParseRequest(f *testing.F) {
	for _, seed := range []string{
		"web/a", "web/a\n", "web/a\r\n", "canary_web/gke-cny-web\n", "web/*\n",
		"", "\n", "\r\n", "web", "/a", "web/", "/", "a/b/c", "web//a", "web/a\n\n",
		"web/a\r", "web/a\n\r", "b/" + strings.Repeat("s", 253) + "\n", "b/" + strings.Repeat("s", 254) + "\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, req []byte) {
		orig := bytes.Clone(req)
		b, s, err := state.ParseRequest(req)
		if !bytes.Equal(req, orig) {
			t.Fatalf("ParseRequest(%q) modified its input to %q", orig, req)
		}
		if err != nil {
			if !errors.Is(err, state.ErrMalformedRequest) {
				t.Fatalf("ParseRequest(%q) error %q does not wrap ErrMalformedRequest", req, err)
			}
			if b != nil || s != nil {
				t.Fatalf("ParseRequest(%q) = %q, %q with an error", req, b, s)
			}
			return
		}
		if len(req) > state.MaxRequest {
			t.Fatalf("ParseRequest accepted a %d-byte request", len(req))
		}
		if len(b) == 0 || len(s) == 0 {
			t.Fatalf("ParseRequest(%q) = %q, %q: empty part", req, b, s)
		}
		if bytes.IndexByte(b, '/') >= 0 || bytes.IndexByte(s, '/') >= 0 {
			t.Fatalf("ParseRequest(%q) = %q, %q: '/' in a part", req, b, s)
		}
		// The parts are the request, in place, minus one LF and one CR.
		n := len(b) + 1 + len(s)
		if !bytes.Equal(req[:n], append(append(bytes.Clone(b), '/'), s...)) {
			t.Fatalf("ParseRequest(%q) = %q, %q: not the start of the request", req, b, s)
		}
		trimmed := bytes.TrimSuffix(bytes.TrimSuffix(req, []byte{'\n'}), []byte{'\r'})
		if n != len(trimmed) {
			t.Fatalf("ParseRequest(%q) = %q, %q: dropped more than the terminator", req, b, s)
		}
	})
}

func FuzzLookup(f *testing.F) {
	for _, seed := range []string{
		"web/a\n", "web/b\r\n", "web/*\n", "api/x\n", "api/y", "db/z\n", "other/a\n",
		"state/web/a", "web/a/b", "", "/", "web/", "bad/x\n",
	} {
		f.Add([]byte(seed))
	}
	m := state.NewMirror()
	m.Apply(m.Diff(map[string]string{
		"state/web/a":  "drain",
		"state/web/*":  "25%",
		"state/api/x":  "junk", // withheld
		"state/api/*":  "0%",
		"state/db/z":   `{"state":"maint"}`,
		"state/bad":    "drain", // invalid key
		"state/a/b/c":  "drain", // invalid key
		"config/other": "drain",
	}))
	snap := m.Snapshot()
	lines := map[string]bool{"drain\n": true, "maint\n": true, "ready 0%\n": true, "ready 25%\n": true, "ready 100%\n": true}
	f.Fuzz(func(t *testing.T, req []byte) {
		b, s, err := state.ParseRequest(req)
		if err != nil {
			return
		}
		line := snap.Lookup(req[:len(b)+1+len(s)], len(b))
		r := snap.Resolve(string(b), string(s))
		if line == nil {
			if !r.Answer.Withheld {
				t.Fatalf("request %q: Lookup withholds, Resolve = %+v", req, r)
			}
			return
		}
		if !bytes.HasSuffix(line, []byte{'\n'}) || bytes.IndexByte(line, '\n') != len(line)-1 {
			t.Fatalf("request %q: answer %q is not one LF-terminated line", req, line)
		}
		if !lines[string(line)] {
			t.Fatalf("request %q: unexpected answer %q", req, line)
		}
		if r.Answer.Withheld || r.Answer.String()+"\n" != string(line) {
			t.Fatalf("request %q: Lookup %q, Resolve %+v", req, line, r)
		}
	})
}
