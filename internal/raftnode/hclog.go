package raftnode

import (
	"bytes"
	"context"
	"encoding"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"log/slog"
	"strings"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"
)

// ParseRaftLogLevel checks a --raft-log-level value: trace, debug, info,
// warn, error or off.
func ParseRaftLogLevel(s string) (hclog.Level, error) {
	switch l := hclog.LevelFromString(s); {
	case l != hclog.NoLevel:
		return l, nil
	case strings.EqualFold(strings.TrimSpace(s), "off"):
		return hclog.Off, nil
	}
	return hclog.NoLevel, fmt.Errorf("--raft-log-level %q: want trace, debug, info, warn, error or off", s)
}

// slogHCLog is an hclog.Logger that hands hashicorp/raft's (and raft-wal's)
// log lines to the member's slog logger, so a member writes one format
// (text or JSON, as --log-format says) and one stream. Its own level
// (--raft-log-level) filters raft's lines first; the slog handler's level
// (--log-level) then applies to them as to every other line. Each line
// carries "component": "raft" (or "raft.wal", ... for named sub-loggers).
type slogHCLog struct {
	base    *slog.Logger // the member's logger
	log     *slog.Logger // base with the component and the implied arguments
	name    string
	implied []any
	level   *atomic.Int32 // an hclog.Level, shared with every logger derived from this one
}

func newSlogHCLog(l *slog.Logger, name string, level hclog.Level) hclog.Logger {
	lv := &atomic.Int32{}
	lv.Store(int32(level))
	return &slogHCLog{base: l, log: l.With("component", name), name: name, level: lv}
}

// slogLevel maps hclog's levels onto slog's: trace sits below debug.
func slogLevel(l hclog.Level) slog.Level {
	switch l {
	case hclog.Trace:
		return slog.LevelDebug - 4
	case hclog.Debug:
		return slog.LevelDebug
	case hclog.Warn:
		return slog.LevelWarn
	case hclog.Error:
		return slog.LevelError
	}
	return slog.LevelInfo // Info, and NoLevel (a line hclog prints without one)
}

func (h *slogHCLog) enabled(l hclog.Level) bool {
	if l == hclog.NoLevel {
		l = hclog.Info
	}
	min := hclog.Level(h.level.Load())
	if l == hclog.Off || min == hclog.Off || l < min {
		return false
	}
	return h.log.Enabled(context.Background(), slogLevel(l))
}

func (h *slogHCLog) Log(level hclog.Level, msg string, args ...any) {
	if !h.enabled(level) {
		return
	}
	h.log.Log(context.Background(), slogLevel(level), msg, slogArgs(args)...)
}

// slogArgs turns hclog's key-value arguments into slog's: hclog's
// formatting wrappers are rendered as hclog renders them, and a value left
// without a key gets hclog's key for it.
func slogArgs(args []any) []any {
	if len(args) == 0 {
		return nil
	}
	out := make([]any, 0, len(args)+1)
	for i, a := range args {
		if i%2 == 0 {
			if i == len(args)-1 {
				out = append(out, hclog.MissingKey)
			} else {
				if _, ok := a.(string); !ok {
					a = fmt.Sprint(a)
				}
				out = append(out, a)
				continue
			}
		}
		switch v := a.(type) {
		case hclog.Format:
			if len(v) > 0 {
				if f, ok := v[0].(string); ok {
					a = fmt.Sprintf(f, v[1:]...)
				}
			}
		case hclog.Hex:
			a = fmt.Sprintf("0x%x", int(v))
		case hclog.Octal:
			a = fmt.Sprintf("0%o", int(v))
		case hclog.Binary:
			a = fmt.Sprintf("0b%b", int(v))
		case hclog.Quote:
			a = fmt.Sprintf("%q", string(v))
		case error, json.Marshaler, encoding.TextMarshaler:
			// slog renders these itself.
		case fmt.Stringer:
			// As hclog does: raft passes *Raft and the like, whose
			// fields are unexported (JSON would print {}).
			a = fmt.Sprint(v) // a nil pointer's String panics; fmt says <nil>
		}
		out = append(out, a)
	}
	return out
}

func (h *slogHCLog) Trace(msg string, args ...any) { h.Log(hclog.Trace, msg, args...) }
func (h *slogHCLog) Debug(msg string, args ...any) { h.Log(hclog.Debug, msg, args...) }
func (h *slogHCLog) Info(msg string, args ...any)  { h.Log(hclog.Info, msg, args...) }
func (h *slogHCLog) Warn(msg string, args ...any)  { h.Log(hclog.Warn, msg, args...) }
func (h *slogHCLog) Error(msg string, args ...any) { h.Log(hclog.Error, msg, args...) }

func (h *slogHCLog) IsTrace() bool { return h.enabled(hclog.Trace) }
func (h *slogHCLog) IsDebug() bool { return h.enabled(hclog.Debug) }
func (h *slogHCLog) IsInfo() bool  { return h.enabled(hclog.Info) }
func (h *slogHCLog) IsWarn() bool  { return h.enabled(hclog.Warn) }
func (h *slogHCLog) IsError() bool { return h.enabled(hclog.Error) }

func (h *slogHCLog) ImpliedArgs() []any { return h.implied }

func (h *slogHCLog) With(args ...any) hclog.Logger {
	args = slogArgs(args)
	return &slogHCLog{base: h.base, log: h.log.With(args...), name: h.name,
		implied: append(h.implied[:len(h.implied):len(h.implied)], args...), level: h.level}
}

func (h *slogHCLog) Name() string { return h.name }

// Named and ResetNamed keep the implied arguments but not the old name:
// the component is replaced, never repeated.
func (h *slogHCLog) Named(name string) hclog.Logger {
	if h.name != "" {
		name = h.name + "." + name
	}
	return h.ResetNamed(name)
}

func (h *slogHCLog) ResetNamed(name string) hclog.Logger {
	// slog cannot take an attribute back: start again from the base.
	return &slogHCLog{base: h.base, log: h.base.With("component", name).With(h.implied...), name: name,
		implied: h.implied, level: h.level}
}

func (h *slogHCLog) SetLevel(level hclog.Level) { h.level.Store(int32(level)) }
func (h *slogHCLog) GetLevel() hclog.Level      { return hclog.Level(h.level.Load()) }

func (h *slogHCLog) StandardLogger(opts *hclog.StandardLoggerOptions) *log.Logger {
	return log.New(h.StandardWriter(opts), "", 0)
}

// StandardWriter logs each line written to it: at opts.ForceLevel when set,
// else at the level its "[LEVEL]" prefix names when opts.InferLevels, else
// at info.
func (h *slogHCLog) StandardWriter(opts *hclog.StandardLoggerOptions) io.Writer {
	if opts == nil {
		opts = &hclog.StandardLoggerOptions{}
	}
	return &stdWriter{h: h, opts: *opts}
}

type stdWriter struct {
	h    *slogHCLog
	opts hclog.StandardLoggerOptions
}

func (w *stdWriter) Write(p []byte) (int, error) {
	for _, line := range bytes.Split(bytes.TrimRight(p, "\n"), []byte("\n")) {
		msg, level := strings.TrimSpace(string(line)), hclog.Info
		if w.opts.ForceLevel != hclog.NoLevel {
			level = w.opts.ForceLevel
		} else if w.opts.InferLevels {
			for prefix, l := range map[string]hclog.Level{"[TRACE]": hclog.Trace, "[DEBUG]": hclog.Debug,
				"[INFO]": hclog.Info, "[WARN]": hclog.Warn, "[ERROR]": hclog.Error, "[ERR]": hclog.Error} {
				if rest, ok := strings.CutPrefix(msg, prefix); ok {
					msg, level = strings.TrimSpace(rest), l
					break
				}
			}
		}
		w.h.Log(level, msg)
	}
	return len(p), nil
}
