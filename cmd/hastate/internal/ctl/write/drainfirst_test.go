package write

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hastate/hastate/cmd/hastate/internal/ctl"
	"github.com/hastate/hastate/cmd/hastate/internal/ctl/haproxy"
)

// drainFirstRun records the steps DrainFirst takes.
type drainFirstRun struct {
	mu    sync.Mutex
	steps []string
	out   strings.Builder
}

func (r *drainFirstRun) log(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.steps = append(r.steps, s)
}

func (r *drainFirstRun) options(idle func(context.Context) (haproxy.IdleResult, error)) DrainFirstOptions {
	o := DrainFirstOptions{
		Targets: "web/a",
		Write: func(ctx context.Context, st string) error {
			r.log("write " + st)
			return nil
		},
		Told: func(ctx context.Context) error {
			r.log("told")
			return nil
		},
		Timeout:     time.Second,
		IdleTimeout: 200 * time.Millisecond,
		Out:         &r.out,
	}
	if idle != nil {
		o.Idle = func(ctx context.Context) (haproxy.IdleResult, error) {
			r.log("idle")
			return idle(ctx)
		}
	}
	return o
}

func TestDrainFirst(t *testing.T) {
	untilDone := func(err error) func(context.Context) (haproxy.IdleResult, error) {
		return func(ctx context.Context) (haproxy.IdleResult, error) {
			<-ctx.Done()
			return haproxy.IdleResult{}, err
		}
	}
	for _, tc := range []struct {
		name     string
		idle     func(context.Context) (haproxy.IdleResult, error)
		minWait  time.Duration // at least this long before maint
		steps    string
		says     string
		idleNone bool
	}{
		{"idle at once", func(context.Context) (haproxy.IdleResult, error) {
			return haproxy.IdleResult{Servers: 1, Instances: 2}, nil
		}, 0,
			"write drain,told,idle,write maint,told", "idle after", false},
		{"sessions never end", untilDone(fmt.Errorf("%w: still waiting for: web/a on HAProxy h1: 2 sessions", ctl.ErrNotDone)), 200 * time.Millisecond,
			"write drain,told,idle,write maint,told", "idle timeout 200ms passed, setting maint anyway; not done: still waiting for: web/a on HAProxy h1: 2 sessions", false},
		{"cannot confirm: the timeout is waited out", func(context.Context) (haproxy.IdleResult, error) {
			return haproxy.IdleResult{}, fmt.Errorf("%w: Prometheus refused", ctl.ErrCannotConfirm)
		}, 200 * time.Millisecond, "write drain,told,idle,write maint,told", "cannot confirm idle", false},
		{"no Prometheus", nil, 200 * time.Millisecond, "write drain,told,write maint,told", "no Prometheus", true},
	} {
		var r drainFirstRun
		start := time.Now()
		err := DrainFirst(context.Background(), r.options(tc.idle))
		took := time.Since(start)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
		if got := strings.Join(r.steps, ","); got != tc.steps {
			t.Errorf("%s: steps %s, want %s", tc.name, got, tc.steps)
		}
		out := r.out.String()
		for _, want := range []string{"step 1/4: drain web/a", "step 2/4", "step 3/4: maint web/a", "step 4/4", "done: web/a in maint", tc.says} {
			if !strings.Contains(out, want) {
				t.Errorf("%s: output lacks %q:\n%s", tc.name, want, out)
			}
		}
		if took < tc.minWait {
			t.Errorf("%s: maint after %s, before the idle timeout %s", tc.name, took, tc.minWait)
		}
	}
}

func TestDrainFirstInterruptedSaysWhatItLeft(t *testing.T) {
	var r drainFirstRun
	ctx, cancel := context.WithCancel(context.Background())
	o := r.options(func(ctx context.Context) (haproxy.IdleResult, error) {
		cancel() // Ctrl-C while waiting for idle
		<-ctx.Done()
		return haproxy.IdleResult{}, fmt.Errorf("%w: still waiting", ctl.ErrNotDone)
	})
	o.IdleTimeout = time.Minute
	err := DrainFirst(ctx, o)
	if err == nil || !strings.Contains(err.Error(), "interrupted during the wait for idle: web/a left drained") ||
		!strings.Contains(err.Error(), "`hastate maint web/a` finishes, `hastate clear web/a` undoes") {
		t.Fatalf("error %v", err)
	}
	if got := strings.Join(r.steps, ","); got != "write drain,told,idle" {
		t.Fatalf("steps %s: nothing may be written after an interrupt", got)
	}

	// A failed drain leaves nothing; a failed maint leaves the drain.
	var r2 drainFirstRun
	o = r2.options(nil)
	o.Write = func(ctx context.Context, st string) error { return fmt.Errorf("%w: min-ready", ctl.ErrUsage) }
	if err := DrainFirst(context.Background(), o); !errors.Is(err, ctl.ErrUsage) || !strings.Contains(err.Error(), "nothing written") {
		t.Fatalf("a refused drain: %v", err)
	}
	var r3 drainFirstRun
	o = r3.options(func(context.Context) (haproxy.IdleResult, error) { return haproxy.IdleResult{}, nil })
	o.Write = func(ctx context.Context, st string) error {
		if st == "maint" {
			return errors.New("consul: 500")
		}
		return nil
	}
	if err := DrainFirst(context.Background(), o); err == nil || !strings.Contains(err.Error(), "web/a left drained") {
		t.Fatalf("a failed maint: %v", err)
	}
}

// Issue 22.6: an error in an earlier step never shortens the idle wait,
// and without haproxy.Prometheus the command says at the start that it will wait
// the whole --idle-timeout.
func TestDrainFirstNeverShortensTheIdleWait(t *testing.T) {
	for _, tc := range []struct {
		name string
		told error
		idle func(context.Context) (haproxy.IdleResult, error)
	}{
		{"told fails at once, unwrapped (a replica error)", errors.New("hastate replica at http://x: 502 Bad Gateway"), nil},
		{"told fails at once, not done", fmt.Errorf("%w: HAProxy h1 not told", ctl.ErrNotDone), func(context.Context) (haproxy.IdleResult, error) { return haproxy.IdleResult{}, nil }},
		{"idle fails at once, unwrapped", nil, func(context.Context) (haproxy.IdleResult, error) { return haproxy.IdleResult{}, errors.New("boom") }},
		{"idle fails at once, usage", nil, func(context.Context) (haproxy.IdleResult, error) {
			return haproxy.IdleResult{}, fmt.Errorf("%w: bad label", ctl.ErrUsage)
		}},
	} {
		var r drainFirstRun
		o := r.options(tc.idle)
		var drained time.Time
		o.Write = func(ctx context.Context, st string) error {
			r.log("write " + st)
			if st == "drain" {
				drained = time.Now()
			} else if since := time.Since(drained); since < o.IdleTimeout {
				t.Errorf("%s: maint %s after the drain, before --idle-timeout %s", tc.name, since, o.IdleTimeout)
			}
			return nil
		}
		o.Told = func(ctx context.Context) error {
			r.log("told")
			return tc.told
		}
		// Told fails again after the maint: that is step 4's error.
		if err := DrainFirst(context.Background(), o); err != nil && !strings.Contains(err.Error(), "the wait for maint") {
			t.Errorf("%s: %v", tc.name, err)
		}
		if got := strings.Join(r.steps, ","); !strings.HasPrefix(got, "write drain,told") || !strings.Contains(got, "write maint") {
			t.Errorf("%s: steps %s", tc.name, got)
		}
	}

	var r drainFirstRun
	o := r.options(nil)
	o.Told = func(ctx context.Context) error {
		r.log("told")
		if out := r.out.String(); !strings.Contains(out, "cannot see sessions, so waiting the whole --idle-timeout (200ms) before maint") {
			t.Errorf("without Prometheus, nothing said before the wait:\n%s", out)
		}
		return nil
	}
	if err := DrainFirst(context.Background(), o); err != nil {
		t.Fatal(err)
	}
}
