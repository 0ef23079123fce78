package main

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// The command line is github.com/spf13/cobra's: every command has its own
// --help, `lockctl completion bash|zsh|fish|powershell` writes completion
// scripts, and a mistake gets one line naming it and the command's help
// (not the whole usage). What is lockctl's own: the help layout below, the
// exit codes, hints on durations, the environment, and the Go flag
// package's single-dash long flags (-ttl 30s), which lockctl took before
// it moved to cobra and still takes (see goStyleArgs).

func init() {
	// The commands keep the order they are added in (by topic), in the
	// help and in completions.
	cobra.EnableCommandSorting = false
}

// exitStatus is what a command returns after it printed its own message:
// lockctl exits with it. Any other error out of a command is a usage error
// (exit 2), printed by lockctl with a hint to the command's help.
type exitStatus int

func (s exitStatus) Error() string { return "exit status " + strconv.Itoa(int(s)) }

// status turns a command's exit code into what RunE returns.
func status(code int) error {
	if code == exitOK {
		return nil
	}
	return exitStatus(code)
}

// printUsageErr prints a usage error as one line, and where to read more.
func printUsageErr(w io.Writer, cmd *cobra.Command, err error) {
	path := "lockctl"
	if cmd != nil {
		path = cmd.CommandPath()
	}
	fmt.Fprintf(w, "lockctl: %s\nRun '%s --help' for usage.\n", safe(err.Error()), safe(path))
}

// usageErr prints a usage error of the command running and returns 2.
func (e *env) usageErr(err error) int {
	printUsageErr(e.stderr, e.cmd, err)
	return exitUsage
}

// subPath is a command's path without "lockctl ": how messages name it.
func subPath(c *cobra.Command) string {
	return strings.TrimPrefix(c.CommandPath(), "lockctl ")
}

// positional checks a command's positional arguments against names, the
// words its messages use for them ("missing NAME", "unexpected argument").
func positional(names ...string) cobra.PositionalArgs {
	return func(c *cobra.Command, args []string) error {
		switch {
		case len(args) < len(names):
			return fmt.Errorf("%s: missing %s", subPath(c), names[len(args)])
		case len(args) > len(names):
			return fmt.Errorf("%s: unexpected argument %q", subPath(c), args[len(names)])
		}
		return nil
	}
}

// group is a command that only holds others (session, cluster, ...): run
// without one, or with an unknown one, it is a usage error naming them.
func group(c *cobra.Command, want string) *cobra.Command {
	c.Args = cobra.ArbitraryArgs
	c.RunE = func(c *cobra.Command, args []string) error {
		if len(args) == 0 {
			return fmt.Errorf("%s: want %s", subPath(c), want)
		}
		var names []string
		for _, s := range c.Commands() {
			if s.IsAvailableCommand() {
				names = append(names, s.Name())
			}
		}
		return fmt.Errorf("%s: unknown subcommand %q (want %s)", subPath(c), args[0], strings.Join(names, ", "))
	}
	return c
}

// durationValue is a duration flag whose mistakes come with a hint:
// "--ttl 30" is "a duration needs a unit, e.g. 30s".
type durationValue time.Duration

func (d *durationValue) Set(s string) error {
	v, err := parseDuration(s)
	if err != nil {
		return err
	}
	*d = durationValue(v)
	return nil
}

func (d *durationValue) String() string {
	if *d == 0 {
		return "0" // pflag shows no default for "0"
	}
	return time.Duration(*d).String()
}

func (d *durationValue) Type() string { return "duration" }

// durationVar defines a duration flag with a default.
func durationVar(fs *pflag.FlagSet, p *time.Duration, name string, def time.Duration, usage string) {
	*p = def
	fs.Var((*durationValue)(p), name, usage)
}

// parseDuration is time.ParseDuration with a hint for what people type.
func parseDuration(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err == nil {
		return d, nil
	}
	t := strings.TrimSpace(s)
	if _, ferr := strconv.ParseFloat(t, 64); ferr == nil {
		return 0, fmt.Errorf("a duration needs a unit, e.g. %ss (units: ms, s, m, h)", t)
	}
	if n, ok := strings.CutSuffix(t, "d"); ok {
		if days, ferr := strconv.ParseFloat(n, 64); ferr == nil {
			return 0, fmt.Errorf("durations have no days: write %vh", days*24)
		}
	}
	return 0, errors.New("not a duration: write it like 500ms, 30s, 5m or 1h30m")
}

// flagError words a flag's bad value: "invalid value "x" for --ttl: ...".
func flagError(_ *cobra.Command, err error) error {
	var ive *pflag.InvalidValueError
	if !errors.As(err, &ive) {
		return err
	}
	cause := ive.Unwrap()
	var ne *strconv.NumError
	if errors.As(cause, &ne) {
		switch ive.GetFlag().Value.Type() {
		case "uint", "uint64":
			cause = errors.New("want a whole number, 0 or more")
		default:
			cause = errors.New("want a whole number")
		}
		if errors.Is(ne.Err, strconv.ErrRange) {
			cause = errors.New("out of range")
		}
	}
	return fmt.Errorf("invalid value %q for --%s: %v", ive.GetValue(), ive.GetFlag().Name, cause)
}

// normalizeFlag lets --o stand for --output: the flag was named o before
// lockctl moved to cobra.
func normalizeFlag(_ *pflag.FlagSet, name string) pflag.NormalizedName {
	if name == "o" {
		return "output"
	}
	return pflag.NormalizedName(name)
}

// lookupFlag finds a flag a command accepts, its own or inherited.
func lookupFlag(c *cobra.Command, name string) *pflag.Flag {
	name = string(normalizeFlag(nil, name))
	for ; c != nil; c = c.Parent() {
		if f := c.Flags().Lookup(name); f != nil {
			return f
		}
		if f := c.PersistentFlags().Lookup(name); f != nil {
			return f
		}
	}
	return nil
}

func lookupShorthand(c *cobra.Command, s string) *pflag.Flag {
	for ; c != nil; c = c.Parent() {
		if f := c.Flags().ShorthandLookup(s); f != nil {
			return f
		}
		if f := c.PersistentFlags().ShorthandLookup(s); f != nil {
			return f
		}
	}
	return nil
}

// stopAfter, in a command's annotations, is the number of positional
// arguments after which its own arguments end (run: NAME, then CMD and
// CMD's arguments, which are not lockctl's).
const stopAfter = "lockctl/stop-after"

// goStyleArgs rewrites the single-dash long flags of Go's flag package
// (-ttl 30s, -token=5, -help), which lockctl took before it moved to
// cobra, into the double-dash form pflag wants. Only names a command
// accepts are rewritten, never a flag's value, nothing after "--", and
// nothing of run's CMD.
func goStyleArgs(root *cobra.Command, args []string) []string {
	out := slices.Clone(args)
	cur, npos := root, 0
	takesValue := func(f *pflag.Flag, hasValue bool) bool { return f != nil && !hasValue && f.NoOptDefVal == "" }
	for i := 0; i < len(out); i++ {
		a := out[i]
		switch {
		case a == "--":
			return out
		case strings.HasPrefix(a, "--"):
			name, _, hasValue := strings.Cut(a[2:], "=")
			if takesValue(lookupFlag(cur, name), hasValue) {
				i++
			}
		case len(a) > 1 && a[0] == '-':
			name, _, hasValue := strings.Cut(a[1:], "=")
			if len(name) == 1 {
				if takesValue(lookupShorthand(cur, name), hasValue) {
					i++
				}
				continue
			}
			f := lookupFlag(cur, name)
			if f == nil && name != "help" && !(name == "version" && cur == root) {
				continue // not a flag of this command: pflag says so
			}
			out[i] = "-" + a
			if takesValue(f, hasValue) {
				i++
			}
		default:
			if npos == 0 {
				if sub := findSub(cur, a); sub != nil {
					cur = sub
					continue
				}
			}
			npos++
			if n, err := strconv.Atoi(cur.Annotations[stopAfter]); err == nil && npos >= n {
				return out
			}
		}
	}
	return out
}

func findSub(c *cobra.Command, name string) *cobra.Command {
	for _, s := range c.Commands() {
		if s.Name() == name || slices.Contains(s.Aliases, name) {
			return s
		}
	}
	return nil
}

// Help. The root's help is an overview: every command with its synopsis,
// the global flags and the exit codes; a command's own help has the
// details.

const rootIntro = `lockctl — command-line client of lockd, the distributed lock service.

Usage:
  lockctl [global flags] <command> [args and flags]
`

const exitCodesHelp = `Exit codes:
  0  success (run: CMD's own exit code)
  1  error
  2  usage error
  3  run: the lock was lost while CMD ran; CMD was stopped
     elect: the leadership was lost
  4  lock not acquired: held by another client, or the wait timed out (or was
     withdrawn by another lockctl of the same client ID)
  5  not the holder of the lock (revoke --token: no grant has that token), or the
     session expired / does not exist
  6  no leader: no member could name a leader or none answered within --timeout
     (or the cluster stayed overloaded); at once when every endpoint refuses
     the connection or the TLS handshake (an untrusted certificate, say); an
     http:// endpoint of a member that speaks HTTPS too; endpoint status: no
     member answered
  7  not authorized: no token or an unknown one (401 unauthenticated), or the
     token lacks the access the command needs (403 permission_denied)
  8  cluster add, remove or transfer refused by the cluster: no such member, an
     invalid address, or a change the cluster cannot make now
  128+N  acquire, run: stopped by signal N while waiting (the wait withdrawn)
`

const endpointsHelp = `An endpoint without a scheme gets https:// when --cacert or --cert is set, else http://.
Flags may come before or after positional arguments; "--" ends them.

Text output never writes a string another client chose (a value, a client id, a
lock or member name, an error message echoing one) raw to the terminal: a field
of a key=value line is quoted in Go syntax when it has a space, a '"', a '=' or
a control or non-printable character (value="two\nlines"); a character a
terminal would act on is escaped as Go's %q writes it (\n, \r, \x1b, \u202e);
printable text, any script, is shown as it is. elect prints a value as it is
unless it has such a character, leading or trailing space, or begins with '"'
or "client_id=": then quoted (strconv.Unquote reads it back), so a value is
always one line. -o json prints the exact strings.
`

// synopsis is how the overview shows a command: its path and arguments.
func synopsis(c *cobra.Command) string {
	return subPath(c) + strings.TrimPrefix(c.Use, c.Name())
}

// leaves are the commands that run something, depth first.
func leaves(c *cobra.Command) []*cobra.Command {
	var out []*cobra.Command
	for _, s := range c.Commands() {
		if !s.IsAvailableCommand() {
			continue
		}
		if s.HasAvailableSubCommands() {
			out = append(out, leaves(s)...)
		} else {
			out = append(out, s)
		}
	}
	return out
}

func wrapFlags(fs *pflag.FlagSet) string { return fs.FlagUsagesWrapped(100) }

func rootHelp(root *cobra.Command) string {
	var b strings.Builder
	b.WriteString(rootIntro)
	for _, g := range root.Groups() {
		fmt.Fprintf(&b, "\n%s\n", g.Title)
		for _, c := range root.Commands() {
			if c.GroupID != g.ID || !c.IsAvailableCommand() {
				continue
			}
			cs := []*cobra.Command{c}
			if c.HasAvailableSubCommands() {
				cs = leaves(c)
			}
			for _, l := range cs {
				fmt.Fprintf(&b, "  %s\n        %s\n", synopsis(l), l.Short)
			}
		}
	}
	b.WriteString("\nRun 'lockctl COMMAND --help' for a command's details, e.g. lockctl acquire --help.\n")
	fs := pflag.NewFlagSet("lockctl", pflag.ContinueOnError)
	fs.AddFlagSet(root.PersistentFlags())
	fs.AddFlagSet(root.LocalNonPersistentFlags())
	fmt.Fprintf(&b, "\nGlobal flags (also accepted after the command):\n%s\n%s\n%s", wrapFlags(fs), endpointsHelp, exitCodesHelp)
	return b.String()
}

func commandHelp(c *cobra.Command) string {
	var b strings.Builder
	if c.HasAvailableSubCommands() {
		fmt.Fprintf(&b, "usage: lockctl %s COMMAND\n\n", subPath(c))
	} else {
		fmt.Fprintf(&b, "usage: lockctl %s\n\n", synopsis(c))
	}
	desc := c.Long
	if desc == "" {
		desc = c.Short
	}
	fmt.Fprintf(&b, "%s\n", strings.TrimRight(desc, "\n"))
	if c.HasAvailableSubCommands() {
		b.WriteString("\nCommands:\n")
		for _, l := range leaves(c) {
			fmt.Fprintf(&b, "  %s\n        %s\n", synopsis(l), l.Short)
		}
	}
	if c.Example != "" {
		fmt.Fprintf(&b, "\nExamples:\n%s\n", strings.TrimRight(c.Example, "\n"))
	}
	if fs := c.LocalFlags(); fs.HasAvailableFlags() {
		fmt.Fprintf(&b, "\nFlags:\n%s", wrapFlags(fs))
	}
	if fs := c.InheritedFlags(); fs.HasAvailableFlags() {
		fmt.Fprintf(&b, "\nGlobal flags:\n%s", wrapFlags(fs))
	}
	b.WriteString("\nExit codes: see lockctl --help.\n")
	return b.String()
}

func helpFunc(c *cobra.Command, _ []string) {
	if !c.HasParent() {
		fmt.Fprint(c.OutOrStdout(), rootHelp(c))
		return
	}
	fmt.Fprint(c.OutOrStdout(), commandHelp(c))
}
