package ctl

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Every quantity an operator types carries its unit: a duration its s, m
// or h (--for, --ramp, --timeout, --idle-timeout), a weight its % (hastate
// weight). A bare number is refused with what to write instead, never
// guessed: 90 is not seconds for one flag and minutes for another, and 25
// is not HAProxy's weight 25 (of 256) read as 25%.

// bareNumber reports whether s is a number without a unit.
func bareNumber(s string) bool {
	_, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	return err == nil
}

// MissingUnit is the usage error for a bare number: what (a flag or an
// argument) was given arg, and example says what to write.
func MissingUnit(what, arg, example string) error {
	return fmt.Errorf("%w: %s %s has no unit: write %s (every duration takes s, m or h, every weight %%)", ErrUsage, what, arg, example)
}

// ParseDuration reads a duration an operator typed for what (e.g.
// "--for"): a Go duration with its unit ("90s", "10m", "2h"); "0" is
// zero. A bare number is MissingUnit, anything else a usage error saying
// what is wanted.
func ParseDuration(what, s string) (time.Duration, error) {
	t := strings.TrimSpace(s)
	if t == "0" {
		return 0, nil
	}
	if err := CheckDurationUnit(what, t); err != nil {
		return 0, err
	}
	d, err := time.ParseDuration(t)
	if err != nil {
		return 0, fmt.Errorf("%w: %s %q: want a duration such as 90s, 10m or 2h", ErrUsage, what, t)
	}
	return d, nil
}

// CheckDurationUnit refuses a duration typed without its unit (--for 90);
// "0" is zero and needs none.
func CheckDurationUnit(what, s string) error {
	if t := strings.TrimSpace(s); t != "0" && bareNumber(t) {
		return MissingUnit(what, t, fmt.Sprintf("%ss, %sm or %sh", t, t, t))
	}
	return nil
}

// DurationFlag is a pflag.Value for a duration flag read by
// ParseDuration: `--for 90` says which unit to add, not Go's "time:
// missing unit in duration".
type DurationFlag struct {
	D    *time.Duration
	Name string // the flag, for messages: "--for"
}

func (f DurationFlag) String() string {
	if f.D == nil || *f.D == 0 {
		return "0" // pflag shows no default for it
	}
	return f.D.String()
}

// Set is ParseDuration; its error is said without "usage:", which the
// flag error (pflag's "invalid argument ... for flag") adds once.
func (f DurationFlag) Set(s string) error {
	d, err := ParseDuration(f.Name, s)
	if err != nil {
		return errors.New(strings.TrimPrefix(err.Error(), ErrUsage.Error()+": "))
	}
	*f.D = d
	return nil
}

func (f DurationFlag) Type() string { return "duration" }

// CheckWeightUnit refuses a weight typed without its % (hastate weight 25).
func CheckWeightUnit(arg string) error {
	if t := strings.TrimSpace(arg); bareNumber(t) {
		return MissingUnit("weight", t, t+"%, a percentage of each server's configured weight")
	}
	return nil
}
