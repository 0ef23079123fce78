// Command lockctl is the command-line client of lockd: acquire (shared,
// semaphores, several locks at once), release, renew and revoke locks, read
// their status, watch them change (lockctl watch), run leader elections
// (lockctl elect), manage sessions and cluster membership,
// run a command while holding a lock (lockctl run, for cron jobs), save and
// restore backups (lockctl snapshot), and write the key pair for signed
// fencing tokens (lockctl keygen). It speaks HTTPS (--cacert, --cert,
// --key) and sends a bearer token (--auth-token, LOCKD_TOKEN) when the
// cluster asks for them.
//
// It speaks only through the public package client. See lockctl --help for
// the commands and the exit codes.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
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
	exitLost        = 3 // run: the lock was lost while the command ran; it was stopped; elect: the leadership was lost
	exitNotAcquired = 4 // the lock is held by another client, or the wait timed out
	exitNotHolder   = 5 // not the holder (release/renew), or the session is gone
	exitNoLeader    = 6 // no leader known, or no member reachable, within --timeout
	exitAuth        = 7 // the token is missing or unknown (401), or lacks the access (403)
)

const usage = `lockctl — command-line client of lockd, the distributed lock service.

Usage:
  lockctl [global flags] <command> [args and flags]

Commands:
  acquire NAME [NAME...] [--ttl 30s] [--wait 0s] [--shared] [--limit N] [--lock-delay D] [--value V]
        take a lock without a session; prints token and expiry. Several names (or
        NAME,NAME) take them all in one step or none (a multi-lock; a refusal names
        the lock that blocked it). Lock kinds:
          --shared        a shared grant: shared holders coexist, never with an
                          exclusive one (a read-write lock)
          --limit N       a semaphore: up to N holders at once, each with its own token
                          (1–10000; set by the acquire that creates the lock; another N
                          while the lock is in use is refused: limit mismatch, exit 1)
          --lock-delay D  when the grant ends without a release (expiry, session end,
                          revocation), nobody gets the lock for D (up to 1m)
          --value V       the grant's value, shown by status (up to 4096 bytes)
  release NAME --token N                 release a lock held by --client-id
  renew NAME --token N [--ttl 30s]       extend a lock's TTL
  revoke NAME [--token N]                end the lock's grants, whoever holds them (admin token):
                                         every grant, or only the one with token N; holders are
                                         told (lost, revoked), the lock-delay applies, waiters go
                                         on; prints the tokens revoked
  status NAME [--stale]                  show who holds a lock: mode (exclusive, shared), limit,
                                         holders (one line each when several), value, waiters,
                                         delayed_until while a lock-delay runs
  list [--prefix P] [--limit N] [--after NAME]
                                         list held, awaited or delayed locks in name order, with
                                         mode, limit, holders, value and delayed_until: all of
                                         them, or at most N (then the --after NAME that goes on
                                         is printed on stderr); --after starts after NAME
  watch NAME | watch --prefix P          print each change of lock NAME (first its current state),
                                         or of every lock under P (first those held, awaited or
                                         delayed now), as it commits: one line per change — lock,
                                         index, held or free, holder, token, mode, waiters, value
                                         (-o json: one object a line: lock, index, status). A state
                                         read again after a reconnect, into which changes made
                                         meanwhile may be folded, ends in "resync" (JSON "resync":
                                         true). Follows leader changes; runs until SIGINT or SIGTERM
                                         (exit 0)
  elect NAME VALUE [--session-ttl 15s]   campaign in election NAME (a lock: candidates queue in
                                         order); once elected print VALUE (-o json: lock, value,
                                         client_id, fencing_token) and lead until SIGINT or SIGTERM,
                                         then resign (the next candidate leads at once) and exit 0.
                                         If the leadership is lost (the session expired, the lock
                                         was revoked) exit 3; a session lost while campaigning
                                         campaigns again. --session-ttl: how long the cluster
                                         keeps the leadership of a lockctl that stopped answering
  elect NAME --listen                    never campaign: print the current leader's value, then
                                         each new leader's (and each value it proclaims), one a
                                         line (a leader without a value prints client_id=ID);
                                         -o json adds client_id and fencing_token. Until SIGINT/SIGTERM
  session create [--ttl 15s]             open an HTTP session; prints its id
  session keepalive ID                   refresh a session
  session delete ID                      end a session, releasing its locks
  cluster status                         show the leader and the members
  cluster add ID RAFTADDR HTTPADDR       add a voter
  cluster remove ID                      remove a member
  cluster transfer [--to ID]             hand the leadership over
  snapshot save FILE                     write a backup of every lock, waiter, session and the
                                         token counter to FILE (from the leader; admin token).
                                         Written to a temporary file beside FILE (mode 0600),
                                         then renamed over it; prints the bytes written.
  snapshot restore FILE [--force] [--min-token N]
                                         load a backup into a fresh cluster (admin token).
                                         A cluster that holds any state is refused unless
                                         --force (which replaces it). Tokens never go down;
                                         --min-token N raises the counter to at least N, so
                                         every new token is above N: for a backup older than
                                         the last token issued (pass the highest token in use).
  bench [--clients 16] [--locks 16] [--duration 10s] [--mode session|http]
        clients loop acquire → release; prints cycles/s and acquire/release latency
  keygen [--private F] [--public F] [--force]
        write a new Ed25519 key pair for signed fencing tokens (needs no cluster):
        the private key (default lockd-signing.pem, mode 0600) for every lockd
        member's --signing-key, the public key (default lockd-verify.pem) for
        fencestore --verify-key. Refuses to replace existing files unless --force.
  run NAME[,NAME...] [--ttl D] [--wait D] [--session-ttl 15s] [--grace 10s]
      [--shared] [--limit N] [--lock-delay D] [--value V] -- CMD [ARGS...]
        hold NAME through a session while CMD runs. CMD inherits stdin/stdout/stderr,
        runs in its own process group, and gets LOCKD_LOCK, LOCKD_FENCING_TOKEN and
        (when the server signs grants) LOCKD_FENCING_PROOF in its environment.
        NAME,NAME holds several locks, taken in one step or none (a multi-lock); the
        variables are then comma-separated lists in name order, and losing any of
        the locks counts as losing the lock. The lock-kind flags are acquire's.
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
                     acquire and run add --wait to it; it also bounds a snapshot transfer
  --auth-token T     bearer token, when the cluster runs with --auth-file (env LOCKD_TOKEN;
                     prefer the environment: the command line is visible to other users).
                     Not --token, which is the fencing token of release and renew.
  --cacert FILE      PEM CA certificate(s) to verify the members' HTTPS certificates
                     (env LOCKD_CACERT; default: the system roots)
  --cert FILE        PEM client certificate, for members that require one (mTLS) (env LOCKD_CERT)
  --key FILE         PEM private key of --cert (env LOCKD_KEY)
  --version          print the version and exit

An endpoint without a scheme gets https:// when --cacert or --cert is set, else http://.

Exit codes:
  0  success (run: CMD's own exit code)
  1  error
  2  usage error
  3  run: the lock was lost while CMD ran; CMD was stopped
     elect: the leadership was lost
  4  lock not acquired: held by another client, or the wait timed out
  5  not the holder of the lock (revoke --token: no grant has that token), or the
     session expired / does not exist
  6  no leader: no member could name a leader or none answered within --timeout
     (a TLS failure, such as an untrusted certificate, shows up here too)
  7  not authorized: no token or an unknown one (401 unauthenticated), or the
     token lacks the access the command needs (403 permission_denied)
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
	token     string
	cacert    string
	cert      string
	key       string
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
	g := globals{endpoints: getenv("LOCKD_ENDPOINTS"), token: getenv("LOCKD_TOKEN"),
		cacert: getenv("LOCKD_CACERT"), cert: getenv("LOCKD_CERT"), key: getenv("LOCKD_KEY")}
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
	case "revoke":
		return e.revoke(ctx, rest)
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
	case "snapshot":
		return e.snapshot(ctx, rest)
	case "bench":
		return e.bench(ctx, rest)
	case "watch":
		return e.watch(ctx, rest)
	case "elect":
		return e.elect(ctx, rest)
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
	scheme := "http://"
	if e.g.cacert != "" || e.g.cert != "" {
		scheme = "https://"
	}
	var out []string
	for _, s := range strings.Split(e.g.endpoints, ",") {
		if s = strings.TrimSpace(s); s != "" {
			if !strings.Contains(s, "://") {
				s = scheme + s
			}
			out = append(out, s)
		}
	}
	return out
}

// setupError is a failure to read a file named by a flag (exit 1, not 2).
type setupError struct{ err error }

func (s *setupError) Error() string { return s.err.Error() }
func (s *setupError) Unwrap() error { return s.err }

// tlsConfig builds the TLS settings from --cacert, --cert and --key; nil
// when none is set (https:// endpoints then use the system roots).
func (e *env) tlsConfig() (*tls.Config, error) {
	g := e.g
	if g.cacert == "" && g.cert == "" && g.key == "" {
		return nil, nil
	}
	if (g.cert == "") != (g.key == "") {
		return nil, errors.New("--cert and --key go together (client certificate and its key)")
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if g.cacert != "" {
		pem, err := os.ReadFile(g.cacert)
		if err != nil {
			return nil, &setupError{fmt.Errorf("--cacert: %w", err)}
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, &setupError{fmt.Errorf("--cacert %s: no PEM certificate in the file", g.cacert)}
		}
	}
	if g.cert != "" {
		kp, err := tls.LoadX509KeyPair(g.cert, g.key)
		if err != nil {
			return nil, &setupError{fmt.Errorf("--cert %s / --key %s: %w", g.cert, g.key, err)}
		}
		cfg.Certificates = []tls.Certificate{kp}
	}
	return cfg, nil
}

// setupFailed reports an error building the client: a bad flag (exit 2) or
// an unreadable certificate file (exit 1).
func (e *env) setupFailed(err error) int {
	var se *setupError
	if errors.As(err, &se) {
		fmt.Fprintf(e.stderr, "lockctl: %v\n", err)
		return exitError
	}
	return usageErr(e.stderr, err)
}

func (e *env) clientID() string {
	if e.g.clientID != "" {
		return e.g.clientID
	}
	return client.DefaultClientID()
}

func (e *env) api() (*client.API, error) {
	tc, err := e.tlsConfig()
	if err != nil {
		return nil, err
	}
	return client.NewAPI(client.APIConfig{Endpoints: e.endpoints(), TLSConfig: tc, Token: e.g.token})
}
