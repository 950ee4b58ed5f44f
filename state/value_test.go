package state_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
	"unique"

	"github.com/hastate/hastate/state"
)

// mustInvalidValue checks that err is a value error an operator can act on:
// it wraps ErrInvalidValue and lists the valid forms.
func mustInvalidValue(t *testing.T, raw string, err error) {
	t.Helper()
	if err == nil {
		t.Fatalf("ParseValue(%q): no error, want one", raw)
	}
	if !errors.Is(err, state.ErrInvalidValue) {
		t.Errorf("ParseValue(%q) error %q does not wrap ErrInvalidValue", raw, err)
	}
	if !strings.Contains(err.Error(), state.ValidForms) {
		t.Errorf("ParseValue(%q) error %q does not list the valid forms", raw, err)
	}
}

func TestParseValue(t *testing.T) {
	ready := state.Value{Admin: state.Ready, Weight: 100}
	drain := state.Value{Admin: state.Drain}
	maint := state.Value{Admin: state.Maint}
	weight := func(n int) state.Value { return state.Value{Admin: state.Ready, Weight: n, WeightSet: true} }

	tests := []struct {
		name string
		raw  string
		want state.Value
		// err, when set, must appear in the error message; "-" means the
		// value must be invalid without checking the reason.
		err string
	}{
		// Words, any case.
		{name: "ready", raw: "ready", want: ready},
		{name: "READY", raw: "READY", want: ready},
		{name: "Ready", raw: "Ready", want: ready},
		{name: "drain", raw: "drain", want: drain},
		{name: "DRAIN", raw: "DRAIN", want: drain},
		{name: "dRaIn", raw: "dRaIn", want: drain},
		{name: "maint", raw: "maint", want: maint},
		{name: "MAINT", raw: "MAINT", want: maint},
		{name: "Maint", raw: "Maint", want: maint},

		// Surrounding whitespace is trimmed.
		{name: "spaces", raw: "  drain  ", want: drain},
		{name: "trailing LF", raw: "maint\n", want: maint},
		{name: "CRLF and tabs", raw: "\t\r\nready\r\n", want: ready},
		{name: "weight with spaces", raw: " 25% \n", want: weight(25)},

		// Weights.
		{name: "0%", raw: "0%", want: weight(0)},
		{name: "1%", raw: "1%", want: weight(1)},
		{name: "25%", raw: "25%", want: weight(25)},
		{name: "100%", raw: "100%", want: weight(100)},
		{name: "255%", raw: "255%", want: weight(255)},
		{name: "256%", raw: "256%", want: weight(256)},
		{name: "257%", raw: "257%", err: "above 256%"},
		{name: "300%", raw: "300%", err: "above 256%"},
		{name: "999%", raw: "999%", err: "above 256%"},
		{name: "1000%", raw: "1000%", err: "not a known state"},
		{name: "-1%", raw: "-1%", err: "not a known state"},
		{name: "+5%", raw: "+5%", err: "not a known state"},
		{name: "space before %", raw: "25 %", err: "not a known state"},
		{name: "bare %", raw: "%", err: "not a known state"},
		{name: "%%", raw: "25%%", err: "not a known state"},
		{name: "no %", raw: "25", err: "not a known state"},
		{name: "fraction", raw: "2.5%", err: "not a known state"},

		// Other junk.
		{name: "abc", raw: "abc", err: "not a known state"},
		{name: "typo", raw: "drian", err: "not a known state"},
		{name: "answer form", raw: "ready 100%", err: "not a known state"},
		{name: "empty", raw: "", err: "empty"},
		{name: "blank", raw: " \t\n", err: "empty"},
		{name: "NUL", raw: "drain\x00", err: "not a known state"},
		// Only ASCII case is forgiven: strings.ToLower maps U+0130 to 'i'.
		{name: "dotted capital I", raw: "MA\u0130NT", err: "not a known state"},
		{name: "dotted capital I lower", raw: "dra\u0130n", err: "not a known state"},

		// JSON.
		{
			name: "JSON all fields",
			raw:  `{"state":"drain","reason":"zonal maintenance","by":"alice","ramp":"10m"}`,
			want: state.Value{Admin: state.Drain, Reason: "zonal maintenance", By: "alice", Ramp: 10 * time.Minute, RampSet: true},
		},
		{name: "JSON state only", raw: `{"state":"maint"}`, want: maint},
		{name: "JSON state any case", raw: `{"state":"ReAdY"}`, want: ready},
		{name: "JSON state trimmed", raw: `{"state":" drain "}`, want: drain},
		{name: "JSON surrounded by whitespace", raw: " \n{\"state\":\"drain\"}\n ", want: drain},
		{name: "JSON inner whitespace", raw: "{ \"state\" : \"drain\" ,\n \"by\" : \"bob\" }", want: state.Value{Admin: state.Drain, By: "bob"}},
		{name: "JSON weight state", raw: `{"state":"25%"}`, want: weight(25)},
		{name: "JSON weight 256%", raw: `{"state":"256%","reason":"max"}`, want: state.Value{Admin: state.Ready, Weight: 256, WeightSet: true, Reason: "max"}},
		{name: "JSON ramp 0", raw: `{"state":"ready","ramp":"0"}`, want: state.Value{Admin: state.Ready, Weight: 100, RampSet: true}},
		{name: "JSON ramp 0s", raw: `{"state":"ready","ramp":"0s"}`, want: state.Value{Admin: state.Ready, Weight: 100, RampSet: true}},
		{name: "JSON ramp 90s", raw: `{"state":"ready","ramp":"90s"}`, want: state.Value{Admin: state.Ready, Weight: 100, Ramp: 90 * time.Second, RampSet: true}},
		{name: "JSON ramp null", raw: `{"state":"ready","ramp":null}`, want: ready},
		{name: "JSON unicode reason", raw: `{"state":"drain","reason":"zone \u00e9 \ud83d\ude80"}`, want: state.Value{Admin: state.Drain, Reason: "zone é 🚀"}},
		{name: "JSON ramp abc", raw: `{"state":"ready","ramp":"abc"}`, err: `ramp "abc"`},
		{name: "JSON ramp negative", raw: `{"state":"ready","ramp":"-5m"}`, err: `ramp "-5m"`},
		{name: "JSON ramp empty", raw: `{"state":"ready","ramp":""}`, err: `ramp ""`},
		{name: "JSON ramp no unit", raw: `{"state":"ready","ramp":"10"}`, err: `ramp "10"`},
		{name: "JSON ramp number", raw: `{"state":"ready","ramp":600}`, err: "bad JSON"},
		{name: "JSON ramp above the bound", raw: `{"state":"ready","ramp":"25h"}`, err: `ramp "25h"`},
		{name: "JSON ramp object", raw: `{"state":"ready","ramp":{"d":"1m"}}`, err: "bad JSON"},
		{name: "JSON missing state", raw: `{"reason":"x","by":"alice"}`, err: `needs a "state"`},
		{name: "JSON empty object", raw: `{}`, err: `needs a "state"`},
		{name: "JSON null state", raw: `{"state":null}`, err: `needs a "state"`},
		{name: "JSON empty state", raw: `{"state":""}`, err: "state: empty"},
		{name: "JSON state 300%", raw: `{"state":"300%"}`, err: "state: weight 300% is above 256%"},
		{name: "JSON state unknown word", raw: `{"state":"draining"}`, err: "state: not a known state"},
		{name: "JSON state number", raw: `{"state":25}`, err: "bad JSON"},
		{name: "JSON state nested JSON", raw: `{"state":"{\"state\":\"drain\"}"}`, err: "state: not a known state"},
		{name: "JSON unknown field", raw: `{"state":"drain","color":"red"}`, err: "bad JSON"},
		{name: "JSON unterminated", raw: `{"state":"drain"`, err: "bad JSON"},
		{name: "JSON unquoted", raw: `{state:drain}`, err: "bad JSON"},
		{name: "JSON lone brace", raw: `{`, err: "bad JSON"},
		{name: "JSON trailing value", raw: `{"state":"drain"} {"state":"ready"}`, err: "trailing data"},
		{name: "JSON trailing word", raw: `{"state":"drain"} x`, err: "trailing data"},
		// encoding/json's Decoder.More is false before '}' and ']'.
		{name: "JSON trailing brace", raw: `{"state":"drain"}}`, err: "trailing data"},
		{name: "JSON trailing bracket", raw: `{"state":"drain"}]`, err: "trailing data"},
		{name: "JSON array", raw: `["drain"]`, err: "not a known state"},
		{name: "JSON string", raw: `"drain"`, err: "not a known state"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := state.ParseValue(tt.raw)
			if tt.err != "" {
				mustInvalidValue(t, tt.raw, err)
				if tt.err != "-" && !strings.Contains(err.Error(), tt.err) {
					t.Errorf("ParseValue(%q) error %q, want it to mention %q", tt.raw, err, tt.err)
				}
				if got != (state.Value{}) {
					t.Errorf("ParseValue(%q) = %+v with an error, want the zero Value", tt.raw, got)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseValue(%q): %v", tt.raw, err)
			}
			if got != tt.want {
				t.Errorf("ParseValue(%q) = %+v, want %+v", tt.raw, got, tt.want)
			}
		})
	}
}

// Entries intern their last value (unique.Make), so that keys holding the
// same value share one copy: that needs the same value to compare equal
// however it was written, times included (their location is part of ==).
func TestParseValueInternsEqualValues(t *testing.T) {
	const drain = `{"state":"drain","reason":"zone b","by":"alice","ramp":"10m","until":"2026-12-01T15:00:00Z","at":"2026-11-30T10:00:00Z"}`
	same := [][]string{
		{"drain", "drain", "DRAIN", " drain\n"},
		{"25%", "25%", " 25%"},
		{drain, drain,
			// The same instants at another offset.
			`{"state":"drain","reason":"zone b","by":"alice","ramp":"10m","until":"2026-12-01T16:00:00+01:00","at":"2026-11-30T05:00:00-05:00"}`},
	}
	for _, raws := range same {
		want, err := state.ParseValue(raws[0])
		if err != nil {
			t.Fatal(err)
		}
		for _, raw := range raws[1:] {
			got, err := state.ParseValue(raw)
			if err != nil {
				t.Fatal(err)
			}
			if unique.Make(got) != unique.Make(want) {
				t.Errorf("ParseValue(%q) = %#v, ParseValue(%q) = %#v: not one handle", raw, got, raws[0], want)
			}
		}
	}
	a, _ := state.ParseValue(drain)
	b, _ := state.ParseValue(strings.Replace(drain, "alice", "bob", 1))
	if unique.Make(a) == unique.Make(b) {
		t.Errorf("values by alice and bob share a handle")
	}
}

// TestParseValueWeightRange walks every N% around the accepted range.
func TestParseValueWeightRange(t *testing.T) {
	for n := 0; n <= 999; n++ {
		raw := fmt.Sprintf("%d%%", n)
		v, err := state.ParseValue(raw)
		if n > state.MaxWeight {
			mustInvalidValue(t, raw, err)
			continue
		}
		if err != nil {
			t.Fatalf("ParseValue(%q): %v", raw, err)
		}
		want := state.Value{Admin: state.Ready, Weight: n, WeightSet: true}
		if v != want {
			t.Fatalf("ParseValue(%q) = %+v, want %+v", raw, v, want)
		}
		if got := v.String(); got != raw {
			t.Errorf("ParseValue(%q).String() = %q", raw, got)
		}
		wantAnswer := fmt.Sprintf("ready %d%%", n)
		if got := state.ValueAnswer(v).String(); got != wantAnswer {
			t.Errorf("ValueAnswer(%q) = %q, want %q", raw, got, wantAnswer)
		}
	}
}

func TestParseValueErrorShowsLongInputShortened(t *testing.T) {
	raw := strings.Repeat("x", 10000)
	_, err := state.ParseValue(raw)
	mustInvalidValue(t, raw, err)
	if len(err.Error()) > 300+len(state.ValidForms) {
		t.Errorf("error for a 10000-byte value is %d bytes long, want the value shortened", len(err.Error()))
	}
	if !strings.Contains(err.Error(), strings.Repeat("x", 80)+"...") {
		t.Errorf("error %q does not show the start of the value", err)
	}
}

func TestValueString(t *testing.T) {
	tests := []struct {
		raw, want string
	}{
		{"ready", "ready"},
		{"READY", "ready"},
		{"Drain", "drain"},
		{"maint", "maint"},
		{"0%", "0%"},
		{" 25% ", "25%"},
		{"256%", "256%"},
		{`{"state":"drain","reason":"r","ramp":"1m"}`, "drain"},
		{`{"state":"75%"}`, "75%"},
	}
	for _, tt := range tests {
		v, err := state.ParseValue(tt.raw)
		if err != nil {
			t.Fatalf("ParseValue(%q): %v", tt.raw, err)
		}
		if got := v.String(); got != tt.want {
			t.Errorf("ParseValue(%q).String() = %q, want %q", tt.raw, got, tt.want)
		}
	}
}

func TestParseRamp(t *testing.T) {
	tests := []struct {
		in      string
		want    time.Duration
		wantErr bool
	}{
		{in: "0", want: 0},
		{in: "0s", want: 0},
		{in: "10m", want: 10 * time.Minute},
		{in: "90s", want: 90 * time.Second},
		{in: "1h30m", want: 90 * time.Minute},
		{in: " 5m ", want: 5 * time.Minute},
		{in: "abc", wantErr: true},
		{in: "-1s", wantErr: true},
		{in: "-0", want: 0}, // time.ParseDuration("-0") is 0: not negative
		{in: "10", wantErr: true},
		{in: "", wantErr: true},
		{in: "10 m", wantErr: true},
		{in: "24h", want: 24 * time.Hour},
		{in: "24h0m1s", wantErr: true},
		{in: "1000000h", wantErr: true},
		{in: "99999999999999999999h", wantErr: true},
		{in: "NaN", wantErr: true},
	}
	for _, tt := range tests {
		got, err := state.ParseRamp(tt.in)
		if tt.wantErr {
			if err == nil {
				t.Errorf("ParseRamp(%q) = %v, want an error", tt.in, got)
			} else if !strings.Contains(err.Error(), `"10m"`) {
				t.Errorf("ParseRamp(%q) error %q does not say what to write", tt.in, err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ParseRamp(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
}

func TestAdminString(t *testing.T) {
	for a, want := range map[state.Admin]string{state.Ready: "ready", state.Drain: "drain", state.Maint: "maint"} {
		if got := a.String(); got != want {
			t.Errorf("Admin(%d).String() = %q, want %q", a, got, want)
		}
	}
}

// Callers branch on ErrAboveMax, not on the message's text.
func TestParsePercentAboveMaxIsTyped(t *testing.T) {
	if _, err := state.ParsePercent("300%", state.MaxWeight); !errors.Is(err, state.ErrAboveMax) || err.Error() != "300% is above 256%: want 0% to 256%" {
		t.Errorf("state.ParsePercent(300%%) = %v, want ErrAboveMax with the same message", err)
	}
	if _, err := state.ParsePercent("lots", state.MaxWeight); err == nil || errors.Is(err, state.ErrAboveMax) {
		t.Errorf("state.ParsePercent(lots) = %v, want an error that is not ErrAboveMax", err)
	}
	if _, err := state.ParseValue("300%"); !errors.Is(err, state.ErrInvalidValue) || !strings.Contains(err.Error(), "weight 300% is above 256%") {
		t.Errorf("state.ParseValue(300%%) = %v", err)
	}
}
