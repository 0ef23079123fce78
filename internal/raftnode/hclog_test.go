package raftnode

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
)

// lines decodes every line of buf as one JSON object.
func lines(t *testing.T, buf *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("not one JSON object: %q: %v", l, err)
		}
		out = append(out, m)
	}
	return out
}

func TestRaftLinesGoThroughSlog(t *testing.T) {
	var buf bytes.Buffer
	base := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	h := newSlogHCLog(base, "raft", hclog.Info)

	h.Debug("below the raft level") // filtered by --raft-log-level
	h.Info("entering leader state", "leader", "n1", "error", errors.New("boom"))
	h.Warn("odd", "k") // a value without its key
	h.Error("formatted", "what", hclog.Fmt("%d entries", 3), "addr", hclog.Hex(255), "q", hclog.Quote("a\nb"))
	h.Named("wal").With("segment", 7, "node", &stringer{"Node at n1"}, "nil", (*stringer)(nil)).Warn("rotated")
	h.With("peer", "n2").Named("snapshot").Info("kept")

	got := lines(t, &buf)
	if len(got) != 5 {
		t.Fatalf("%d lines, want 5: %v", len(got), got)
	}
	want := []map[string]any{
		{"level": "INFO", "msg": "entering leader state", "component": "raft", "leader": "n1", "error": "boom"},
		{"level": "WARN", "msg": "odd", "component": "raft", hclog.MissingKey: "k"},
		{"level": "ERROR", "msg": "formatted", "what": "3 entries", "addr": "0xff", "q": `"a\nb"`},
		{"level": "WARN", "msg": "rotated", "component": "raft.wal", "segment": 7.0, "node": "Node at n1", "nil": "<nil>"},
		{"level": "INFO", "msg": "kept", "component": "raft.snapshot", "peer": "n2"},
	}
	for i, w := range want {
		for k, v := range w {
			if got[i][k] != v {
				t.Errorf("line %d: %s = %v, want %v (%v)", i, k, got[i][k], v, got[i])
			}
		}
	}
	// A derived logger names its component once, however often renamed.
	if n := strings.Count(buf.String(), `"component"`); n != 5 {
		t.Errorf("%d component attributes in 5 lines:\n%s", n, buf.String())
	}
}

func TestRaftLogLevels(t *testing.T) {
	var buf bytes.Buffer
	// --log-level warn: raft's info lines stop at the handler even when
	// --raft-log-level lets them through.
	base := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}))
	h := newSlogHCLog(base, "raft", hclog.Trace)
	if h.IsInfo() || !h.IsWarn() {
		t.Fatalf("IsInfo %v IsWarn %v with the handler at warn", h.IsInfo(), h.IsWarn())
	}
	h.Info("dropped")
	h.Warn("kept")
	sub := h.Named("wal")
	h.SetLevel(hclog.Error) // shared with derived loggers, as hclog does
	sub.Warn("dropped too")
	sub.Error("kept too")
	if sub.GetLevel() != hclog.Error {
		t.Fatalf("sub-logger level %v", sub.GetLevel())
	}
	h.SetLevel(hclog.Off)
	h.Error("off")
	got := lines(t, &buf)
	if len(got) != 2 || got[0]["msg"] != "kept" || got[1]["msg"] != "kept too" {
		t.Fatalf("%v", got)
	}

	buf.Reset()
	trace := newSlogHCLog(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug - 4})), "raft", hclog.Trace)
	trace.Trace("t")
	trace.Debug("d")
	got = lines(t, &buf)
	if len(got) != 2 || got[0]["level"] != "DEBUG-4" || got[1]["level"] != "DEBUG" {
		t.Fatalf("trace and debug map to %v", got)
	}

	for _, s := range []string{"trace", "DEBUG", "info", "warn", "error", "off"} {
		if _, err := ParseRaftLogLevel(s); err != nil {
			t.Errorf("%q: %v", s, err)
		}
	}
	for _, s := range []string{"", "chatty", "warning!"} {
		if _, err := ParseRaftLogLevel(s); err == nil {
			t.Errorf("%q accepted", s)
		}
	}
}

func TestRaftStandardWriter(t *testing.T) {
	var buf bytes.Buffer
	h := newSlogHCLog(slog.New(slog.NewJSONHandler(&buf, nil)), "raft", hclog.Info)
	l := h.StandardLogger(&hclog.StandardLoggerOptions{InferLevels: true})
	l.Print("[WARN] a warning")
	l.Print("[DEBUG] hidden")
	l.Print("plain")
	h.StandardLogger(&hclog.StandardLoggerOptions{ForceLevel: hclog.Error}).Print("[INFO] forced")
	got := lines(t, &buf)
	if len(got) != 3 || got[0]["level"] != "WARN" || got[0]["msg"] != "a warning" || got[1]["msg"] != "plain" ||
		got[2]["level"] != "ERROR" || got[2]["msg"] != "[INFO] forced" {
		t.Fatalf("%v", got)
	}
}

// stringer is like *raft.Raft in a log line: a Stringer whose fields JSON
// cannot see.
type stringer struct{ s string }

func (s *stringer) String() string { return s.s }
