//go:build unix

// Package pgtemp runs a throwaway PostgreSQL server, for tests and examples
// that need a real one: initdb makes a cluster in a new temporary directory,
// and the server listens only on a unix socket in that directory (no TCP
// port, so nothing to collide with). Stop shuts it down and removes the
// directory.
//
// The server is this process's child rather than a daemon started with
// `pg_ctl start`: pg_ctl detaches the postmaster (setsid), so a test binary
// killed by its timeout would leave it running. As a child it gets (on
// Linux) a parent-death signal and ends with us, however we end.
//
// initdb and postgres refuse to run as root. Run as root, pgtemp runs both
// as the "postgres" user (Debian's postgresql package creates it) and hands
// the directory to that user. Durability is switched off (fsync, full page
// writes, synchronous commit): the data is thrown away anyway.
package pgtemp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ErrNotInstalled is returned when the PostgreSQL server binaries (initdb,
// postgres) cannot be found.
var ErrNotInstalled = errors.New("pgtemp: the PostgreSQL server binaries (initdb, postgres) are not installed")

// BinDirEnv names the environment variable that points at the directory
// holding initdb and postgres, when they are neither on PATH nor in
// Debian's /usr/lib/postgresql/<version>/bin.
const BinDirEnv = "PG_BINDIR"

// User is the database superuser of a server started here; it trusts every
// local connection.
const User = "postgres"

// port only names the socket file (.s.PGSQL.<port>): the server listens on
// no TCP port, and the socket is in a directory of its own.
const port = 5432

// FindBin returns the directory holding initdb and postgres: $PG_BINDIR,
// else the directory of the initdb on PATH (symlinks resolved), else the
// newest /usr/lib/postgresql/<version>/bin (Debian, Ubuntu), else
// /usr/local/pgsql/bin (a source install). ErrNotInstalled when none has
// both.
func FindBin() (string, error) {
	if dir := os.Getenv(BinDirEnv); dir != "" {
		if !hasServer(dir) {
			return "", fmt.Errorf("%w: %s=%s has no initdb and postgres", ErrNotInstalled, BinDirEnv, dir)
		}
		return dir, nil
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil && hasServer(filepath.Dir(real)) {
			return filepath.Dir(real), nil
		}
	}
	if dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin"); len(dirs) > 0 {
		sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
		for _, d := range dirs {
			if hasServer(d) {
				return d, nil
			}
		}
	}
	if d := "/usr/local/pgsql/bin"; hasServer(d) {
		return d, nil
	}
	return "", fmt.Errorf("%w: install them (Debian: apt-get install postgresql), or set %s", ErrNotInstalled, BinDirEnv)
}

func hasServer(dir string) bool {
	for _, name := range []string{"initdb", "postgres"} {
		if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			return false
		}
	}
	return true
}

// version is the major version in /usr/lib/postgresql/<version>/bin.
func version(binDir string) float64 {
	v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(binDir)), 64)
	return v
}

// Options configure Start.
type Options struct {
	// BinDir holds initdb and postgres; "" finds them (FindBin).
	BinDir string
	// Settings are extra server settings (postgres -c NAME=VALUE), added
	// after pgtemp's own, so they win.
	Settings map[string]string
}

// Server is a running throwaway PostgreSQL server.
type Server struct {
	dir    string // the temporary directory: data/, the socket, postgres.log
	binDir string
	cred   *syscall.Credential // whom the server runs as; nil: as this process
	cmd    *exec.Cmd
	done   chan struct{} // closed when the server process has exited
	err    error         // its Wait error, once done is closed
}

// Start makes a new cluster in a temporary directory and starts its server,
// and returns once it accepts connections. On error nothing is left
// running and the directory is removed.
func Start(ctx context.Context, opts Options) (_ *Server, err error) {
	binDir := opts.BinDir
	if binDir == "" {
		if binDir, err = FindBin(); err != nil {
			return nil, err
		}
	}
	s := &Server{binDir: binDir, done: make(chan struct{})}
	if os.Geteuid() == 0 {
		if s.cred, err = postgresUser(); err != nil {
			return nil, err
		}
	}
	if s.dir, err = s.makeDir(); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			if tail := s.LogTail(20); tail != "" {
				err = fmt.Errorf("%w\n--- %s ---\n%s", err, s.logPath(), tail)
			}
			s.Stop()
		}
	}()
	log, err := os.OpenFile(s.logPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("pgtemp: %w", err)
	}
	defer log.Close()

	initdb := s.command(ctx, "initdb", "-D", s.dataDir(), "-U", User, "--auth=trust",
		"--encoding=UTF8", "--locale=C", "--no-sync")
	initdb.Stdout, initdb.Stderr = log, log
	if err := initdb.Run(); err != nil {
		return nil, fmt.Errorf("pgtemp: initdb: %w", err)
	}

	args := []string{"-D", s.dataDir(), "-k", s.dir, "-p", strconv.Itoa(port)}
	settings := map[string]string{
		"listen_addresses":   "", // the unix socket only
		"fsync":              "off",
		"full_page_writes":   "off",
		"synchronous_commit": "off",
		"shared_buffers":     "32MB",
		"max_connections":    "200",
	}
	for k, v := range opts.Settings {
		settings[k] = v
	}
	keys := make([]string, 0, len(settings))
	for k := range settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		args = append(args, "-c", k+"="+settings[k])
	}
	// Not CommandContext: ctx bounds the start, not the server's life.
	s.cmd = s.command(context.Background(), "postgres", args...)
	s.cmd.Stdout, s.cmd.Stderr = log, log
	// Immediate shutdown of the server and its backends if we die.
	dieWithParent(s.cmd.SysProcAttr, syscall.SIGQUIT)
	if err := s.cmd.Start(); err != nil {
		close(s.done)
		return nil, fmt.Errorf("pgtemp: start postgres: %w", err)
	}
	go func() { s.err = s.cmd.Wait(); close(s.done) }()
	if err := s.waitReady(ctx, 60*time.Second); err != nil {
		return nil, err
	}
	return s, nil
}

// postgresUser is whom initdb and the server run as when we are root.
func postgresUser() (*syscall.Credential, error) {
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("pgtemp: running as root, and initdb refuses root: the server runs as user \"postgres\", which is missing (%v); Debian's postgresql package creates it", err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("pgtemp: user postgres has uid %q, gid %q", u.Uid, u.Gid)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// makeDir creates the temporary directory, owned by whom the server runs
// as. Its path must be short (a unix socket path has at most 107 bytes)
// and reachable by that user, else it goes under /tmp.
func (s *Server) makeDir() (string, error) {
	base := os.TempDir()
	if len(base) > 60 || (s.cred != nil && !reachable(base, s.cred.Uid)) {
		base = "/tmp"
	}
	dir, err := os.MkdirTemp(base, "lockd-pg-")
	if err != nil {
		return "", fmt.Errorf("pgtemp: %w", err)
	}
	if s.cred != nil {
		if err := os.Chown(dir, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			os.RemoveAll(dir)
			return "", fmt.Errorf("pgtemp: hand %s to user postgres: %w", dir, err)
		}
	}
	return dir, nil
}

// reachable reports whether uid may traverse every directory down to dir.
func reachable(dir string, uid uint32) bool {
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return false
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if fi.Mode().Perm()&0o001 == 0 && !(ok && st.Uid == uid && fi.Mode().Perm()&0o100 != 0) {
			return false
		}
		if d == "/" || d == "." {
			return true
		}
	}
}

// command runs one of the server's binaries as the server's user.
func (s *Server) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(s.binDir, name), args...)
	cmd.Dir = s.dir
	cmd.Env = append(os.Environ(), "LC_ALL=C", "TZ=UTC")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	return cmd
}

// waitReady waits until postmaster.pid says the server accepts
// connections: the way pg_ctl -w knows.
func (s *Server) waitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	pidFile := filepath.Join(s.dataDir(), "postmaster.pid")
	for {
		if b, err := os.ReadFile(pidFile); err == nil {
			// Line 8 is the status: "ready" once connections are accepted.
			if lines := strings.Split(string(b), "\n"); len(lines) > 7 && strings.TrimSpace(lines[7]) == "ready" {
				return nil
			}
		}
		select {
		case <-s.done:
			return fmt.Errorf("pgtemp: postgres exited while starting: %v", s.err)
		case <-deadline.C:
			return fmt.Errorf("pgtemp: postgres not ready after %v", timeout)
		case <-ctx.Done():
			return fmt.Errorf("pgtemp: waiting for postgres: %w", ctx.Err())
		case <-tick.C:
		}
	}
}

// Dir is the server's temporary directory: data/, postgres.log and the
// socket.
func (s *Server) Dir() string { return s.dir }

// SocketDir is the directory of the server's unix socket: libpq's and
// pgx's "host".
func (s *Server) SocketDir() string { return s.dir }

// Port names the socket (.s.PGSQL.<Port>); the server listens on no TCP
// port.
func (s *Server) Port() int { return port }

// DSN returns a libpq keyword/value connection string (as pgx and lib/pq
// take it) for database dbname as the superuser User.
func (s *Server) DSN(dbname string) string {
	return fmt.Sprintf("host=%s port=%d user=%s dbname=%s sslmode=disable", s.dir, port, User, dbname)
}

var dbName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// CreateDatabase creates database name (lower-case letters, digits and
// "_"), with createdb, and returns its DSN.
func (s *Server) CreateDatabase(ctx context.Context, name string) (string, error) {
	if !dbName.MatchString(name) {
		return "", fmt.Errorf("pgtemp: database name %q: want [a-z_][a-z0-9_]*, at most 63 bytes", name)
	}
	if err := s.client(ctx, "createdb", name); err != nil {
		return "", err
	}
	return s.DSN(name), nil
}

// DropDatabase drops database name, closing its connections first.
func (s *Server) DropDatabase(ctx context.Context, name string) error {
	if !dbName.MatchString(name) {
		return fmt.Errorf("pgtemp: database name %q: want [a-z_][a-z0-9_]*, at most 63 bytes", name)
	}
	return s.client(ctx, "dropdb", "--if-exists", "--force", name)
}

// client runs a client program of the server's installation (createdb,
// dropdb) against it. Client programs run as anyone, root included.
func (s *Server) client(ctx context.Context, name string, args ...string) error {
	full := append([]string{"-h", s.dir, "-p", strconv.Itoa(port), "-U", User, "-w"}, args...)
	cmd := exec.CommandContext(ctx, filepath.Join(s.binDir, name), full...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("pgtemp: %s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}

// Stop shuts the server down (fast: open transactions are rolled back),
// escalating if it does not end in time, and removes its directory. It is
// safe to call more than once.
func (s *Server) Stop() {
	if s.cmd != nil && s.cmd.Process != nil {
		for _, step := range []struct {
			sig  syscall.Signal
			wait time.Duration
		}{{syscall.SIGINT, 15 * time.Second}, {syscall.SIGQUIT, 5 * time.Second}, {syscall.SIGKILL, time.Minute}} {
			select {
			case <-s.done:
			default:
				_ = s.cmd.Process.Signal(step.sig)
				select {
				case <-s.done:
				case <-time.After(step.wait):
					continue
				}
			}
			break
		}
	}
	if s.dir != "" {
		os.RemoveAll(s.dir)
	}
}

func (s *Server) dataDir() string { return filepath.Join(s.dir, "data") }
func (s *Server) logPath() string { return filepath.Join(s.dir, "postgres.log") }

// LogTail returns the last n lines of the server's log.
func (s *Server) LogTail(n int) string {
	b, err := os.ReadFile(s.logPath())
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
