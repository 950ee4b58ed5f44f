package ratelog

import (
	"sync"
	"testing"
	"time"
)

// fakeClock is a settable clock for code that takes a now function.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func TestLogLimiter(t *testing.T) {
	clock := &fakeClock{t: time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)}
	l := New(time.Second, clock.now)

	type step struct {
		advance        time.Duration
		wantOK         bool
		wantSuppressed int64
	}
	steps := []step{
		{0, true, 0},                       // first event passes
		{0, false, 0},                      // same instant: suppressed (1)
		{500 * time.Millisecond, false, 0}, // within the second: suppressed (2)
		{499 * time.Millisecond, false, 0}, // 999ms after the first: suppressed (3)
		{time.Millisecond, true, 3},        // a second after the first: passes, reports 3
		{10 * time.Second, true, 0},        // long quiet: passes, nothing hidden
		{0, false, 0},                      // suppressed (1)
	}
	for i, st := range steps {
		clock.advance(st.advance)
		ok, n := l.Allow()
		if ok != st.wantOK || n != st.wantSuppressed {
			t.Fatalf("step %d: allow() = %v, %d; want %v, %d", i, ok, n, st.wantOK, st.wantSuppressed)
		}
	}
	if n := l.Flush(); n != 1 {
		t.Errorf("flush() = %d, want 1", n)
	}
	if n := l.Flush(); n != 0 {
		t.Errorf("second flush() = %d, want 0", n)
	}
}

func TestLogLimiterConcurrent(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	l := New(time.Second, clock.now)
	const goroutines, each = 8, 1000
	var wg sync.WaitGroup
	var mu sync.Mutex
	passed := 0
	for range goroutines {
		wg.Go(func() {
			for range each {
				if ok, _ := l.Allow(); ok {
					mu.Lock()
					passed++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if passed != 1 {
		t.Fatalf("%d events passed in one instant, want 1", passed)
	}
	clock.advance(time.Second)
	ok, hidden := l.Allow()
	if !ok || hidden != goroutines*each-1 {
		t.Fatalf("allow() after a second = %v, %d; want true, %d", ok, hidden, goroutines*each-1)
	}
}
