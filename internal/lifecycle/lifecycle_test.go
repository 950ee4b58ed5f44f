package lifecycle

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
)

func TestStopRunsLastFirstOnce(t *testing.T) {
	var s Stops
	var ran []string
	errB := errors.New("b failed")
	for _, name := range []string{"a", "b", "c"} {
		s.Add(name, func(context.Context) error {
			ran = append(ran, name)
			if name == "b" {
				return errB
			}
			return nil
		})
	}
	err := s.Stop(context.Background())
	if !slices.Equal(ran, []string{"c", "b", "a"}) {
		t.Errorf("ran %v, want c b a (every step, last first, past a failing one)", ran)
	}
	if !errors.Is(err, errB) || err.Error() != "stop b: b failed" {
		t.Errorf("Stop = %v, want b's error named", err)
	}
	if err2 := s.Stop(context.Background()); err2 != err || len(ran) != 3 {
		t.Errorf("second Stop = %v and ran %v, want the first result and nothing run again", err2, ran)
	}
}

func TestStopConcurrentCallsWaitForTheFirst(t *testing.T) {
	var s Stops
	release := make(chan struct{})
	n := 0
	s.Add("slow", func(context.Context) error { <-release; n++; return nil })
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			if err := s.Stop(context.Background()); err != nil {
				t.Error(err)
			}
		})
	}
	close(release)
	wg.Wait()
	if n != 1 {
		t.Errorf("the step ran %d times, want once", n)
	}
}

func TestZeroStopsStops(t *testing.T) {
	var s Stops
	if err := s.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestAddAfterStopRunsAtOnce(t *testing.T) {
	var s Stops
	_ = s.Stop(context.Background())
	ran := false
	s.Add("late", func(context.Context) error { ran = true; return nil })
	if !ran {
		t.Error("a step added after Stop was not run")
	}
}
