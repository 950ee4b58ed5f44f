package state

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"time"
)

// RampPolicy says how the weight of an undrained server rises back to 100%.
// The zero value means no ramp.
type RampPolicy struct {
	// Start is the weight in percent (0..100) at the first step.
	Start int
	// Duration is the time from the start to 100%; 0 means no ramp.
	// At most MaxRampDuration.
	Duration time.Duration
	// Interval is the time between steps, MinRampInterval at least (a
	// key's own ramp duration may turn a policy with Duration 0 on, so it
	// is checked even then). Keep it at or above HAProxy's agent-inter.
	Interval time.Duration
	// Aggression shapes the curve as Envoy's slow start does: the weight
	// follows start + (100-start)·f^(1/Aggression) with f the elapsed
	// fraction. 1 is linear; above 1 rises fast early, below 1 slowly.
	// It must be finite and positive; WithDefaults turns 0 into 1.
	Aggression float64
	// FromMaint also ramps servers that leave maint, not only drain.
	FromMaint bool
}

// Bounds of a valid ramp policy.
const (
	// MinRampInterval is the shortest step interval. Weights are whole
	// percents, so a ramp writes at most about 100 raft entries whatever
	// the interval; the floor keeps the leader's step loop meaningful.
	MinRampInterval = 100 * time.Millisecond
	// MaxRampDuration bounds a ramp's duration, a step interval and a
	// key's own "ramp" value.
	MaxRampDuration = 24 * time.Hour
)

// DefaultRampPolicy is DESIGN.md's default: 10% to 100% over 5 minutes in
// 10-second steps, linear.
func DefaultRampPolicy() RampPolicy {
	return RampPolicy{Start: 10, Duration: 5 * time.Minute, Interval: 10 * time.Second, Aggression: 1}
}

// ErrInvalidRamp wraps errors in a ramp policy.
var ErrInvalidRamp = errors.New("invalid ramp policy")

// WithDefaults fills the fields a Go caller left at zero: Interval gets
// DefaultRampPolicy's, Aggression 1. Values parsed from KV never go through
// it: an explicit "interval":"0" there is invalid.
func (p RampPolicy) WithDefaults() RampPolicy {
	p.Interval = cmp.Or(p.Interval, DefaultRampPolicy().Interval)
	p.Aggression = cmp.Or(p.Aggression, 1)
	return p
}

// Validate reports what is wrong with the policy, in flag terms. Every
// field is checked whether or not the policy ramps: a key's own ramp
// duration can turn a policy with Duration 0 on.
func (p RampPolicy) Validate() error {
	switch {
	case p.Start < 0 || p.Start > 100:
		return fmt.Errorf("%w: start %d%%: want 0..100", ErrInvalidRamp, p.Start)
	case p.Duration < 0 || p.Duration > MaxRampDuration:
		return fmt.Errorf("%w: duration %s: want 0 (no ramp) up to %s", ErrInvalidRamp, p.Duration, MaxRampDuration)
	case p.Interval < MinRampInterval || p.Interval > MaxRampDuration:
		return fmt.Errorf("%w: interval %s: want a step interval from %s to %s, such as 10s", ErrInvalidRamp, p.Interval, MinRampInterval, MaxRampDuration)
	case !(p.Aggression > 0) || math.IsInf(p.Aggression, 0):
		return fmt.Errorf("%w: aggression %v: want a positive number (1 = linear)", ErrInvalidRamp, p.Aggression)
	}
	return nil
}

// WithDuration returns the policy with a key's own ramp duration, or an
// error when the combination is not a valid policy.
func (p RampPolicy) WithDuration(d time.Duration) (RampPolicy, error) {
	p.Duration = d
	return p, p.Validate()
}

// Enabled reports whether the policy ramps at all.
func (p RampPolicy) Enabled() bool { return p.Duration > 0 }

// Weight returns the weight elapsed after a ramp's start. Time advances in
// whole steps of Interval, so every replica and every HAProxy sees the same
// staircase. done is true once elapsed reaches Duration (weight 100).
// Weight never decreases with elapsed and stays within Start..100.
//
// Weight is total: a policy that fails Validate (one restored from an old
// snapshot, say) still gets an answer, never a panic: a non-positive
// interval rises continuously and a bad aggression is linear.
func (p RampPolicy) Weight(elapsed time.Duration) (w int, done bool) {
	if !p.Enabled() || elapsed >= p.Duration {
		return 100, true
	}
	elapsed = max(elapsed, 0)
	if p.Interval > 0 {
		elapsed = elapsed / p.Interval * p.Interval
	}
	f := float64(elapsed) / float64(p.Duration)
	a := p.Aggression
	if !(a > 0) || math.IsInf(a, 0) {
		a = 1
	}
	start := min(max(p.Start, 0), 100)
	x := float64(start) + float64(100-start)*math.Pow(f, 1/a)
	if math.IsNaN(x) {
		x = float64(start)
	}
	w = int(math.Floor(min(x, 100) + 0.5))
	return min(max(w, start), 100), false
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

const rampPolicyExample = `{"start":"10%","duration":"5m","interval":"10s","aggression":1.0,"from_maint":false}`

// ParseRampPolicy parses a ramp policy override, e.g.
// {"start":"10%","duration":"5m","interval":"10s","aggression":1.0,"from_maint":false},
// on top of base (the flags). Errors wrap ErrInvalidRamp.
func ParseRampPolicy(raw string, base RampPolicy) (RampPolicy, error) {
	if !strings.HasPrefix(strings.TrimSpace(raw), "{") {
		return base, fmt.Errorf("%w: %q is not a JSON object; want e.g. %s", ErrInvalidRamp, cut(raw, 80), rampPolicyExample)
	}
	dec := json.NewDecoder(strings.NewReader(raw))
	dec.DisallowUnknownFields()
	var j rampPolicyJSON
	if err := dec.Decode(&j); err != nil {
		return base, fmt.Errorf(`%w: %v; want e.g. %s`, ErrInvalidRamp, err, rampPolicyExample)
	}
	if _, err := dec.Token(); err != io.EOF {
		return base, fmt.Errorf(`%w: trailing data after the object; want e.g. %s`, ErrInvalidRamp, rampPolicyExample)
	}
	p := base
	if j.Start != nil {
		var s string
		if err := json.Unmarshal(*j.Start, &s); err != nil {
			s = string(*j.Start) // a bare number
		}
		n, err := ParsePercent(s, 100)
		if err != nil {
			return base, fmt.Errorf("%w: start %v", ErrInvalidRamp, err)
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
