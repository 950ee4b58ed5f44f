package write

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hastate/hastate/cmd/hastate/internal/ctl"
	"github.com/hastate/hastate/state"
)

func TestValue(t *testing.T) {
	now := time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)
	v, err := Value("drain", ValueOptions{Reason: "zonal maintenance", By: "alice", Ramp: "10m", For: 2 * time.Hour, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	p, err := state.ParseValue(v)
	if err != nil || p.Admin != state.Drain || p.Reason != "zonal maintenance" || p.By != "alice" || !p.RampSet ||
		!p.Until.Equal(now.Add(2*time.Hour)) || !p.At.Equal(now) {
		t.Fatalf("Value round trip: %q -> %+v, %v", v, p, err)
	}
	for _, bad := range []struct {
		st   string
		o    ValueOptions
		want string
	}{
		{"drian", ValueOptions{}, `state "drian": want ready, drain, maint`},
		{"drain", ValueOptions{Ramp: "ten minutes"}, `--ramp: ramp "ten minutes"`},
		{"drain", ValueOptions{For: -time.Hour}, "--for -1h0m0s: want a positive duration"},
		// Issue 45: one rule for units.
		{"drain", ValueOptions{Ramp: "90"}, "--ramp 90 has no unit: write 90s, 90m or 90h"},
	} {
		_, err := Value(bad.st, bad.o)
		if !errors.Is(err, ctl.ErrUsage) || !strings.Contains(err.Error(), bad.want) || strings.Contains(err.Error(), "{") {
			t.Errorf("Value(%q, %+v) = %v, want a usage error %q without JSON", bad.st, bad.o, err, bad.want)
		}
	}
}

func TestParseWeight(t *testing.T) {
	for in, want := range map[string]string{"25%": "25%", "25": "ERR:weight 25 has no unit: write 25%, a percentage of each server's configured weight", "0%": "0%", "256%": "256%",
		"300%": "ERR:weight 300% is above 256%", "-5%": "ERR:weight -5% is below 0%", "lots": "ERR:want a whole percentage", "2.5%": "ERR:want a whole"} {
		got, err := ParseWeight(in)
		if strings.HasPrefix(want, "ERR:") {
			if !errors.Is(err, ctl.ErrUsage) || !strings.Contains(err.Error(), want[4:]) {
				t.Errorf("ParseWeight(%q) = %q, %v; want usage error %q", in, got, err, want[4:])
			}
		} else if got != want || err != nil {
			t.Errorf("ParseWeight(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}
