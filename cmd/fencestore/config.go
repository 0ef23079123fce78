package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/lockd/lockd/fence"
)

// envPrefix: each flag --some-flag may also come from FENCESTORE_SOME_FLAG.
// The command line wins over the environment.
const envPrefix = "FENCESTORE_"

// dbFile is the bbolt file inside --data-dir.
const dbFile = "fencestore.db"

// Config is the fencestore configuration, from flags and environment.
type Config struct {
	Addr      string
	DataDir   string
	VerifyKey string // path of a PEM public key; "" checks no proofs
	// Guards bind keys to locks by prefix (--guard PREFIX=LOCK, repeatable).
	Guards []fence.Guard
	// AdminTokenFile holds the bearer token of DELETE
	// /v1/objects/{key}/fence; "" turns that endpoint off.
	AdminTokenFile  string
	MaxValueBytes   int64
	LogFormat       string
	LogLevel        string
	ShutdownTimeout time.Duration
	// TLSCert and TLSKey serve HTTPS; with ClientCA, clients must present a
	// certificate signed by it (mTLS). Re-read on SIGHUP.
	TLSCert  string
	TLSKey   string
	ClientCA string
	// ShowVersion: print the version and exit (--version).
	ShowVersion bool
}

// TLS reports whether fencestore serves HTTPS.
func (c Config) TLS() bool { return c.TLSCert != "" }

// parseConfig reads args (without the program name) and, for flags not on
// the command line, getenv. Output goes to out (for --help and errors).
func parseConfig(args []string, getenv func(string) string, out io.Writer) (Config, error) {
	var c Config
	fs := flag.NewFlagSet("fencestore", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&c.Addr, "addr", "127.0.0.1:7090", "HTTP listen address")
	fs.StringVar(&c.DataDir, "data-dir", "./fencestore-data", "directory of the bbolt file `"+dbFile+"`")
	fs.StringVar(&c.VerifyKey, "verify-key", "", "PEM Ed25519 public key of the lock service (PKIX); when set, every write needs Fencing-Lock and a Fencing-Proof of an exclusive grant of the key's lock that has not expired")
	fs.Func("guard", "`PREFIX=LOCK`: keys starting with PREFIX are guarded by LOCK (repeatable, or comma-separated; the longest matching prefix wins; other keys are bound to the lock of their first accepted write)", func(v string) error {
		for _, part := range strings.Split(v, ",") {
			g, err := fence.ParseGuard(part)
			if err != nil {
				return err
			}
			c.Guards = append(c.Guards, g)
		}
		return nil
	})
	fs.StringVar(&c.AdminTokenFile, "admin-token-file", "", "file holding the admin bearer token (at least 16 bytes) of DELETE /v1/objects/{key}/fence, which resets a key's highest token and lock binding; unset turns that endpoint off")
	fs.Int64Var(&c.MaxValueBytes, "max-value-bytes", 1<<20, "largest accepted value (PUT body) in bytes; larger gets 413")
	fs.StringVar(&c.LogFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&c.LogLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", 10*time.Second, "on SIGTERM/SIGINT, how long to let requests in flight finish")
	fs.StringVar(&c.TLSCert, "tls-cert", "", "PEM certificate: serve HTTPS (with --tls-key); re-read on SIGHUP")
	fs.StringVar(&c.TLSKey, "tls-key", "", "PEM private key of --tls-cert")
	fs.BoolVar(&c.ShowVersion, "version", false, "print the version and exit")
	fs.StringVar(&c.ClientCA, "client-ca", "", "PEM CA certificate(s): require client certificates signed by it (mTLS; needs --tls-cert); re-read on SIGHUP")
	fs.Usage = func() {
		fmt.Fprintf(out, "Usage: fencestore [flags]\n\n"+
			"A resource server that accepts a write only with a fencing token not lower than\n"+
			"the highest it has accepted for that key, under the lock that guards the key:\n"+
			"--guard PREFIX=LOCK, else the Fencing-Lock of the key's first accepted write,\n"+
			"kept from then on. A write naming another lock gets 403 whatever its token.\n\n"+
			"Without --verify-key tokens are not authenticated: any client can write any\n"+
			"token, and one PUT with Fencing-Token 18446744073709551615 blocks a key for\n"+
			"good. Run with --verify-key where clients are not all trusted. With\n"+
			"--admin-token-file, DELETE /v1/objects/{key}/fence[?fencing_token=N] with\n"+
			"\"Authorization: Bearer <token>\" resets a key's highest token to N (default 0)\n"+
			"and drops its lock binding (the value stays).\n\n"+
			"Each flag --some-flag may also be set as %sSOME_FLAG in the environment; the\n"+
			"command line wins. With --tls-cert and --tls-key it serves HTTPS, and with\n"+
			"--client-ca it requires client certificates; SIGHUP re-reads those files (a\n"+
			"file that fails to load keeps the old ones).\n\nFlags:\n", envPrefix)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if c.ShowVersion {
		return c, nil
	}
	set := map[string]bool{"version": true} // never from the environment
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] {
			return
		}
		env := envPrefix + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v := getenv(env); v != "" {
			if err := f.Value.Set(v); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: %w", env, v, err))
			}
		}
	})
	if err := errors.Join(errs...); err != nil {
		return c, err
	}
	return c, c.Validate()
}

// Validate reports a configuration fencestore cannot start with.
func (c Config) Validate() error {
	var errs []error
	if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		errs = append(errs, fmt.Errorf("--addr %q: %w", c.Addr, err))
	}
	if c.DataDir == "" {
		errs = append(errs, errors.New("--data-dir is empty"))
	}
	if c.MaxValueBytes <= 0 {
		errs = append(errs, fmt.Errorf("--max-value-bytes %d: want > 0", c.MaxValueBytes))
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		errs = append(errs, fmt.Errorf("--log-format %q: want text or json", c.LogFormat))
	}
	if _, err := parseLevel(c.LogLevel); err != nil {
		errs = append(errs, err)
	}
	if c.ShutdownTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--shutdown-timeout %s: want > 0", c.ShutdownTimeout))
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		errs = append(errs, errors.New("--tls-cert and --tls-key go together"))
	}
	if c.ClientCA != "" && c.TLSCert == "" {
		errs = append(errs, errors.New("--client-ca needs --tls-cert and --tls-key (client certificates are checked over HTTPS)"))
	}
	if _, err := fence.NewGuards(c.Guards...); err != nil {
		errs = append(errs, fmt.Errorf("--guard: %w", err))
	}
	return errors.Join(errs...)
}

// DBPath is the bbolt file the store lives in.
func (c Config) DBPath() string { return filepath.Join(c.DataDir, dbFile) }

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("--log-level %q: want debug, info, warn or error", s)
	}
	return l, nil
}

// newLogger builds the process logger; Validate has checked the inputs.
func newLogger(c Config, w io.Writer) *slog.Logger {
	level, _ := parseLevel(c.LogLevel)
	opts := &slog.HandlerOptions{Level: level}
	if c.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// readAdminToken reads --admin-token-file: the token is the file's content
// without surrounding whitespace (so a trailing newline does not count).
func readAdminToken(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("--admin-token-file: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxAdminTokenFile+1))
	if err != nil {
		return "", fmt.Errorf("--admin-token-file %s: %w", path, err)
	}
	if len(b) > maxAdminTokenFile {
		return "", fmt.Errorf("--admin-token-file %s: larger than %d bytes, not a token", path, maxAdminTokenFile)
	}
	tok := strings.TrimSpace(string(b))
	if len(tok) < fence.MinAdminTokenBytes {
		return "", fmt.Errorf("--admin-token-file %s: the token is %d bytes, want at least %d (e.g. openssl rand -hex 32)", path, len(tok), fence.MinAdminTokenBytes)
	}
	return tok, nil
}

// maxAdminTokenFile bounds what readAdminToken reads.
const maxAdminTokenFile = 4096
