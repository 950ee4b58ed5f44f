package cluster

import (
	"fmt"
	"io"
	"log"

	"github.com/hashicorp/go-hclog"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// zapHCLog adapts a *zap.Logger to the hclog.Logger that raft expects, so
// raft's own lines come out as zap JSON with the process's fields.
type zapHCLog struct {
	z    *zap.Logger
	name string
	args []any
}

var _ hclog.Logger = (*zapHCLog)(nil)

func newHCLog(z *zap.Logger, name string) hclog.Logger {
	return &zapHCLog{z: z.Named(name), name: name}
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
	if ce := l.z.Check(lvl, msg); ce != nil {
		ce.Write(l.fields(args)...)
	}
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
	return &zapHCLog{z: l.z.With(l.fields(args)...), name: l.name, args: append(append([]any{}, l.args...), args...)}
}

func (l *zapHCLog) Named(name string) hclog.Logger {
	return &zapHCLog{z: l.z.Named(name), name: l.name + "." + name, args: l.args}
}

func (l *zapHCLog) ResetNamed(name string) hclog.Logger {
	return &zapHCLog{z: l.z.Named(name), name: name, args: l.args}
}

func (l *zapHCLog) StandardLogger(*hclog.StandardLoggerOptions) *log.Logger {
	return zap.NewStdLog(l.z)
}

func (l *zapHCLog) StandardWriter(*hclog.StandardLoggerOptions) io.Writer {
	return zap.NewStdLog(l.z).Writer()
}
