package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/client"
)

// stopSignals end watch and elect (exit 0), and an acquire's wait.
var stopSignals = []os.Signal{syscall.SIGINT, syscall.SIGTERM}

// closeTimeout bounds the clean-up of watch's and elect's session on the
// server when they stop.
const closeTimeout = 700 * time.Millisecond

// watchEvent is a watch's -o json line: the WebSocket changed frame's
// fields, and resync when the status was read again after a reconnect or
// after falling behind.
type watchEvent struct {
	Lock   string         `json:"lock"`
	Index  uint64         `json:"index"`
	Status api.LockStatus `json:"status"`
	Resync bool           `json:"resync,omitempty"`
}

// watchLine is a watch's text line: the lock, the index, held or free, the
// holder(s), the value.
func watchLine(ev client.WatchEvent) string {
	st := ev.Status
	var b strings.Builder
	fmt.Fprintf(&b, "%s index=%d", textValue(ev.Lock), ev.Index)
	if !st.Held && len(st.Holders) == 0 {
		fmt.Fprintf(&b, " free waiters=%d", st.Waiters)
	} else {
		fmt.Fprintf(&b, " held client_id=%s token=%d mode=%s waiters=%d value=%s", textValue(st.ClientID), st.FencingToken, textValue(st.Mode), st.Waiters, textValue(st.Value))
		if len(st.Holders) > 1 {
			hs := make([]string, len(st.Holders))
			for i, h := range st.Holders {
				hs[i] = textValue(h.ClientID) + ":" + strconv.FormatUint(h.FencingToken, 10)
			}
			fmt.Fprintf(&b, " holders=%s", strings.Join(hs, ","))
		}
	}
	if st.DelayedUntil != "" {
		fmt.Fprintf(&b, " delayed_until=%s", textValue(st.DelayedUntil))
	}
	if ev.Resync {
		b.WriteString(" resync")
	}
	return b.String()
}

// printLine writes v as one line of JSON, or text.
func (e *env) printLine(v any, text string) {
	if e.jsonOut() {
		data, _ := json.Marshal(v)
		fmt.Fprintln(e.stdout, string(data))
		return
	}
	fmt.Fprintln(e.stdout, safeText(text))
}

// openClient opens a Client (a session over WebSocket) within --timeout.
// code is the exit code when it fails: 0 when ctx ended (a signal).
func (e *env) openClient(ctx context.Context, sessionTTL time.Duration, what string) (c *client.Client, code int) {
	tc, err := e.tlsConfig()
	if err != nil {
		return nil, e.setupFailed(err)
	}
	cctx, cancel := e.ctx(ctx, 0)
	defer cancel()
	c, err = client.New(cctx, client.Config{Endpoints: e.endpoints(), ClientID: e.sessionClientID(), SessionTTL: sessionTTL, DialTimeout: -1, // ctx bounds it (--timeout)
		Logger: e.logger(), TLSConfig: tc, Token: e.g.token, OnRetry: e.waitingNote(what),
		// Stopped by a signal, lockctl is done within a second: the
		// session's deletion gets that long, else it ends by its TTL.
		CloseTimeout: closeTimeout})
	if err != nil {
		if ctx.Err() != nil {
			return nil, exitOK // stopped while connecting
		}
		return nil, e.fail(err, what)
	}
	return c, 0
}

func (e *env) watchCmd() *cobra.Command {
	var prefix string
	c := &cobra.Command{
		Use:   "watch NAME | watch --prefix P",
		Short: "print each change of a lock, or of every lock under a prefix, as it commits",
		Long: `Print each change of lock NAME (first its current state), or of every lock
under P (first those held, awaited or delayed now), as it commits: one line
per change — lock, index, held or free, holder, token, mode, waiters, value
(-o json: one object a line: lock, index, status). A state read again after
a reconnect, into which changes made meanwhile may be folded, ends in
"resync" (JSON "resync": true). Follows leader changes, and says on stderr
when it is disconnected from the cluster and when it is back (with how many
locks changed meanwhile). Runs until SIGINT or SIGTERM (exit 0, within a
second). It holds no lock: a token with read access to the lock or prefix
is enough (its connection then carries no session; with a lock token it
opens one, which holds nothing).`,
		Example: `  lockctl watch jobs/nightly
  lockctl watch --prefix jobs/ -o json`,
		Args: func(c *cobra.Command, args []string) error {
			prefixSet := c.Flags().Changed("prefix")
			switch {
			case prefixSet && len(args) > 0:
				return fmt.Errorf("watch: NAME or --prefix, not both")
			case !prefixSet && len(args) == 0:
				return errors.New("watch: missing NAME (or --prefix P)")
			case len(args) > 1:
				return fmt.Errorf("watch: unexpected argument %q", args[1])
			}
			return nil
		},
		RunE: func(c *cobra.Command, args []string) error {
			return status(e.watch(c.Context(), args, c.Flags().Changed("prefix"), prefix))
		},
	}
	c.Flags().StringVar(&prefix, "prefix", "", "watch every lock whose name starts with `P`")
	return c
}

func (e *env) watch(ctx context.Context, pos []string, prefixSet bool, prefix string) int {
	var err error
	ctx, stop := signal.NotifyContext(ctx, stopSignals...)
	defer stop()
	what := "watch " + strings.Join(pos, "")
	c, code := e.openClient(ctx, 15*time.Second, what)
	if c == nil {
		return code
	}
	defer c.Close()
	var ch <-chan client.WatchEvent
	if prefixSet {
		what = fmt.Sprintf("watch --prefix %q", prefix)
		ch, err = c.WatchPrefix(ctx, prefix, client.WithConnEvents())
	} else {
		ch, err = c.Watch(ctx, pos[0], client.WithConnEvents())
	}
	if err != nil {
		if ctx.Err() != nil {
			return exitOK
		}
		return e.fail(err, what)
	}
	for ev := range ch {
		if ev.Conn != nil {
			e.connLine(what, ev.Conn)
			continue
		}
		e.printLine(watchEvent{Lock: ev.Lock, Index: ev.Index, Status: ev.Status, Resync: ev.Resync}, watchLine(ev))
	}
	return exitOK // ctx ended: a signal
}

// connLine tells on stderr that a watch lost its connection, or has it
// again: without it, a quiet watch could be either no change or no
// cluster.
func (e *env) connLine(what string, ce *client.ConnEvent) {
	if !ce.Connected {
		e.note("%s: disconnected from the cluster (%v); reconnecting, no changes are shown meanwhile", what, ce.Err)
		return
	}
	changes := "changes"
	if ce.CaughtUp == 1 {
		changes = "change"
	}
	e.note("%s: re-established on %s; caught up %d %s made meanwhile", what, ce.Leader, ce.CaughtUp, changes)
}

// leaderLine is elect's -o json line.
type leaderLine struct {
	Lock         string `json:"lock"`
	Value        string `json:"value"`
	ClientID     string `json:"client_id"`
	FencingToken uint64 `json:"fencing_token"`
}

// leaderText is elect's text line: the leader's value, or for a leader
// without one, client_id=ID, which still names it. A value that could be
// mistaken (two lines, escape sequences, a quote first) is quoted: see
// lineValue.
func leaderText(value, clientID string) string {
	if value == "" {
		return "client_id=" + textValue(clientID)
	}
	return lineValue(value)
}

func (e *env) electCmd() *cobra.Command {
	var listen bool
	var sessionTTL time.Duration
	c := &cobra.Command{
		Use:   "elect NAME VALUE [--session-ttl 15s] | elect NAME --listen",
		Short: "campaign in an election and lead until stopped; or --listen: print each leader",
		Long: `elect NAME VALUE campaigns in election NAME (a lock: candidates queue in
order); once elected it prints VALUE (-o json: lock, value, client_id,
fencing_token) and leads until SIGINT or SIGTERM, then resigns (the next
candidate leads at once) and exits 0; stopped before it was elected, it
withdraws its candidacy. If the leadership is lost (the session expired, the
lock was revoked) it exits 3; a session lost while campaigning campaigns
again. --session-ttl: how long the cluster keeps the leadership of
a lockctl that stopped answering.

elect NAME --listen never campaigns: it prints the current leader's value,
then each new leader's (and each value it proclaims), one a line (a leader
without a value prints client_id=ID); a value with a control or
non-printable character (a newline, an escape sequence), leading or
trailing space, or a leading '"' or "client_id=" is printed quoted in Go
syntax, so each leader is one line; -o json adds client_id and
fencing_token and carries the value as it is. Until SIGINT/SIGTERM. --listen needs only read access to
NAME (a read token opens no session).`,
		Example: `  lockctl elect scheduler "$(hostname):8080"
  lockctl elect scheduler --listen`,
		Args: func(c *cobra.Command, pos []string) error {
			switch {
			case len(pos) == 0:
				return errors.New("elect: missing NAME")
			case listen && len(pos) > 1:
				return fmt.Errorf("elect: --listen takes no VALUE (got %q)", pos[1])
			case !listen && len(pos) == 1:
				return errors.New("elect: missing VALUE (or --listen)")
			case len(pos) > 2:
				return fmt.Errorf("elect: unexpected argument %q", pos[2])
			case !listen && (len(pos[1]) > api.MaxValueBytes || !utf8.ValidString(pos[1])):
				return fmt.Errorf("elect: VALUE: want valid UTF-8 of at most %d bytes (got %d bytes)", api.MaxValueBytes, len(pos[1]))
			}
			return nil
		},
		RunE: func(c *cobra.Command, pos []string) error {
			return status(e.elect(c.Context(), pos, listen, sessionTTL))
		},
	}
	c.Flags().BoolVar(&listen, "listen", false, "never campaign: print the current leader's value, then each new leader's")
	durationVar(c.Flags(), &sessionTTL, "session-ttl", 15*time.Second, "session TTL: how long the cluster keeps the leadership after lockctl stops answering")
	return c
}

func (e *env) elect(ctx context.Context, pos []string, listen bool, sessionTTL time.Duration) int {
	name := pos[0]
	ctx, stop := signal.NotifyContext(ctx, stopSignals...)
	defer stop()
	c, code := e.openClient(ctx, sessionTTL, "election "+name)
	if c == nil {
		return code
	}
	defer c.Close()
	el := client.NewElection(c, name)
	if listen {
		return e.listen(ctx, el)
	}

	value := pos[1]
	for {
		err := el.Campaign(ctx, value)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return exitOK // stopped before it was elected; Close withdraws the wait
		}
		if !errors.Is(err, client.ErrSessionExpired) && !errors.Is(err, client.ErrLeaseExpired) {
			return e.fail(err, "election "+name)
		}
		// The session ended while campaigning (cut off from the cluster):
		// the client opens a new one; campaign again, at the end of the queue.
		fmt.Fprintf(e.stderr, "lockctl: election %s: %s; campaigning again\n", safe(name), safe(lostCause(err)))
		select {
		case <-ctx.Done():
			return exitOK
		case <-time.After(time.Second):
		}
	}
	e.printLine(leaderLine{Lock: name, Value: value, ClientID: c.ClientID(), FencingToken: el.Token()}, lineValue(value))
	select {
	case <-ctx.Done():
	case <-el.Done():
		if ctx.Err() == nil {
			fmt.Fprintf(e.stderr, "lockctl: lost the leadership of %s (token %d): %s\n", safe(name), el.Token(), safe(lostCause(el.Err())))
			return exitLost
		}
	}
	rctx, cancel := e.ctx(context.Background(), 0)
	defer cancel()
	if err := el.Resign(rctx); err != nil {
		fmt.Fprintf(e.stderr, "lockctl: resigning %s: %s (ending the session releases it)\n", safe(name), safe(err.Error()))
		if cerr := c.Close(); cerr != nil {
			fmt.Fprintf(e.stderr, "lockctl: ending the session: %s (the leadership ends with the session TTL)\n", safe(cerr.Error()))
			return exitError
		}
	}
	return exitOK
}

// listen prints the current leader's value, then each new leader's,
// until a signal.
func (e *env) listen(ctx context.Context, el *client.Election) int {
	ch, err := el.Observe(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return exitOK
		}
		return e.fail(err, "election "+el.Name())
	}
	for li := range ch {
		e.printLine(leaderLine{Lock: el.Name(), Value: li.Value, ClientID: li.ClientID, FencingToken: li.Token}, leaderText(li.Value, li.ClientID))
	}
	return exitOK
}
