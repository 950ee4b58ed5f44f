package state

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

func TestRampWeightSchedules(t *testing.T) {
	s := time.Second
	tests := []struct {
		name string
		p    RampPolicy
		at   []time.Duration
		want []int
	}{
		{"linear 10% over 10s in 1s steps",
			RampPolicy{Start: 10, Duration: 10 * s, Interval: s, Aggression: 1},
			[]time.Duration{0, 999 * time.Millisecond, s, 5 * s, 5500 * time.Millisecond, 9 * s, 10 * s, time.Hour},
			[]int{10, 10, 19, 55, 55, 91, 100, 100}},
		{"start 0%",
			RampPolicy{Start: 0, Duration: 10 * s, Interval: 2 * s, Aggression: 1},
			[]time.Duration{0, 2 * s, 4 * s, 8 * s, 10 * s},
			[]int{0, 20, 40, 80, 100}},
		{"start 50%",
			RampPolicy{Start: 50, Duration: 10 * s, Interval: 5 * s, Aggression: 1},
			[]time.Duration{0, 4 * s, 5 * s, 10 * s},
			[]int{50, 50, 75, 100}},
		{"aggression 2 rises fast early (sqrt)",
			RampPolicy{Start: 0, Duration: 100 * s, Interval: s, Aggression: 2},
			[]time.Duration{0, 25 * s, 49 * s, 81 * s},
			[]int{0, 50, 70, 90}},
		{"aggression 0.5 rises slowly early (square)",
			RampPolicy{Start: 0, Duration: 100 * s, Interval: s, Aggression: 0.5},
			[]time.Duration{0, 50 * s, 90 * s},
			[]int{0, 25, 81}},
		{"aggression 0 (a Go zero value) is linear after WithDefaults",
			RampPolicy{Start: 0, Duration: 10 * s, Interval: s}.WithDefaults(),
			[]time.Duration{5 * s}, []int{50}},
		{"duration shorter than one interval: start, then 100",
			RampPolicy{Start: 10, Duration: 5 * s, Interval: 10 * s, Aggression: 1},
			[]time.Duration{0, 4 * s, 5 * s},
			[]int{10, 10, 100}},
		{"no ramp",
			RampPolicy{Start: 10, Duration: 0, Interval: s, Aggression: 1},
			[]time.Duration{0}, []int{100}},
		{"negative elapsed (clock skew between leaders) stays at start",
			RampPolicy{Start: 10, Duration: 10 * s, Interval: s, Aggression: 1},
			[]time.Duration{-5 * s}, []int{10}},
		{"rounding half up",
			RampPolicy{Start: 0, Duration: 8 * s, Interval: s, Aggression: 1},
			[]time.Duration{s, 3 * s}, []int{13, 38}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.p.Validate(); err != nil {
				t.Fatal(err)
			}
			for i, at := range tt.at {
				w, done := tt.p.Weight(at)
				if w != tt.want[i] {
					t.Errorf("Weight(%s) = %d, want %d", at, w, tt.want[i])
				}
				if done != (w == 100 && (at >= tt.p.Duration)) {
					t.Errorf("Weight(%s) done = %v", at, done)
				}
			}
		})
	}
}

func TestRampWeightIsMonotonicAndClamped(t *testing.T) {
	for _, p := range []RampPolicy{
		{Start: 10, Duration: 5 * time.Minute, Interval: 10 * time.Second, Aggression: 1},
		{Start: 0, Duration: time.Minute, Interval: 3 * time.Second, Aggression: 3.7},
		{Start: 99, Duration: time.Minute, Interval: 7 * time.Second, Aggression: 0.1},
		{Start: 100, Duration: time.Minute, Interval: time.Second, Aggression: 1},
	} {
		prev := -1
		for e := time.Duration(0); e <= p.Duration+time.Second; e += 500 * time.Millisecond {
			w, _ := p.Weight(e)
			if w < prev || w < p.Start || w > 100 {
				t.Fatalf("%+v: Weight(%s) = %d after %d", p, e, w, prev)
			}
			prev = w
		}
		if prev != 100 {
			t.Fatalf("%+v never reached 100", p)
		}
	}
}

func TestRampPolicyValidate(t *testing.T) {
	ok := DefaultRampPolicy()
	for _, tt := range []struct {
		name string
		edit func(*RampPolicy)
	}{
		{"start below 0", func(p *RampPolicy) { p.Start = -1 }},
		{"start above 100", func(p *RampPolicy) { p.Start = 101 }},
		{"negative duration", func(p *RampPolicy) { p.Duration = -time.Minute }},
		{"duration above the bound", func(p *RampPolicy) { p.Duration = MaxRampDuration + 1 }},
		{"zero interval", func(p *RampPolicy) { p.Interval = 0 }},
		{"zero interval with ramps off (a key may turn them on)", func(p *RampPolicy) { p.Interval, p.Duration = 0, 0 }},
		{"negative interval", func(p *RampPolicy) { p.Interval = -time.Second }},
		{"interval below the floor", func(p *RampPolicy) { p.Interval = time.Millisecond }},
		{"interval above the bound", func(p *RampPolicy) { p.Interval = MaxRampDuration + 1 }},
		{"negative aggression", func(p *RampPolicy) { p.Aggression = -1 }},
		{"zero aggression", func(p *RampPolicy) { p.Aggression = 0 }},
		{"NaN aggression", func(p *RampPolicy) { p.Aggression = math.NaN() }},
		{"infinite aggression", func(p *RampPolicy) { p.Aggression = math.Inf(1) }},
	} {
		p := ok
		tt.edit(&p)
		if err := p.Validate(); !errors.Is(err, ErrInvalidRamp) || !strings.Contains(err.Error(), "want") {
			t.Errorf("%s: Validate(%+v) = %v, want ErrInvalidRamp saying what to set", tt.name, p, err)
		}
	}
	for _, p := range []RampPolicy{ok, {Interval: MinRampInterval, Aggression: 1}, RampPolicy{}.WithDefaults(),
		{Start: 100, Duration: MaxRampDuration, Interval: MaxRampDuration, Aggression: 1e-9}} {
		if err := p.Validate(); err != nil {
			t.Errorf("Validate(%+v) = %v, want nil", p, err)
		}
	}
	if _, err := (RampPolicy{Duration: 0, Interval: 0}).WithDuration(10 * time.Minute); !errors.Is(err, ErrInvalidRamp) {
		t.Errorf("a key's 10m ramp on a policy with interval 0 = %v, want ErrInvalidRamp", err)
	}
}

// TestRampWeightIsTotal: Weight answers for policies that fail Validate
// (restored from an old snapshot or log) instead of panicking; the answer
// stays within 0..100.
func TestRampWeightIsTotal(t *testing.T) {
	for _, p := range []RampPolicy{
		{Start: 10, Duration: 10 * time.Minute},
		{Start: 10, Duration: 10 * time.Minute, Interval: -time.Second, Aggression: math.NaN()},
		{Start: -50, Duration: time.Minute, Interval: time.Second, Aggression: math.Inf(-1)},
		{Start: 500, Duration: time.Minute, Interval: time.Second, Aggression: 1},
		{Start: 10, Duration: time.Minute, Interval: time.Nanosecond, Aggression: 1e-300},
		{Start: 10, Duration: time.Duration(math.MaxInt64), Interval: time.Duration(math.MaxInt64), Aggression: 1e300},
	} {
		for _, e := range []time.Duration{math.MinInt64, -1, 0, 1, time.Second, 30 * time.Second, p.Duration, math.MaxInt64} {
			w, _ := p.Weight(e)
			if w < 0 || w > 100 {
				t.Errorf("%+v: Weight(%d) = %d, want 0..100", p, e, w)
			}
		}
	}
}

func TestParseRampPolicy(t *testing.T) {
	base := DefaultRampPolicy()
	p, err := ParseRampPolicy(`{"start":"20%","duration":"10m","interval":"30s","aggression":2,"from_maint":true}`, base)
	if err != nil {
		t.Fatal(err)
	}
	want := RampPolicy{Start: 20, Duration: 10 * time.Minute, Interval: 30 * time.Second, Aggression: 2, FromMaint: true}
	if p != want {
		t.Fatalf("got %+v, want %+v", p, want)
	}
	p, err = ParseRampPolicy(`{"start":5,"duration":"0"}`, base)
	if err != nil || p.Start != 5 || p.Enabled() || p.Interval != base.Interval {
		t.Fatalf("partial override: %+v %v", p, err)
	}
	for _, bad := range []string{`{"start":"lots"}`, `{"duration":"soon"}`, `{"interval":"0"}`, `{"duration":"0","interval":"0"}`, `{"interval":"1ms"}`,
		`{"duration":"25h"}`, `{"duration":"-1m"}`, `{"duration":10}`, `{"aggression":"fast"}`, `{"aggression":0}`, `{"aggression":-2}`,
		`{"start":true}`, `{"start":"-5%"}`, `{"from_maint":"yes"}`, `{"duration":"5m"} {"start":1}`, `[]`, `null`, `""`, `{"speed":1}`, `nope`, `{"start":"150%"}`} {
		got, err := ParseRampPolicy(bad, base)
		if !errors.Is(err, ErrInvalidRamp) || got != base {
			t.Errorf("ParseRampPolicy(%s) = %+v, %v; want base and ErrInvalidRamp", bad, got, err)
		}
		if err != nil && !strings.Contains(err.Error(), "want") {
			t.Errorf("error %q does not say what to write", err)
		}
	}
}
