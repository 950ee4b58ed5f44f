// Package lifecycle keeps the stops of a component's start steps, as
// alertmanager's app/lifecycle.go does: each step that started something
// registers how to stop it, and Stop runs them last-first. A start that
// fails half-way calls Stop and undoes exactly what was started; a
// component's Stop is the same call. The order a reader sees in Start is
// the order of the stops, reversed.
package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// Stops is a list of stop steps. The zero value is empty and ready.
type Stops struct {
	mu    sync.Mutex
	steps []step
	done  bool
	err   error
}

type step struct {
	name string
	stop func(context.Context) error
}

// Add registers the stop of what was just started; name says what it
// stops, in Stop's errors. A step added once Stop has run (a start that
// raced with it) is run at once, so nothing started is left running.
func (s *Stops) Add(name string, stop func(context.Context) error) {
	s.mu.Lock()
	if !s.done {
		s.steps = append(s.steps, step{name, stop})
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	_ = stop(context.Background())
}

// Stop runs the steps last-first, every one of them whatever the others
// return, and returns their errors joined, each named. It is safe to call
// more than once and from several goroutines: later calls wait for the
// first and return its result.
func (s *Stops) Stop(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done {
		return s.err
	}
	s.done = true
	var errs []error
	for i := len(s.steps) - 1; i >= 0; i-- {
		if err := s.steps[i].stop(ctx); err != nil {
			errs = append(errs, fmt.Errorf("stop %s: %w", s.steps[i].name, err))
		}
	}
	s.steps = nil
	s.err = errors.Join(errs...)
	return s.err
}
