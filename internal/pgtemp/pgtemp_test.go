package pgtemp_test

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/lockd/lockd/internal/pgtemp"
	"github.com/lockd/lockd/internal/testutil"
)

const helperEnv = "PGTEMP_TEST_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(helper())
	}
	os.Exit(m.Run())
}

// start starts a server for t, or skips t without the binaries (fails it
// under CI).
func start(t *testing.T) *pgtemp.Server {
	t.Helper()
	s, err := pgtemp.Start(context.Background(), pgtemp.Options{})
	if errors.Is(err, pgtemp.ErrNotInstalled) && !testutil.InCI() {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

func TestStartCreateStop(t *testing.T) {
	s := start(t)
	ctx := context.Background()
	dsn, err := s.CreateDatabase(ctx, "app_1")
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	var name, user string
	if err := db.QueryRowContext(ctx, `SELECT current_database(), current_user`).Scan(&name, &user); err != nil {
		t.Fatal(err)
	}
	if name != "app_1" || user != pgtemp.User {
		t.Fatalf("connected to %s as %s", name, user)
	}
	var listen string
	if err := db.QueryRowContext(ctx, `SHOW listen_addresses`).Scan(&listen); err != nil || listen != "" {
		t.Fatalf("listen_addresses = %q (%v), want none: the unix socket only", listen, err)
	}
	db.Close()
	for _, bad := range []string{"", "Upper", "a-b", "a;drop", strings.Repeat("a", 64)} {
		if _, err := s.CreateDatabase(ctx, bad); err == nil {
			t.Errorf("CreateDatabase(%q) succeeded", bad)
		}
	}
	if err := s.DropDatabase(ctx, "app_1"); err != nil {
		t.Fatal(err)
	}
	if err := s.DropDatabase(ctx, "app_1"); err != nil {
		t.Fatalf("dropping a database that is gone: %v", err)
	}

	pid := postmasterPID(t, s.Dir())
	s.Stop()
	if _, err := os.Stat(s.Dir()); !os.IsNotExist(err) {
		t.Fatalf("Stop left %s (%v)", s.Dir(), err)
	}
	if alive(pid) {
		t.Fatalf("the server (pid %d) outlived Stop", pid)
	}
	s.Stop() // twice is fine
}

// TestServerEndsWithItsParent: a process that started a server and is
// killed (a test binary at its timeout) leaves no server running.
func TestServerEndsWithItsParent(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("a parent-death signal is Linux's")
	}
	if _, err := pgtemp.FindBin(); err != nil {
		if !testutil.InCI() {
			t.Skip(err)
		}
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), helperEnv+"=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("helper: %v", err)
	}
	dir := strings.TrimSpace(line)
	defer os.RemoveAll(dir) // nobody else will
	pid := postmasterPID(t, dir)
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
	deadline := time.Now().Add(20 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("the server (pid %d) outlived its killed parent", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// helper starts a server, says where, and waits to be killed.
func helper() int {
	s, err := pgtemp.Start(context.Background(), pgtemp.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(s.Dir())
	time.Sleep(time.Minute)
	s.Stop()
	return 0
}

func postmasterPID(t *testing.T, dir string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "data", "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// alive reports whether pid is a running (not zombie) process.
func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return runtime.GOOS != "linux"
	}
	_, rest, _ := strings.Cut(string(b), ") ")
	return !strings.HasPrefix(rest, "Z")
}
