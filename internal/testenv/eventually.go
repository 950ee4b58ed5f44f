package testenv

import (
	"fmt"
	"testing"
	"time"
)

// Eventually polls cond until it returns nil and fails the test with cond's
// last error when d passes first. It polls after 10ms, then backs off to
// every 100ms, so a quick condition is seen at once and a slow one (an
// HTTP round trip to a replica) does not load the machine. cond may call
// t.Fatal to give up early.
func Eventually(t testing.TB, d time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	gap := 10 * time.Millisecond
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %v", d, err)
		}
		time.Sleep(gap)
		gap = min(2*gap, 100*time.Millisecond)
	}
}

// Expect returns nil when ok, else an error from format and args: the
// one-line condition of an Eventually, with the message it fails with.
func Expect(ok bool, format string, args ...any) error {
	if ok {
		return nil
	}
	return fmt.Errorf(format, args...)
}

// Consistently checks cond every 50ms for d, and fails the test with cond's
// error the first time it is not nil: "nothing changes meanwhile". It is
// the check to run while something else exercises the system (probes, a
// gate's rounds); use it only after something proves the system was
// exercised during d. cond may call t.Fatal.
func Consistently(t testing.TB, d time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		if err := cond(); err != nil {
			t.Fatalf("changed within %s: %v", d, err)
		}
		if !time.Now().Before(deadline) {
			return
		}
		time.Sleep(min(50*time.Millisecond, time.Until(deadline)+time.Millisecond))
	}
}
