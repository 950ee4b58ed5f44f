package ctl

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"
)

// DefaultTimeout bounds every operator command (--timeout): the Consul
// transaction or reads, and every read from a replica.
const DefaultTimeout = 10 * time.Second

type timeoutKey struct{}

// WithTimeout is context.WithTimeout that also remembers d, so that an
// error can say "did not answer within 1s".
func WithTimeout(parent context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithValue(parent, timeoutKey{}, d), d)
}

// CallError explains why a call to the server at addr failed: it names the
// server, says whether it refused or did not answer in time, and ends with
// what to do (advice). The cause stays wrapped.
func CallError(ctx context.Context, who, addr string, err error, advice string) error {
	var nerr net.Error
	switch {
	case ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &nerr) && nerr.Timeout()):
		within := "in time"
		if d, ok := ctx.Value(timeoutKey{}).(time.Duration); ok {
			within = "within " + d.String()
		}
		return &explained{fmt.Sprintf("%s at %s did not answer %s: %s, or raise --timeout", who, addr, within, advice), err}
	case errors.Is(err, syscall.ECONNREFUSED):
		return &explained{fmt.Sprintf("%s at %s refused the connection (is it running?): %s", who, addr, advice), err}
	default:
		return fmt.Errorf("%s at %s: %w: %s", who, addr, err, advice)
	}
}

// explained is an error whose message replaces the cause's (a Go net/http
// error says nothing an operator needs once explained) but still wraps it.
type explained struct {
	msg string
	err error
}

func (e *explained) Error() string { return e.msg }
func (e *explained) Unwrap() error { return e.err }

// ConsulError explains a failed call to the Consul at addr; note (if
// any) comes before the advice, e.g. "nothing was written". It is
// ErrCannotConfirm: Consul could not be read well enough to decide.
func ConsulError(ctx context.Context, addr string, err error, note string) error {
	if addr == "" {
		addr = "CONSUL_HTTP_ADDR"
	}
	if note != "" {
		note += "; "
	}
	return cannotConfirm{CallError(ctx, "consul", addr, err, note+"check CONSUL_HTTP_ADDR / --consul-addr and CONSUL_HTTP_TOKEN")}
}

// cannotConfirm marks an error as ErrCannotConfirm without changing its
// message.
type cannotConfirm struct{ err error }

func (c cannotConfirm) Error() string   { return c.err.Error() }
func (c cannotConfirm) Unwrap() []error { return []error{c.err, ErrCannotConfirm} }

func Deadline(ctx context.Context) time.Time {
	d, _ := ctx.Deadline()
	return d
}

// CannotConfirm marks err as ErrCannotConfirm (exit 4) without changing
// its message.
func CannotConfirm(err error) error { return cannotConfirm{err} }

// Explain is an error whose message is msg and that wraps err: for a cause
// (a Go net error) that says nothing an operator needs once explained.
func Explain(msg string, err error) error { return &explained{msg, err} }
