// Command lockctl is the command-line client of lockd: acquire, release and
// renew locks, read their status, manage sessions and cluster membership,
// run a command while holding a lock (lockctl run, for cron jobs), and write
// the key pair for signed fencing tokens (lockctl keygen).
//
// It speaks only through the public package client. See lockctl --help for
// the commands and the exit codes.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"strings"
	"time"

	"github.com/lockd/lockd/client"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = ""

// Exit codes. run otherwise exits with the command's own code.
const (
	exitOK          = 0
	exitError       = 1 // any other failure
	exitUsage       = 2 // bad command line
	exitLost        = 3 // run: the lock was lost while the command ran; it was stopped
	exitNotAcquired = 4 // the lock is held by another client, or the wait timed out
	exitNotHolder   = 5 // not the holder (release/renew), or the session is gone
	exitNoLeader    = 6 // no leader known, or no member reachable, within --timeout
)

const usage = `lockctl — command-line client of lockd, the distributed lock service.

Usage:
  lockctl [global flags] <command> [args and flags]

Commands:
  acquire NAME [--ttl 30s] [--wait 0s]   take a lock without a session; prints token and expiry
  release NAME --token N                 release a lock held by --client-id
  renew NAME --token N [--ttl 30s]       extend a lock's TTL
  status NAME [--stale]                  show who holds a lock
  list [--prefix P]                      list held or awaited locks
  session create [--ttl 15s]             open an HTTP session; prints its id
  session keepalive ID                   refresh a session
  session delete ID                      end a session, releasing its locks
  cluster status                         show the leader and the members
  cluster add ID RAFTADDR HTTPADDR       add a voter
  cluster remove ID                      remove a member
  cluster transfer [--to ID]             hand the leadership over
  keygen [--private F] [--public F] [--force]
        write a new Ed25519 key pair for signed fencing tokens (needs no cluster):
        the private key (default lockd-signing.pem, mode 0600) for every lockd
        member's --signing-key, the public key (default lockd-verify.pem) for
        fencestore --verify-key. Refuses to replace existing files unless --force.
  run NAME [--ttl D] [--wait D] [--session-ttl 15s] [--grace 10s] -- CMD [ARGS...]
        hold NAME through a session while CMD runs. CMD inherits stdin/stdout/stderr,
        runs in its own process group, and gets LOCKD_LOCK, LOCKD_FENCING_TOKEN and
        (when the server signs grants) LOCKD_FENCING_PROOF in its environment.
        Signals to lockctl (INT, TERM, HUP, QUIT, USR1, USR2) are passed on to CMD.
        If the lock is lost (the client's conservative local lease runs out, or the
        server ends the lock or the session), CMD's group gets SIGTERM at once and
        SIGKILL after --grace, and lockctl exits 3. Otherwise lockctl releases the
        lock and exits with CMD's exit code (128+N if CMD died of signal N).
        Without --ttl the lock lives as long as the session; with it, it is renewed.

Flags may come before or after positional arguments; "--" ends them.

Global flags (also accepted after the command):
  --endpoints URLS   comma-separated member URLs (env LOCKD_ENDPOINTS; default http://127.0.0.1:7070)
  --client-id ID     client ID (default <hostname>:<pid>). release and renew must
                     use the client ID the lock was acquired with.
  -o text|json       output format (default text)
  --timeout D        how long to look for a leader and wait for replies (default 10s);
                     acquire and run add --wait to it
  --version          print the version and exit

Exit codes:
  0  success (run: CMD's own exit code)
  1  error
  2  usage error
  3  run: the lock was lost while CMD ran; CMD was stopped
  4  lock not acquired: held by another client, or the wait timed out
  5  not the holder of the lock, or the session expired / does not exist
  6  no leader: no member could name a leader or none answered within --timeout
`

func main() {
	os.Exit(lockctl(context.Background(), os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

// globals are the flags every command accepts.
type globals struct {
	endpoints string
	clientID  string
	output    string
	timeout   time.Duration
	version   bool
}

func versionString() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

// lockctl runs one command line and returns the exit code.
func lockctl(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	g := globals{endpoints: getenv("LOCKD_ENDPOINTS")}
	if g.endpoints == "" {
		g.endpoints = "http://127.0.0.1:7070"
	}
	fs := newFlagSet("lockctl", stderr, &g)
	fs.BoolVar(&g.version, "version", false, "print the version")
	fs.Usage = func() { fmt.Fprint(stderr, usage) }
	pos, rest, err := parseArgs(fs, args, 1)
	if err != nil {
		return usageErr(stderr, err)
	}
	if g.version {
		fmt.Fprintln(stdout, "lockctl", versionString())
		return exitOK
	}
	if len(pos) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	cmd := pos[0]
	e := &env{g: &g, stdout: stdout, stderr: stderr, getenv: getenv}
	switch cmd {
	case "acquire":
		return e.acquire(ctx, rest)
	case "release":
		return e.release(ctx, rest)
	case "renew":
		return e.renew(ctx, rest)
	case "status":
		return e.status(ctx, rest)
	case "list":
		return e.list(ctx, rest)
	case "session":
		return e.session(ctx, rest)
	case "cluster":
		return e.cluster(ctx, rest)
	case "run":
		return e.run(ctx, rest)
	case "keygen":
		return e.keygen(ctx, rest)
	case "help":
		fmt.Fprint(stdout, usage)
		return exitOK
	}
	return usageErr(stderr, fmt.Errorf("unknown command %q", cmd))
}

func usageErr(w io.Writer, err error) int {
	if err == errHelp {
		return exitOK
	}
	fmt.Fprintf(w, "lockctl: %v\nRun 'lockctl --help' for usage.\n", err)
	return exitUsage
}

// env is what a command runs with.
type env struct {
	g      *globals
	stdout io.Writer
	stderr io.Writer
	getenv func(string) string
}

func (e *env) endpoints() []string {
	var out []string
	for _, s := range strings.Split(e.g.endpoints, ",") {
		if s = strings.TrimSpace(s); s != "" {
			if !strings.Contains(s, "://") {
				s = "http://" + s
			}
			out = append(out, s)
		}
	}
	return out
}

func (e *env) clientID() string {
	if e.g.clientID != "" {
		return e.g.clientID
	}
	return client.DefaultClientID()
}

func (e *env) api() (*client.API, error) {
	return client.NewAPI(client.APIConfig{Endpoints: e.endpoints()})
}
