package kvsync

import "time"

// Backoff returns how long to wait after the attempt-th consecutive failure
// (0 for the first): base doubled attempt times, capped at max. A negative
// attempt counts as 0, base <= 0 gives 0 and max <= 0 means no cap (the
// result then saturates instead of overflowing). It is a pure function.
func Backoff(attempt int, base, max time.Duration) time.Duration {
	if base <= 0 {
		return 0
	}
	if attempt < 0 {
		attempt = 0
	}
	limit := max
	if limit <= 0 {
		limit = time.Duration(1<<63 - 1)
	}
	d := base
	for range attempt {
		if d >= limit/2 {
			return limit
		}
		d *= 2
	}
	if d > limit {
		return limit
	}
	return d
}
