package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// RampPolicy says how the weight of an undrained server rises back to 100%.
// The zero value means no ramp.
type RampPolicy struct {
	// Start is the weight in percent (0..100) at the first step.
	Start int
	// Duration is the time from the start to 100%; 0 means no ramp.
	Duration time.Duration
	// Interval is the time between steps; it must be positive when
	// Duration is. Keep it at or above HAProxy's agent-inter.
	Interval time.Duration
	// Aggression shapes the curve as Envoy's slow start does: the weight
	// follows start + (100-start)·f^(1/Aggression) with f the elapsed
	// fraction. 1 is linear; above 1 rises fast early, below 1 slowly.
	// 0 is taken as 1.
	Aggression float64
	// FromMaint also ramps servers that leave maint, not only drain.
	FromMaint bool
}

// DefaultRampPolicy is DESIGN.md's default: 10% to 100% over 5 minutes in
// 10-second steps, linear.
func DefaultRampPolicy() RampPolicy {
	return RampPolicy{Start: 10, Duration: 5 * time.Minute, Interval: 10 * time.Second, Aggression: 1}
}

// ErrInvalidRamp wraps errors in a ramp policy.
var ErrInvalidRamp = errors.New("invalid ramp policy")

// Validate reports what is wrong with the policy, in flag terms.
func (p RampPolicy) Validate() error {
	switch {
	case p.Start < 0 || p.Start > 100:
		return fmt.Errorf("%w: start %d%%: want 0..100", ErrInvalidRamp, p.Start)
	case p.Duration < 0:
		return fmt.Errorf("%w: duration %s is negative (0 disables ramps)", ErrInvalidRamp, p.Duration)
	case p.Duration > 0 && p.Interval <= 0:
		return fmt.Errorf("%w: interval %s: want a positive step interval such as 10s", ErrInvalidRamp, p.Interval)
	case p.Aggression < 0 || math.IsNaN(p.Aggression) || math.IsInf(p.Aggression, 0):
		return fmt.Errorf("%w: aggression %v: want a positive number (1 = linear)", ErrInvalidRamp, p.Aggression)
	}
	return nil
}

// Enabled reports whether the policy ramps at all.
func (p RampPolicy) Enabled() bool { return p.Duration > 0 }

// Weight returns the weight elapsed after a ramp's start. Time advances in
// whole steps of Interval, so every replica and every HAProxy sees the same
// staircase. done is true once elapsed reaches Duration (weight 100).
// Weight never decreases with elapsed and stays within Start..100.
func (p RampPolicy) Weight(elapsed time.Duration) (w int, done bool) {
	if !p.Enabled() || elapsed >= p.Duration {
		return 100, true
	}
	if elapsed < 0 {
		elapsed = 0
	}
	step := elapsed / p.Interval
	f := float64(step*p.Interval) / float64(p.Duration)
	a := p.Aggression
	if a == 0 {
		a = 1
	}
	x := float64(p.Start) + float64(100-p.Start)*math.Pow(f, 1/a)
	w = int(math.Floor(x + 0.5))
	return min(max(w, p.Start, 0), 100), false
}

// NextStep returns the elapsed time of the step after elapsed (at most
// Duration), for scheduling.
func (p RampPolicy) NextStep(elapsed time.Duration) time.Duration {
	if !p.Enabled() {
		return 0
	}
	if elapsed < 0 {
		elapsed = 0
	}
	next := (elapsed/p.Interval + 1) * p.Interval
	return min(next, p.Duration)
}

// rampPolicyJSON is the <prefix>config/ramp value. Absent fields keep the
// base policy's value.
type rampPolicyJSON struct {
	Start      *json.RawMessage `json:"start"`
	Duration   *string          `json:"duration"`
	Interval   *string          `json:"interval"`
	Aggression *float64         `json:"aggression"`
	FromMaint  *bool            `json:"from_maint"`
}

// ParseRampPolicy parses a ramp policy override, e.g.
// {"start":"10%","duration":"5m","interval":"10s","aggression":1.0,"from_maint":false},
// on top of base (the flags). Errors wrap ErrInvalidRamp.
func ParseRampPolicy(raw string, base RampPolicy) (RampPolicy, error) {
	dec := json.NewDecoder(strings.NewReader(raw))
	dec.DisallowUnknownFields()
	var j rampPolicyJSON
	if err := dec.Decode(&j); err != nil {
		return base, fmt.Errorf(`%w: %v; want e.g. {"start":"10%%","duration":"5m","interval":"10s","aggression":1.0,"from_maint":false}`, ErrInvalidRamp, err)
	}
	p := base
	if j.Start != nil {
		var s string
		if err := json.Unmarshal(*j.Start, &s); err != nil {
			s = string(*j.Start) // a bare number
		}
		n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(s), "%"))
		if err != nil {
			return base, fmt.Errorf("%w: start %s: want a percentage such as \"10%%\"", ErrInvalidRamp, *j.Start)
		}
		p.Start = n
	}
	for _, d := range []struct {
		in  *string
		out *time.Duration
		f   string
	}{{j.Duration, &p.Duration, "duration"}, {j.Interval, &p.Interval, "interval"}} {
		if d.in == nil {
			continue
		}
		v, err := ParseRamp(*d.in)
		if err != nil {
			return base, fmt.Errorf("%w: %s: %v", ErrInvalidRamp, d.f, err)
		}
		*d.out = v
	}
	if j.Aggression != nil {
		p.Aggression = *j.Aggression
	}
	if j.FromMaint != nil {
		p.FromMaint = *j.FromMaint
	}
	if err := p.Validate(); err != nil {
		return base, err
	}
	return p, nil
}
