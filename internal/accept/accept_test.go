package accept

import (
	"errors"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

func TestBackoff(t *testing.T) {
	var d time.Duration
	var got []time.Duration
	for range 10 {
		d = Backoff(d)
		got = append(got, d)
	}
	want := []time.Duration{5, 10, 20, 40, 80, 160, 320, 640, 1000, 1000}
	for i := range want {
		if got[i] != want[i]*time.Millisecond {
			t.Fatalf("backoff sequence %v, want %v ms", got, want)
		}
	}
}

// fakeListener answers Accept from a function.
type fakeListener struct {
	accept func() (net.Conn, error)
}

func (l *fakeListener) Accept() (net.Conn, error) { return l.accept() }
func (l *fakeListener) Close() error              { return nil }
func (l *fakeListener) Addr() net.Addr            { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

var _ net.Listener = (*fakeListener)(nil)

func TestLoop(t *testing.T) {
	emfile := &net.OpError{Op: "accept", Net: "tcp", Err: syscall.EMFILE}
	t.Run("temporary errors are retried with the backoff, then connections served", func(t *testing.T) {
		var calls atomic.Int32
		c1, c2 := net.Pipe()
		defer c1.Close()
		defer c2.Close()
		done := make(chan struct{})
		ln := &fakeListener{accept: func() (net.Conn, error) {
			switch n := calls.Add(1); {
			case n <= 3:
				return nil, emfile
			case n == 4:
				return c1, nil
			default:
				<-done
				return nil, net.ErrClosed
			}
		}}
		var pauses []time.Duration
		served := make(chan net.Conn, 1)
		errc := make(chan error, 1)
		go func() {
			errc <- Loop(ln, done, func(c net.Conn) { served <- c }, func(err error, p time.Duration) {
				if !errors.Is(err, syscall.EMFILE) {
					t.Errorf("retrying %v, want EMFILE", err)
				}
				pauses = append(pauses, p)
			})
		}()
		if c := <-served; c != c1 {
			t.Fatalf("served %v, want the accepted connection", c)
		}
		close(done)
		if err := <-errc; err != nil {
			t.Fatalf("Loop after done = %v, want nil", err)
		}
		if want := []time.Duration{5 * time.Millisecond, 10 * time.Millisecond, 20 * time.Millisecond}; len(pauses) != 3 || pauses[0] != want[0] || pauses[2] != want[2] {
			t.Errorf("pauses %v, want %v", pauses, want)
		}
	})
	t.Run("any other error ends the loop", func(t *testing.T) {
		boom := &net.OpError{Op: "accept", Net: "tcp", Err: syscall.EPERM}
		err := Loop(&fakeListener{accept: func() (net.Conn, error) { return nil, boom }}, make(chan struct{}),
			func(net.Conn) { t.Error("served a connection") }, func(error, time.Duration) { t.Error("retried a permanent error") })
		if !errors.Is(err, syscall.EPERM) {
			t.Fatalf("Loop = %v, want EPERM", err)
		}
	})
	t.Run("done during a pause ends it at once", func(t *testing.T) {
		done := make(chan struct{})
		errc := make(chan error, 1)
		go func() {
			errc <- Loop(&fakeListener{accept: func() (net.Conn, error) { return nil, emfile }}, done,
				func(net.Conn) {}, func(_ error, p time.Duration) {
					if p == time.Second {
						close(done) // in the longest pause
					}
				})
		}()
		select {
		case err := <-errc:
			if err != nil {
				t.Fatalf("Loop = %v, want nil", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Loop kept pausing after done")
		}
	})
}
