package write

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/hastate/hastate/cmd/hastate/internal/ctl"
	"github.com/hastate/hastate/state"
)

// MaxTxnKeys is the most operations one Consul transaction may carry.
const MaxTxnKeys = 64

// ValueOptions are the audit fields and options of a written value.
type ValueOptions struct {
	Reason, By string
	// Ramp is the undrain ramp duration for these keys ("": the policy's,
	// "0": none).
	Ramp string
	// For makes the state expire that long after Now (0: never).
	For time.Duration
	Now time.Time
}

// Value builds the JSON value written for a state ("ready", "drain",
// "maint" or "N%"), and checks each part in the operator's terms.
func Value(st string, o ValueOptions) (string, error) {
	v := map[string]string{"state": st}
	if _, err := state.ParseValue(st); err != nil {
		return "", fmt.Errorf("%w: state %q: want ready, drain, maint or a weight such as 25%%", ctl.ErrUsage, st)
	}
	if o.Reason != "" {
		v["reason"] = o.Reason
	}
	if o.By != "" {
		v["by"] = o.By
	}
	if o.Ramp != "" {
		if err := ctl.CheckDurationUnit("--ramp", o.Ramp); err != nil {
			return "", err
		}
		if _, err := state.ParseRamp(o.Ramp); err != nil {
			return "", fmt.Errorf("%w: --ramp: %v", ctl.ErrUsage, err)
		}
		v["ramp"] = o.Ramp
	}
	if o.For < 0 {
		return "", fmt.Errorf("%w: --for %s: want a positive duration such as 2h", ctl.ErrUsage, o.For)
	}
	if !o.Now.IsZero() {
		v["at"] = o.Now.UTC().Format(time.RFC3339)
		if o.For > 0 {
			v["until"] = o.Now.Add(o.For).UTC().Format(time.RFC3339)
		}
	}
	b, err := json.Marshal(v)
	if err != nil {
		return "", err
	}
	if _, err := state.ParseValue(string(b)); err != nil {
		return "", fmt.Errorf("%w: %v", ctl.ErrUsage, err) // a bug: every part was checked
	}
	return string(b), nil
}

// ParseWeight reads the weight argument of `hastate weight`: a whole
// percentage 0..256 with its %, "25%" ("25" alone is refused: see
// ctl.CheckWeightUnit).
func ParseWeight(arg string) (string, error) {
	if err := ctl.CheckWeightUnit(arg); err != nil && !strings.HasPrefix(strings.TrimSpace(arg), "-") {
		return "", err
	}
	if strings.HasPrefix(strings.TrimSpace(arg), "-") {
		return "", fmt.Errorf("%w: weight %s is below 0%%: want 0%% to %d%%", ctl.ErrUsage, arg, state.MaxWeight)
	}
	n, err := state.ParsePercent(arg, state.MaxWeight)
	if err != nil {
		return "", fmt.Errorf("%w: weight %v (HAProxy's cap is %d%%)", ctl.ErrUsage, err, state.MaxWeight)
	}
	return strconv.Itoa(n) + "%", nil
}
