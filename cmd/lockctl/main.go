// Command lockctl is the command-line client of lockd: acquire (shared,
// semaphores, several locks at once), release, renew and revoke locks, read
// their status, watch them change (lockctl watch), run leader elections
// (lockctl elect), manage sessions and cluster membership, show every
// member's own view (lockctl endpoint status), run a command while holding
// a lock (lockctl run, for cron jobs), save and restore backups (lockctl
// snapshot), make a cluster's TLS certificates (lockctl tls) and the key
// pair for signed fencing tokens (lockctl keygen). It speaks HTTPS
// (--cacert, --cert, --key) and sends a bearer token (--auth-token,
// LOCKD_TOKEN) when the cluster asks for them.
//
// The command line is github.com/spf13/cobra's (cli.go): a help per
// command, shell completion, usage errors of one line. It talks to the
// cluster only through the public package client; lockctl tls takes the
// member identity from internal/tlsfiles, the one definition lockd checks.
// See lockctl --help for the commands and the exit codes.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/client"
	"github.com/lockd/lockd/internal/version"
)

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
	exitCluster     = 8 // cluster add/remove/transfer refused: no such member, a bad address, ...
)

func main() {
	os.Exit(lockctl(context.Background(), os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

// globals are the flags every command accepts.
type globals struct {
	endpoints string
	clientID  string
	output    string
	timeout   time.Duration
	token     string
	cacert    string
	cert      string
	key       string
}

// lockctl runs one command line and returns the exit code.
func lockctl(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	e := &env{g: &globals{}, stdout: stdout, stderr: stderr, getenv: getenv}
	root := e.root()
	root.SetArgs(goStyleArgs(root, args))
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return exitOK
	}
	var st exitStatus
	if errors.As(err, &st) {
		return int(st)
	}
	printUsageErr(stderr, cmd, err)
	return exitUsage
}

// envFlags are the global flags read from the environment when not given.
var envFlags = []struct{ flag, env string }{
	{"endpoints", "LOCKD_ENDPOINTS"},
	{"auth-token", "LOCKD_TOKEN"},
	{"cacert", "LOCKD_CACERT"},
	{"cert", "LOCKD_CERT"},
	{"key", "LOCKD_KEY"},
}

// root builds the command tree.
func (e *env) root() *cobra.Command {
	g := e.g
	root := &cobra.Command{
		Use:           "lockctl",
		Short:         "command-line client of lockd, the distributed lock service",
		Version:       version.String(),
		SilenceErrors: true,
		SilenceUsage:  true,
		// No command: the overview, on stderr (it is a mistake). An
		// unknown one: cobra's error, with suggestions.
		RunE: func(c *cobra.Command, _ []string) error {
			fmt.Fprint(e.stderr, rootHelp(c))
			return exitStatus(exitUsage)
		},
		PersistentPreRunE: func(c *cobra.Command, _ []string) error {
			e.cmd = c
			if c.DisableFlagParsing {
				return nil // run parses its own flags, then calls setup
			}
			return e.setup(c)
		},
		// lockctl's own completion command (completion.go) says how to
		// install the scripts.
		CompletionOptions: cobra.CompletionOptions{DisableDefaultCmd: true},
	}
	root.SetVersionTemplate("lockctl {{.Version}}\n")
	root.SetHelpFunc(helpFunc)
	root.SetFlagErrorFunc(flagError)
	root.SetGlobalNormalizationFunc(normalizeFlag)
	pf := root.PersistentFlags()
	pf.StringVar(&g.endpoints, "endpoints", "http://127.0.0.1:7070", "comma-separated member `URLS` (env LOCKD_ENDPOINTS)")
	pf.StringVar(&g.clientID, "client-id", "", "client `ID` (default: user@host for acquire, release and renew, so that a release finds what an acquire took; user@host:pid for run, elect and watch, one client per process)")
	pf.StringVarP(&g.output, "output", "o", "text", "output format: `text|json`")
	durationVar(pf, &g.timeout, "timeout", 10*time.Second, "how long to look for a leader and wait for replies; acquire and run add --wait to it; it also bounds a snapshot transfer")
	// Not --token: that is the fencing token of release and renew.
	pf.StringVar(&g.token, "auth-token", "", "bearer token `T`, when the cluster runs with --auth-file (env LOCKD_TOKEN; prefer the environment: the command line is visible to other users). Not --token, the fencing token of release and renew")
	pf.StringVar(&g.cacert, "cacert", "", "the CA certificate(s), a PEM `FILE`, to verify the members' HTTPS certificates with (env LOCKD_CACERT; default: the system roots)")
	pf.StringVar(&g.cert, "cert", "", "client certificate, a PEM `FILE`, for members that require one (mTLS) (env LOCKD_CERT)")
	pf.StringVar(&g.key, "key", "", "the private key of --cert, a PEM `FILE` (env LOCKD_KEY)")
	root.Flags().BoolP("help", "h", false, "print this help")
	root.Flags().BoolP("version", "v", false, "print the version")
	for _, f := range []string{"cacert", "cert", "key"} {
		_ = root.MarkPersistentFlagFilename(f, "pem")
	}
	_ = root.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{"text", "json"}, cobra.ShellCompDirectiveNoFileComp))

	root.AddGroup(
		&cobra.Group{ID: "locks", Title: "Locks:"},
		&cobra.Group{ID: "watch", Title: "Watches and elections:"},
		&cobra.Group{ID: "cluster", Title: "Sessions and the cluster:"},
		&cobra.Group{ID: "ops", Title: "Backups, certificates and keys:"},
		&cobra.Group{ID: "other", Title: "Other:"},
	)
	add := func(id string, cs ...*cobra.Command) {
		for _, c := range cs {
			c.GroupID = id
			root.AddCommand(c)
		}
	}
	add("locks", e.acquireCmd(), e.releaseCmd(), e.renewCmd(), e.revokeCmd(), e.statusCmd(), e.listCmd(), e.runCmd())
	add("watch", e.watchCmd(), e.electCmd())
	add("cluster", e.sessionCmd(), e.clusterCmd(), e.endpointCmd())
	add("ops", e.snapshotCmd(), e.tlsCmd(), e.keygenCmd())
	add("other", e.benchCmd(), completionCmd())
	root.SetHelpCommandGroupID("other")
	return root
}

// setup finishes the global flags once a command's flags are parsed: the
// environment for those not given, and the output format.
func (e *env) setup(c *cobra.Command) error {
	fs := c.Flags()
	for _, ef := range envFlags {
		if f := fs.Lookup(ef.flag); f != nil && !f.Changed {
			if v := e.getenv(ef.env); v != "" {
				_ = f.Value.Set(v)
			}
		}
	}
	return e.checkOutput()
}

// env is what a command runs with.
type env struct {
	g      *globals
	stdout io.Writer
	stderr io.Writer
	getenv func(string) string
	cmd    *cobra.Command // the command running, for the hints of usage errors
	// deadline is when the command's requests give up (--timeout, plus a
	// wait), for the lines it prints while it waits.
	deadline time.Time
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
		fmt.Fprintf(e.stderr, "lockctl: %s\n", safe(err.Error()))
		return exitError
	}
	return e.usageErr(err)
}

// clientID is the client ID of the commands without a session (acquire,
// release, renew, session create): --client-id, or
// user@host, the same for every lockctl of a user on a host, so that
// `lockctl release` releases what an earlier `lockctl acquire` took.
func (e *env) clientID() string {
	if e.g.clientID != "" {
		return e.g.clientID
	}
	return userAtHost()
}

// sessionClientID is the client ID of the commands that hold a session
// while they run (run, elect, watch; bench's prefix): --client-id, or
// user@host:pid. Two of them running at once must not be one client to the
// server: a second `lockctl run` of a lock would be handed the first one's
// grant.
func (e *env) sessionClientID() string {
	if e.g.clientID != "" {
		return e.g.clientID
	}
	return limitID(userAtHost() + ":" + strconv.Itoa(os.Getpid()))
}

// userAtHost is "user@host" for the user running lockctl (by name, else
// by uid) on this host, at most 128 bytes.
func userAtHost() string {
	name := ""
	if u, err := user.Current(); err == nil {
		name = u.Username
	}
	if name == "" {
		name = os.Getenv("USER")
	}
	if name == "" {
		name = strconv.Itoa(os.Getuid())
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "localhost"
	}
	return limitID(name + "@" + host)
}

// limitID keeps an ID within lockd's 128 bytes and printable ASCII
// (a user or host name with a control character would be refused).
func limitID(id string) string {
	id = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return '_'
		}
		return r
	}, id)
	if len(id) > api.MaxClientID {
		id = strings.ToValidUTF8(id[len(id)-api.MaxClientID:], "")
	}
	return id
}

func (e *env) api() (*client.API, error) {
	return e.apiFor("")
}

// apiFor builds the API client; what, when set, names the command's
// object in the line it prints on stderr while it waits for a leader.
func (e *env) apiFor(what string) (*client.API, error) {
	tc, err := e.tlsConfig()
	if err != nil {
		return nil, err
	}
	cfg := client.APIConfig{Endpoints: e.endpoints(), TLSConfig: tc, Token: e.g.token}
	if what != "" {
		cfg.OnRetry = e.waitingNote(what)
	}
	return client.NewAPI(cfg)
}
