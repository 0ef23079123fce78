//go:build unix

package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/lockd/lockd/fence"
	"github.com/lockd/lockd/internal/pgtemp"
)

// stack is what the demo started itself: a one-member lockd, a throwaway
// PostgreSQL, or both. close stops every one of them.
type stack struct {
	dir       string // temporary: the lockd binary, keys, data, logs
	lockdURL  string // "": not started here
	verifyKey ed25519.PublicKey
	lockd     *exec.Cmd
	lockdLog  string
	lockdDone chan struct{}
	pg        *pgtemp.Server
}

// stackConfig says what to start.
type stackConfig struct {
	startLockd bool
	startPG    bool
	binDir     string // a prebuilt lockd; "" builds it
}

// startStack starts what cfg asks for and waits until it serves. On error
// it has stopped whatever it started.
func startStack(ctx context.Context, cfg stackConfig, say func(string, ...any)) (_ *stack, err error) {
	dir, err := os.MkdirTemp("", "lockd-sql-fencing-")
	if err != nil {
		return nil, err
	}
	s := &stack{dir: dir}
	defer func() {
		if err != nil {
			s.close(false, io.Discard)
		}
	}()
	if cfg.startPG {
		bin, err := pgtemp.FindBin()
		if err != nil {
			return s, fmt.Errorf("%w\n(or pass --dsn with a PostgreSQL database to use)", err)
		}
		say("starting a throwaway PostgreSQL (%s: initdb, then postgres on a unix socket only) ...", bin)
		if s.pg, err = pgtemp.Start(ctx, pgtemp.Options{BinDir: bin}); err != nil {
			return s, err
		}
		say("postgres: %s", s.pg.DSN("postgres"))
	}
	if cfg.startLockd {
		if err := s.startLockd(ctx, cfg.binDir, say); err != nil {
			return s, err
		}
	}
	return s, nil
}

func (s *stack) startLockd(ctx context.Context, binDir string, say func(string, ...any)) error {
	if binDir == "" {
		binDir = filepath.Join(s.dir, "bin")
		say("building ./cmd/lockd (go build) ...")
		if err := buildLockd(ctx, binDir); err != nil {
			return err
		}
	}
	signing, verify := filepath.Join(s.dir, "lockd-signing.pem"), filepath.Join(s.dir, "lockd-verify.pem")
	if err := fence.GenerateKeyFiles(signing, verify); err != nil {
		return err
	}
	pub, err := fence.LoadPublicKey(verify)
	if err != nil {
		return err
	}
	s.verifyKey = pub
	// A free port can be taken between our probe and lockd's bind; then
	// lockd exits at once and another pair of ports is tried.
	for attempt := 1; ; attempt++ {
		err = s.runLockd(ctx, filepath.Join(binDir, "lockd"), signing, attempt)
		if err == nil || !errors.Is(err, errExitedEarly) || attempt == 3 {
			break
		}
		say("lockd exited while starting (%v); trying other ports", err)
	}
	if err != nil {
		return err
	}
	say("lockd: one member at %s, signing every grant (--signing-key); sqlfence checks the proofs", s.lockdURL)
	return nil
}

var errExitedEarly = errors.New("exited while starting")

func (s *stack) runLockd(ctx context.Context, bin, signingKey string, attempt int) error {
	httpAddr, err := freeAddr()
	if err != nil {
		return err
	}
	raftAddr, err := freeAddr()
	if err != nil {
		return err
	}
	data := filepath.Join(s.dir, fmt.Sprintf("lockd-data-%d", attempt))
	s.lockdLog = filepath.Join(s.dir, fmt.Sprintf("lockd-%d.log", attempt))
	log, err := os.Create(s.lockdLog)
	if err != nil {
		return err
	}
	defer log.Close()
	cmd := exec.Command(bin, "--id", "n1", "--data-dir", data, "--http-addr", httpAddr, "--raft-addr", raftAddr,
		"--signing-key", signingKey)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = dieWithParent(syscall.SIGTERM)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start lockd: %w", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	s.lockd, s.lockdDone = cmd, done
	url := "http://" + httpAddr
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-done:
			s.lockd = nil
			return fmt.Errorf("lockd %w: %s\n%s", errExitedEarly, cmd.ProcessState, s.lockdTail(15))
		default:
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/readyz", nil)
		if resp, err := httpClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				s.lockdURL = url
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("lockd was not ready in time\n%s", s.lockdTail(15))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// close stops everything and removes the temporary directory unless keep.
func (s *stack) close(keep bool, w io.Writer) {
	if s.lockd != nil {
		_ = s.lockd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.lockdDone:
		case <-time.After(5 * time.Second):
			_ = s.lockd.Process.Kill()
			<-s.lockdDone
		}
		s.lockd = nil
	}
	if s.pg != nil {
		s.pg.Stop() // its own directory, always removed: its data dir belongs to another user
		s.pg = nil
	}
	if keep {
		fmt.Fprintf(w, "lockd's binary, keys, data and log kept in %s\n", s.dir)
		return
	}
	_ = os.RemoveAll(s.dir)
}

// logTails is the end of the logs of what was started, for a failure.
func (s *stack) logTails(lines int) string {
	var b strings.Builder
	if s.lockdLog != "" {
		fmt.Fprintf(&b, "--- lockd (%s) ---\n%s\n", s.lockdLog, s.lockdTail(lines))
	}
	if s.pg != nil {
		fmt.Fprintf(&b, "--- postgres ---\n%s\n", s.pg.LogTail(lines))
	}
	return b.String()
}

func (s *stack) lockdTail(n int) string {
	b, err := os.ReadFile(s.lockdLog)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

var httpClient = &http.Client{Timeout: 10 * time.Second}

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// buildLockd builds lockd from this module into dir.
func buildLockd(ctx context.Context, dir string) error {
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-o", dir+string(filepath.Separator), "./cmd/lockd")
	cmd.Dir = root
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build ./cmd/lockd in %s: %v\n%s", root, err, out.String())
	}
	return nil
}

const modulePath = "github.com/lockd/lockd"

// moduleRoot finds the lockd module's directory: from this source file
// (go run and go test build from the source tree), else from the go command
// in the working directory.
func moduleRoot() (string, error) {
	if _, file, _, ok := runtime.Caller(0); ok {
		if dir := filepath.Join(filepath.Dir(file), "..", ".."); isModuleRoot(dir) {
			return filepath.Clean(dir), nil
		}
	}
	if out, err := exec.Command("go", "env", "GOMOD").Output(); err == nil {
		if dir := filepath.Dir(strings.TrimSpace(string(out))); isModuleRoot(dir) {
			return dir, nil
		}
	}
	return "", fmt.Errorf("cannot find the %s source tree to build lockd: run the demo from the repository (go run ./examples/sql-fencing), or pass --bin-dir or --lockd", modulePath)
}

func isModuleRoot(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return false
	}
	first, _, _ := strings.Cut(string(b), "\n")
	return strings.TrimSpace(first) == "module "+modulePath
}
