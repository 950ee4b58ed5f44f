package state

import (
	"errors"
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
		{"aggression 0 is linear",
			RampPolicy{Start: 0, Duration: 10 * s, Interval: s},
			[]time.Duration{5 * s}, []int{50}},
		{"duration shorter than one interval: start, then 100",
			RampPolicy{Start: 10, Duration: 5 * s, Interval: 10 * s, Aggression: 1},
			[]time.Duration{0, 4 * s, 5 * s},
			[]int{10, 10, 100}},
		{"no ramp",
			RampPolicy{Start: 10, Duration: 0, Interval: s},
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

func TestRampNextStep(t *testing.T) {
	p := RampPolicy{Start: 10, Duration: 10 * time.Second, Interval: 3 * time.Second}
	for e, want := range map[time.Duration]time.Duration{0: 3 * time.Second, 3 * time.Second: 6 * time.Second, 9 * time.Second: 10 * time.Second, -time.Second: 3 * time.Second} {
		if got := p.NextStep(e); got != want {
			t.Errorf("NextStep(%s) = %s, want %s", e, got, want)
		}
	}
}

func TestRampPolicyValidate(t *testing.T) {
	for _, p := range []RampPolicy{
		{Start: -1, Duration: time.Minute, Interval: time.Second},
		{Start: 101, Duration: time.Minute, Interval: time.Second},
		{Start: 10, Duration: -time.Minute, Interval: time.Second},
		{Start: 10, Duration: time.Minute, Interval: 0},
		{Start: 10, Duration: time.Minute, Interval: time.Second, Aggression: -1},
	} {
		if err := p.Validate(); !errors.Is(err, ErrInvalidRamp) {
			t.Errorf("Validate(%+v) = %v, want ErrInvalidRamp", p, err)
		}
	}
	if err := DefaultRampPolicy().Validate(); err != nil {
		t.Fatal(err)
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
	for _, bad := range []string{`{"start":"lots"}`, `{"duration":"soon"}`, `{"interval":"0"}`, `{"speed":1}`, `nope`, `{"start":"150%"}`} {
		got, err := ParseRampPolicy(bad, base)
		if !errors.Is(err, ErrInvalidRamp) || got != base {
			t.Errorf("ParseRampPolicy(%s) = %+v, %v; want base and ErrInvalidRamp", bad, got, err)
		}
		if err != nil && !strings.Contains(err.Error(), "want") {
			t.Errorf("error %q does not say what to write", err)
		}
	}
}
