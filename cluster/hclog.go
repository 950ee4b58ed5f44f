package cluster

import (
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hastate/hastate/internal/ratelog"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// zapHCLog adapts a *zap.Logger to the hclog.Logger that raft expects, so
// raft's own lines come out as zap JSON with the process's fields.
//
// Two of raft's habits are tamed on the way:
//   - Raft logs an error at every failed RPC. With one peer down, the
//     leader's heartbeats and appends to it wrote 65 error lines in 20 s.
//     A warning or error repeats at most once per repeatEvery for the same
//     message and peer; the line that gets through says in "suppressed" how
//     many were held back since the last one.
//   - At shutdown the stream layer closes raft's inbound connections (raft
//     only lets go of one when it closes), and raft logs the read that this
//     interrupts as an error ("failed to decode incoming command … use of
//     closed network connection"). An error that is net.ErrClosed can only
//     come from a socket this process closed itself, so it is logged at
//     debug.
type zapHCLog struct {
	z       *zap.Logger
	name    string
	args    []any
	repeats *repeatLimit // shared by every logger derived from the root
}

var _ hclog.Logger = (*zapHCLog)(nil)

// repeatEvery is how often one raft warning or error may repeat per peer.
const repeatEvery = 10 * time.Second

func newHCLog(z *zap.Logger, name string) hclog.Logger {
	return &zapHCLog{z: z.Named(name), name: name, repeats: newRepeatLimit(repeatEvery, nil)}
}

// repeatLimit is a ratelog.Limiter per kind of line (message and peer).
// Raft has a few dozen messages and a cluster a few peers; past
// maxRepeatKinds (a peer set that keeps changing) it starts again from
// empty rather than grow.
type repeatLimit struct {
	every time.Duration
	now   func() time.Time

	mu    sync.Mutex
	kinds map[string]*ratelog.Limiter
}

const maxRepeatKinds = 256

func newRepeatLimit(every time.Duration, now func() time.Time) *repeatLimit {
	return &repeatLimit{every: every, now: now, kinds: map[string]*ratelog.Limiter{}}
}

// allow reports whether a line of this kind may be logged, and how many of
// its kind were held back since the last one that was.
func (r *repeatLimit) allow(kind string) (bool, int64) {
	r.mu.Lock()
	l := r.kinds[kind]
	if l == nil {
		if len(r.kinds) >= maxRepeatKinds {
			clear(r.kinds)
		}
		l = ratelog.New(r.every, r.now)
		r.kinds[kind] = l
	}
	r.mu.Unlock()
	return l.Allow()
}

// lineKind is what makes two raft lines the same for the repeat limit:
// the message and the peer it is about, if any.
func lineKind(msg string, args []any) string {
	for i := 0; i+1 < len(args); i += 2 {
		switch args[i] {
		case "peer", "server-id", "id", "target":
			msg += "\x00" + fmt.Sprint(args[i+1])
		}
	}
	return msg
}

// closedByUs reports whether the line's error is a read or write on a
// socket this process closed (net.ErrClosed).
func closedByUs(args []any) bool {
	for i := 1; i < len(args); i += 2 {
		if err, ok := args[i].(error); ok && errors.Is(err, net.ErrClosed) {
			return true
		}
	}
	return false
}

func (l *zapHCLog) fields(args []any) []zap.Field {
	fs := make([]zap.Field, 0, len(args)/2+1)
	for i := 0; i < len(args); i += 2 {
		if i+1 >= len(args) {
			fs = append(fs, zap.Any("extra", args[i]))
			break
		}
		v := args[i+1]
		if f, ok := v.(hclog.Format); ok && len(f) > 0 {
			if format, ok := f[0].(string); ok {
				v = fmt.Sprintf(format, f[1:]...)
			}
		}
		fs = append(fs, zap.Any(fmt.Sprint(args[i]), v))
	}
	return fs
}

func (l *zapHCLog) Log(level hclog.Level, msg string, args ...any) {
	lvl := zapcore.DebugLevel
	switch level {
	case hclog.Info:
		lvl = zapcore.InfoLevel
	case hclog.Warn:
		lvl = zapcore.WarnLevel
	case hclog.Error:
		lvl = zapcore.ErrorLevel
	}
	if lvl >= zapcore.WarnLevel && closedByUs(args) {
		lvl = zapcore.DebugLevel
	}
	ce := l.z.Check(lvl, msg)
	if ce == nil {
		return
	}
	fs := l.fields(args)
	if lvl >= zapcore.WarnLevel && l.repeats != nil {
		ok, hidden := l.repeats.allow(lineKind(msg, append(l.args[:len(l.args):len(l.args)], args...)))
		if !ok {
			return
		}
		if hidden > 0 {
			fs = append(fs, zap.Int64("suppressed", hidden))
		}
	}
	ce.Write(fs...)
}

func (l *zapHCLog) Trace(msg string, args ...any) { l.Log(hclog.Trace, msg, args...) }
func (l *zapHCLog) Debug(msg string, args ...any) { l.Log(hclog.Debug, msg, args...) }
func (l *zapHCLog) Info(msg string, args ...any)  { l.Log(hclog.Info, msg, args...) }
func (l *zapHCLog) Warn(msg string, args ...any)  { l.Log(hclog.Warn, msg, args...) }
func (l *zapHCLog) Error(msg string, args ...any) { l.Log(hclog.Error, msg, args...) }
func (l *zapHCLog) IsTrace() bool                 { return false }
func (l *zapHCLog) IsDebug() bool                 { return l.z.Core().Enabled(zapcore.DebugLevel) }
func (l *zapHCLog) IsInfo() bool                  { return l.z.Core().Enabled(zapcore.InfoLevel) }
func (l *zapHCLog) IsWarn() bool                  { return l.z.Core().Enabled(zapcore.WarnLevel) }
func (l *zapHCLog) IsError() bool                 { return l.z.Core().Enabled(zapcore.ErrorLevel) }
func (l *zapHCLog) ImpliedArgs() []any            { return l.args }
func (l *zapHCLog) Name() string                  { return l.name }
func (l *zapHCLog) SetLevel(hclog.Level)          {}
func (l *zapHCLog) GetLevel() hclog.Level         { return hclog.Info }

func (l *zapHCLog) With(args ...any) hclog.Logger {
	return &zapHCLog{z: l.z.With(l.fields(args)...), name: l.name, args: append(append([]any{}, l.args...), args...), repeats: l.repeats}
}

func (l *zapHCLog) Named(name string) hclog.Logger {
	return &zapHCLog{z: l.z.Named(name), name: l.name + "." + name, args: l.args, repeats: l.repeats}
}

func (l *zapHCLog) ResetNamed(name string) hclog.Logger {
	return &zapHCLog{z: l.z.Named(name), name: name, args: l.args, repeats: l.repeats}
}

func (l *zapHCLog) StandardLogger(*hclog.StandardLoggerOptions) *log.Logger {
	return zap.NewStdLog(l.z)
}

func (l *zapHCLog) StandardWriter(*hclog.StandardLoggerOptions) io.Writer {
	return zap.NewStdLog(l.z).Writer()
}
