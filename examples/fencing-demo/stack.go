//go:build unix

package main

import (
	"bytes"
	"context"
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
)

// stack is the lockd cluster and the fencestore the demo started itself.
// Every process it starts is stopped by close.
type stack struct {
	dir        string   // temporary: binaries, keys, data, logs
	lockdURLs  []string // empty: not started here
	fencestore string   // "": not started here
	signed     bool     // lockd signs grants and fencestore verifies proofs
	procs      []*server
}

// server is one process of the stack.
type server struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{} // closed when the process has exited
}

// stackConfig says what to start.
type stackConfig struct {
	startLockd      bool
	startFencestore bool
	members         int
	binDir          string // prebuilt lockd and fencestore; "" builds them
	verifyKey       string // fencestore --verify-key when lockd is not started here
	keep            bool   // keep dir (data and logs) after close
}

// startStack builds (unless given) and starts what cfg asks for, and waits
// until it serves. On error it has stopped whatever it started.
func startStack(ctx context.Context, cfg stackConfig, say func(string, ...any)) (_ *stack, err error) {
	dir, err := os.MkdirTemp("", "lockd-fencing-demo-")
	if err != nil {
		return nil, err
	}
	s := &stack{dir: dir}
	defer func() {
		if err != nil {
			if ctx.Err() != nil {
				s.close(cfg.keep, io.Discard) // interrupted: nothing to look at
				return
			}
			s.close(true, io.Discard) // keep the logs of a failed start
			err = fmt.Errorf("%w\n(data and logs kept in %s)", err, dir)
		}
	}()
	binDir := cfg.binDir
	if binDir == "" {
		binDir = filepath.Join(dir, "bin")
		say("building ./cmd/lockd and ./cmd/fencestore (go build) ...")
		if err := buildBinaries(ctx, binDir); err != nil {
			return s, err
		}
	}
	lockdBin, fencestoreBin := filepath.Join(binDir, "lockd"), filepath.Join(binDir, "fencestore")

	var signingKey, verifyKey string
	if cfg.startLockd && cfg.startFencestore {
		// The whole story, signed: lockd signs every grant, fencestore
		// accepts only writes whose proof it can check.
		signingKey, verifyKey = filepath.Join(dir, "lockd-signing.pem"), filepath.Join(dir, "lockd-verify.pem")
		if err := fence.GenerateKeyFiles(signingKey, verifyKey); err != nil {
			return s, err
		}
		s.signed = true
		say("made an Ed25519 key pair, as `lockctl keygen` does: lockd signs every grant with it,")
		say("fencestore checks the signature (Fencing-Proof) on every write")
	} else if cfg.startFencestore {
		verifyKey = cfg.verifyKey
	}

	// Free ports can be taken between our probe and the server's bind;
	// then the server exits at once, and another round of ports is tried.
	for attempt := 1; ; attempt++ {
		err = s.startServers(ctx, cfg, lockdBin, fencestoreBin, signingKey, verifyKey, attempt)
		if err == nil || !errors.Is(err, errExitedEarly) || attempt == 3 {
			break
		}
		say("a server exited while starting (%v); trying other ports", err)
		s.stopAll()
	}
	if err != nil {
		return s, err
	}
	if cfg.startLockd {
		say("lockd: a %d-member cluster%s", cfg.members, map[bool]string{true: " signing grants (--signing-key)", false: ""}[signingKey != ""])
		for _, u := range s.lockdURLs {
			say("  %s", u)
		}
	}
	if cfg.startFencestore {
		say("fencestore: %s%s", s.fencestore, map[bool]string{true: " verifying proofs (--verify-key)", false: ""}[verifyKey != ""])
	}
	return s, nil
}

var errExitedEarly = errors.New("exited while starting")

func (s *stack) startServers(ctx context.Context, cfg stackConfig, lockdBin, fencestoreBin, signingKey, verifyKey string, attempt int) error {
	s.lockdURLs, s.fencestore = nil, ""
	round := filepath.Join(s.dir, fmt.Sprintf("run%d", attempt))
	if cfg.startLockd {
		type member struct{ id, http, raft string }
		var ms []member
		var initial []string
		for i := 1; i <= cfg.members; i++ {
			m := member{id: fmt.Sprintf("n%d", i)}
			var err error
			if m.http, err = freeAddr(); err != nil {
				return err
			}
			if m.raft, err = freeAddr(); err != nil {
				return err
			}
			ms = append(ms, m)
			initial = append(initial, m.id+"="+m.raft)
		}
		for _, m := range ms {
			args := []string{"--id", m.id, "--data-dir", filepath.Join(round, m.id),
				"--http-addr", m.http, "--raft-addr", m.raft, "--initial-cluster", strings.Join(initial, ",")}
			if signingKey != "" {
				args = append(args, "--signing-key", signingKey)
			}
			if err := s.start("lockd "+m.id, filepath.Join(round, m.id+".log"), lockdBin, args...); err != nil {
				return err
			}
			s.lockdURLs = append(s.lockdURLs, "http://"+m.http)
		}
	}
	if cfg.startFencestore {
		addr, err := freeAddr()
		if err != nil {
			return err
		}
		args := []string{"--addr", addr, "--data-dir", filepath.Join(round, "fencestore")}
		if verifyKey != "" {
			args = append(args, "--verify-key", verifyKey)
		}
		if err := s.start("fencestore", filepath.Join(round, "fencestore.log"), fencestoreBin, args...); err != nil {
			return err
		}
		s.fencestore = "http://" + addr
	}
	// A cluster is ready when every member knows the leader and is current.
	deadline := time.Now().Add(60 * time.Second)
	for i, u := range s.lockdURLs {
		if err := s.waitOK(ctx, s.procs[i], u+"/readyz", deadline); err != nil {
			return err
		}
	}
	if s.fencestore != "" {
		if err := s.waitOK(ctx, s.procs[len(s.procs)-1], s.fencestore+"/healthz", deadline); err != nil {
			return err
		}
	}
	return nil
}

// start runs one server with its output in logPath.
func (s *stack) start(name, logPath, bin string, args ...string) error {
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		return err
	}
	f, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer f.Close()
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = dieWithParent(syscall.SIGTERM)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	p := &server{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	s.procs = append(s.procs, p)
	return nil
}

// waitOK polls url until it answers 200, p exits, or deadline passes.
func (s *stack) waitOK(ctx context.Context, p *server, url string, deadline time.Time) error {
	for {
		select {
		case <-p.done:
			return fmt.Errorf("%s %w: %s\n%s", p.name, errExitedEarly, p.cmd.ProcessState, tail(p.log, 15))
		default:
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if resp, err := httpClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not answer 200 on %s in time\n%s", p.name, url, tail(p.log, 15))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// stopAll stops every process: SIGTERM (lockd hands leadership over and
// flushes), SIGKILL after 5 s.
func (s *stack) stopAll() {
	for _, p := range s.procs {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	timeout := time.After(5 * time.Second)
	for _, p := range s.procs {
		select {
		case <-p.done:
		case <-timeout:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
	s.procs = nil
}

// close stops everything and removes the temporary directory unless keep.
func (s *stack) close(keep bool, w io.Writer) {
	s.stopAll()
	if keep {
		fmt.Fprintf(w, "data and logs kept in %s\n", s.dir)
		return
	}
	_ = os.RemoveAll(s.dir)
}

// logTails returns the end of every server's log, for a failure report.
func (s *stack) logTails(lines int) string {
	var b strings.Builder
	for _, p := range s.procs {
		fmt.Fprintf(&b, "--- %s (%s) ---\n%s\n", p.name, p.log, tail(p.log, lines))
	}
	return b.String()
}

// tail returns the last n lines of a file.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// buildBinaries builds lockd and fencestore from this module into dir.
func buildBinaries(ctx context.Context, dir string) error {
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-o", dir+string(filepath.Separator), "./cmd/lockd", "./cmd/fencestore")
	cmd.Dir = root
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build ./cmd/lockd ./cmd/fencestore in %s: %v\n%s", root, err, out.String())
	}
	return nil
}

const modulePath = "github.com/lockd/lockd"

// moduleRoot finds the lockd module's directory: from this source file
// (go run and go test build from the source tree), else from the go command
// in the working directory.
func moduleRoot() (string, error) {
	if _, file, _, ok := runtime.Caller(0); ok {
		dir := filepath.Join(filepath.Dir(file), "..", "..")
		if isModuleRoot(dir) {
			return filepath.Clean(dir), nil
		}
	}
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err == nil {
		if dir := filepath.Dir(strings.TrimSpace(string(out))); isModuleRoot(dir) {
			return dir, nil
		}
	}
	return "", fmt.Errorf("cannot find the %s source tree to build lockd and fencestore: run the demo from the repository (go run ./examples/fencing-demo), or pass --bin-dir, or --lockd and --fencestore", modulePath)
}

func isModuleRoot(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return false
	}
	first, _, _ := strings.Cut(string(b), "\n")
	return strings.TrimSpace(first) == "module "+modulePath
}
