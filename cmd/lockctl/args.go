package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"time"
)

// errHelp: -h or --help was given; the usage is printed, exit 0.
var errHelp = errors.New("help requested")

// newFlagSet returns a flag set that also takes the global flags, so they
// may come after the command too.
func newFlagSet(name string, stderr io.Writer, g *globals) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&g.endpoints, "endpoints", g.endpoints, "comma-separated member URLs (env LOCKD_ENDPOINTS)")
	fs.StringVar(&g.clientID, "client-id", g.clientID, "client ID (default <hostname>:<pid>)")
	fs.StringVar(&g.output, "o", g.output, "output format: text or json")
	if g.timeout == 0 {
		g.timeout = 10 * time.Second
	}
	fs.DurationVar(&g.timeout, "timeout", g.timeout, "how long to look for a leader and wait for replies")
	// Not --token: that is the fencing token of release and renew.
	fs.StringVar(&g.token, "auth-token", g.token, "bearer token (env LOCKD_TOKEN)")
	fs.StringVar(&g.cacert, "cacert", g.cacert, "PEM CA certificate(s) to verify the members (env LOCKD_CACERT)")
	fs.StringVar(&g.cert, "cert", g.cert, "PEM client certificate for mTLS (env LOCKD_CERT)")
	fs.StringVar(&g.key, "key", g.key, "PEM private key of --cert (env LOCKD_KEY)")
	return fs
}

// parseArgs parses flags interleaved with positional arguments, which the
// standard flag package alone does not: "run NAME --wait 5s -- CMD" must
// work. It stops at "--" (rest is what follows) or, with maxPos > 0, at the
// maxPos-th positional argument (rest is what follows it, not parsed).
func parseArgs(fs *flag.FlagSet, args []string, maxPos int) (pos, rest []string, err error) {
	for {
		before := args
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, nil, errHelp
			}
			return nil, nil, err
		}
		args = fs.Args()
		if n := len(before) - len(args); n > 0 && before[n-1] == "--" {
			return pos, args, nil
		}
		if len(args) == 0 {
			return pos, nil, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
		if maxPos > 0 && len(pos) == maxPos {
			return pos, args, nil
		}
	}
}

// parseExact parses a command's flags and wants exactly n positional
// arguments, named by names for the error message.
func parseExact(fs *flag.FlagSet, args []string, names ...string) ([]string, error) {
	pos, rest, err := parseArgs(fs, args, 0)
	if err != nil {
		return nil, err
	}
	pos = append(pos, rest...)
	if len(pos) != len(names) {
		if len(pos) < len(names) {
			return nil, fmt.Errorf("%s: missing %s", fs.Name(), names[len(pos)])
		}
		return nil, fmt.Errorf("%s: unexpected argument %q", fs.Name(), pos[len(names)])
	}
	return pos, nil
}
