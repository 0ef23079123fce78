package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/lockd/lockd/internal/server"
)

// TestQuotaFlags: every quota is a flag documented in --help with its
// default, a negative value is refused naming the flag, and each reads
// LOCKD_<FLAG> like every other flag.
func TestQuotaFlags(t *testing.T) {
	var help bytes.Buffer
	if code := run([]string{"--help"}, &help); code != 0 {
		t.Fatalf("--help: exit %d", code)
	}
	d := server.DefaultQuotas
	for flag, def := range map[string]int64{
		"max-sessions": d.Sessions, "max-sessions-per-token": d.SessionsPerOwner, "max-locks": d.Locks,
		"max-waiters-per-lock": d.WaitersPerLock, "max-locks-per-session": d.LocksPerSession,
		"max-locks-per-token": d.LocksPerOwner, "max-grants": d.Grants, "max-value-bytes": d.ValueBytes,
	} {
		i := strings.Index(help.String(), "-"+flag+" int\n")
		if i < 0 {
			t.Errorf("--help does not list --%s", flag)
			continue
		}
		usage, _, _ := strings.Cut(help.String()[i+len(flag)+6:], "\n  -")
		want := fmt.Sprintf("(default %d)", def)
		if def == 0 {
			want = "default 0: no limit"
		}
		if !strings.Contains(usage, "quota") || !strings.Contains(usage, want) {
			t.Errorf("--%s: usage %q does not say it is a quota with %q", flag, usage, want)
		}
		var stderr bytes.Buffer
		if code := run([]string{"--" + flag, "-1"}, &stderr); code != 2 || !strings.Contains(stderr.String(), "--"+flag+" -1") {
			t.Errorf("--%s -1: exit %d, want 2 naming the flag:\n%s", flag, code, stderr.String())
		}
		env := "LOCKD_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
		t.Run(env, func(t *testing.T) {
			t.Setenv(env, "-2")
			var stderr bytes.Buffer
			if code := run(nil, &stderr); code != 2 || !strings.Contains(stderr.String(), "--"+flag+" -2") {
				t.Errorf("%s=-2: exit %d, want 2 naming the flag:\n%s", env, code, stderr.String())
			}
		})
	}
}
