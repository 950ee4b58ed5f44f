package kvsync

import (
	"testing"
	"time"
)

func TestBackoff(t *testing.T) {
	t.Parallel()
	const ms = time.Millisecond
	tests := []struct {
		attempt   int
		base, max time.Duration
		want      time.Duration
	}{
		{0, 250 * ms, 30 * time.Second, 250 * ms},
		{1, 250 * ms, 30 * time.Second, 500 * ms},
		{2, 250 * ms, 30 * time.Second, time.Second},
		{6, 250 * ms, 30 * time.Second, 16 * time.Second},
		{7, 250 * ms, 30 * time.Second, 30 * time.Second},
		{8, 250 * ms, 30 * time.Second, 30 * time.Second},
		{1000, 250 * ms, 30 * time.Second, 30 * time.Second},
		{-1, 250 * ms, 30 * time.Second, 250 * ms},
		{0, 250 * ms, 100 * ms, 100 * ms},    // cap below base
		{3, 0, time.Second, 0},               // no base, no wait
		{3, time.Second, 0, 8 * time.Second}, // max 0: no cap
		{200, time.Second, 0, 1<<63 - 1},     // saturates, no overflow
		{62, 1, 0, 1 << 62},                  // largest exact power
		{40, time.Hour, 24 * time.Hour, 24 * time.Hour},
	}
	for _, tt := range tests {
		if got := Backoff(tt.attempt, tt.base, tt.max); got != tt.want {
			t.Errorf("Backoff(%d, %s, %s) = %s, want %s", tt.attempt, tt.base, tt.max, got, tt.want)
		}
	}
}
