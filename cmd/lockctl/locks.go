package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/client"
)

// kindFlags are the lock-kind flags of acquire and run.
type kindFlags struct {
	shared    bool
	limit     int
	lockDelay time.Duration
	value     string
	valueSet  bool
}

func addKindFlags(fs *pflag.FlagSet) *kindFlags {
	k := &kindFlags{}
	fs.BoolVar(&k.shared, "shared", false, "take a shared grant: shared holders coexist, never with an exclusive one (a read-write lock); default exclusive")
	fs.IntVar(&k.limit, "limit", 0, "a semaphore: up to `N` holders at once, each with its own token (1–10000; set by the acquire that creates the lock; another N while the lock is in use is refused: limit mismatch, exit 1; default: what the lock has, 1 for a new one)")
	durationVar(fs, &k.lockDelay, "lock-delay", 0, "when the grant ends without a release (expiry, session end, revocation), nobody gets the lock for `D` (up to 1m)")
	fs.Var(&stringSet{p: &k.value, set: &k.valueSet}, "value", "the grant's value `V`, shown by status and list (up to 4096 bytes)")
	return k
}

// stringSet is a string flag that records whether it was given (an empty
// --value is a value).
type stringSet struct {
	p   *string
	set *bool
}

func (s *stringSet) Set(v string) error { *s.p, *s.set = v, true; return nil }
func (s *stringSet) String() string {
	if s.p == nil {
		return ""
	}
	return *s.p
}
func (s *stringSet) Type() string { return "string" }

// check reports a flag out of range (a usage error) before anything is
// sent; multi says several names were given.
func (k *kindFlags) check(multi bool) error {
	switch {
	case k.limit < 0 || k.limit > api.MaxLimit:
		return fmt.Errorf("--limit %d: want 1 to %d", k.limit, api.MaxLimit)
	case k.shared && k.limit > 1:
		return fmt.Errorf("--shared and --limit %d: a shared lock has no limit above 1", k.limit)
	case multi && k.limit > 1:
		return fmt.Errorf("--limit %d: several names (a multi-lock) take limit-1 locks only", k.limit)
	case k.lockDelay < 0 || k.lockDelay > api.MaxLockDelayMs*time.Millisecond:
		return fmt.Errorf("--lock-delay %v: want 0 to 1m", k.lockDelay)
	case k.valueSet && (len(k.value) > api.MaxValueBytes || !utf8.ValidString(k.value)):
		return fmt.Errorf("--value: want valid UTF-8 of at most %d bytes (got %d bytes)", api.MaxValueBytes, len(k.value))
	}
	return nil
}

func (k *kindFlags) mode() string {
	if k.shared {
		return api.ModeShared
	}
	return ""
}

// options are the client's acquire options for the flags.
func (k *kindFlags) options() []client.AcquireOption {
	var opts []client.AcquireOption
	if k.shared {
		opts = append(opts, client.WithShared())
	}
	if k.limit > 0 {
		opts = append(opts, client.WithLimit(k.limit))
	}
	if k.lockDelay > 0 {
		opts = append(opts, client.WithLockDelay(k.lockDelay))
	}
	if k.valueSet {
		opts = append(opts, client.WithValue(k.value))
	}
	return opts
}

// lockNames splits the NAME arguments: each may hold several names
// separated by commas (lock names have none).
func lockNames(args []string) ([]string, error) {
	var names []string
	seen := map[string]bool{}
	for _, a := range args {
		for _, n := range strings.Split(a, ",") {
			if n == "" {
				return nil, fmt.Errorf("empty lock name in %q", a)
			}
			if seen[n] {
				return nil, fmt.Errorf("lock %q named twice", n)
			}
			seen[n] = true
			names = append(names, n)
		}
	}
	if len(names) > api.MaxMultiLocks {
		return nil, fmt.Errorf("%d names: a multi-lock takes at most %d", len(names), api.MaxMultiLocks)
	}
	return names, nil
}

func msPtr(d time.Duration) *int64 {
	v := d.Milliseconds()
	return &v
}

func (e *env) acquireCmd() *cobra.Command {
	var ttl, wait time.Duration
	var kf *kindFlags
	c := &cobra.Command{
		Use:   "acquire NAME [NAME...] [--ttl 30s] [--wait 0s] [--shared] [--limit N] [--lock-delay D] [--value V]",
		Short: "take locks without a session; print the token and the expiry",
		Long: `Take a lock without a session, held by --client-id (default user@host) until
its TTL runs out or it is released (lockctl release NAME --token N); print
its fencing token and expiry. With --wait, wait up to that long for it.

A wait rides through a failover: a dropped connection, no_leader or
overloaded is retried on the member that leads then (the acquire keeps its
place), with a line on stderr saying what lockctl waits for. Given up — at
--timeout + --wait, or on SIGINT/SIGTERM (exit 128+N) — the wait is
withdrawn before lockctl exits (and a grant that came just then is
released). A killed lockctl cannot withdraw it: for a lock that must not
outlive its process, use lockctl run.

Several names (NAME NAME, or NAME,NAME) are a multi-lock: every lock in one
step, or none; a refusal names the lock that blocked it. Each lock is then
released and renewed on its own.

Lock kinds: --shared (a read-write lock's readers), --limit N (a
semaphore), --lock-delay D, --value V; see the flags.`,
		Example: `  lockctl acquire jobs/nightly --ttl 30s --wait 5s --client-id me
  lockctl acquire catalog --shared --client-id reader-1
  lockctl acquire accounts/alice accounts/bob --wait 5s`,
		Args: func(c *cobra.Command, args []string) error {
			if len(args) == 0 {
				return errors.New("acquire: missing NAME")
			}
			return nil
		},
		RunE: func(c *cobra.Command, args []string) error {
			names, err := lockNames(args)
			if err == nil {
				err = kf.check(len(names) > 1)
			}
			if err != nil {
				return err
			}
			return status(e.acquire(c.Context(), names, ttl, wait, kf))
		},
	}
	durationVar(c.Flags(), &ttl, "ttl", 30*time.Second, "lock TTL")
	durationVar(c.Flags(), &wait, "wait", 0, "how long to wait for the lock (0: try once)")
	kf = addKindFlags(c.Flags())
	return c
}

func (e *env) acquire(ctx context.Context, names []string, ttl, wait time.Duration, kf *kindFlags) int {
	what := "lock " + names[0]
	if len(names) > 1 {
		what = "locks " + strings.Join(names, ",")
	}
	// A signal ends the wait: lockctl withdraws it on the way out, so the
	// lock is not granted later to a lockctl that is gone.
	ctx, sig, stop := withSignals(ctx)
	defer stop()
	r, code := e.prepareFor(ctx, wait, what)
	if r == nil {
		return code
	}
	defer r.cancel()
	var err error
	var value *string
	if kf.valueSet {
		value = &kf.value
	}
	var delay *int64
	if kf.lockDelay > 0 {
		delay = msPtr(kf.lockDelay)
	}
	var waitMs, ttlMs *int64 // absent: the server's defaults
	if wait > 0 {
		waitMs = msPtr(wait)
	}
	if ttl > 0 {
		ttlMs = msPtr(ttl)
	}
	var rep *api.AcquireReply
	if len(names) == 1 {
		req := api.AcquireRequest{ClientID: e.clientID(), TTLms: ttlMs, WaitTimeoutMs: waitMs, Mode: kf.mode(), LockDelayMs: delay, Value: value}
		if kf.limit > 0 {
			n := int64(kf.limit)
			req.Limit = &n
		}
		rep, err = r.api.AcquireRequest(r.ctx, names[0], req)
	} else {
		rep, err = r.api.AcquireMany(r.ctx, api.MultiAcquireRequest{ClientID: e.clientID(), Locks: names, Mode: kf.mode(),
			TTLms: ttlMs, WaitTimeoutMs: waitMs, LockDelayMs: delay, Value: value})
	}
	if err != nil {
		if errors.Is(err, client.ErrUnknownOutcome) {
			// The cancel found no wait: the lock may have been granted as
			// lockctl gave up. Nobody would know its token: give it back.
			e.releaseRaced(r.api, names)
		}
		if s := sig(); s != nil {
			e.note("%s: interrupted by %s; %s", what, sigName(s), withdrawnWords(err, wait > 0))
			return 128 + int(s.(syscall.Signal))
		}
		e.nameHolder(r.api, names[0], &err)
		code := e.fail(err, what)
		if wait > 0 && r.ctx.Err() != nil {
			e.note("%s: gave up waiting; %s", what, withdrawnWords(err, true))
		}
		return code
	}
	if len(rep.Grants) == 0 {
		line := fmt.Sprintf("%s acquired token=%d expires_at=%s client_id=%s", textValue(names[0]), rep.FencingToken, textValue(rep.ExpiresAt), textValue(rep.ClientID))
		if rep.Mode != "" {
			line += " mode=" + textValue(rep.Mode)
		}
		e.print(rep, line)
		return exitOK
	}
	var b strings.Builder
	for _, g := range rep.Grants {
		fmt.Fprintf(&b, "%s acquired token=%d expires_at=%s client_id=%s mode=%s\n", textValue(g.Lock), g.FencingToken, textValue(g.ExpiresAt), textValue(rep.ClientID), textValue(g.Mode))
	}
	e.print(rep, b.String())
	return exitOK
}

// sigName is a signal as a person types it: SIGTERM, not "terminated".
func sigName(s os.Signal) string {
	switch s {
	case syscall.SIGINT:
		return "SIGINT"
	case syscall.SIGTERM:
		return "SIGTERM"
	case syscall.SIGHUP:
		return "SIGHUP"
	case syscall.SIGQUIT:
		return "SIGQUIT"
	}
	return s.String()
}

// withdrawnWords says what became of a wait given up by a signal (the
// API withdrew it; see client.API.AcquireRequest).
func withdrawnWords(err error, waited bool) string {
	switch {
	case errors.Is(err, client.ErrUnknownOutcome):
		return err.Error() // what the withdrawal found
	case waited:
		return "the wait was withdrawn"
	}
	return "nothing was waiting"
}

// releaseRaced releases the grants this client holds on names: an acquire
// whose wait lockctl gave up found, on its way out, nothing left to
// withdraw, so it may have been granted at the last moment.
func (e *env) releaseRaced(a *client.API, names []string) {
	ctx, cancel := context.WithTimeout(context.Background(), client.WithdrawTimeout)
	defer cancel()
	id := e.clientID()
	for _, name := range names {
		st, err := a.Status(ctx, name, false)
		if err != nil {
			e.note("lock %s: could not check for a grant made as lockctl gave up: %v (it ends with its TTL)", name, err)
			continue
		}
		hs := holdersOf(st)
		for after := ""; st.HoldersTotal > len(hs) || after != ""; {
			// A status lists the 64 lowest tokens: page through every
			// holder of a bigger semaphore.
			page, err := a.Holders(ctx, name, after, 10000)
			if err != nil {
				e.note("lock %s: could not check for a grant made as lockctl gave up: %v (it ends with its TTL)", name, err)
				break
			}
			if after == "" {
				hs = nil
			}
			hs = append(hs, page.Holders...)
			if after = page.Next; after == "" {
				break
			}
		}
		for _, h := range hs {
			if h.ClientID != id {
				continue
			}
			if err := a.Release(ctx, name, id, h.FencingToken); err != nil {
				e.note("lock %s: granted (token %d) as lockctl gave up; releasing it failed: %v (it ends with its TTL)", name, h.FencingToken, err)
			} else {
				e.note("lock %s: granted (token %d) as lockctl gave up; released it", name, h.FencingToken)
			}
		}
	}
}

// holdersOf lists a status's holders (the older fields for a server that
// sends no list).
func holdersOf(st *api.LockStatus) []api.HolderStatus {
	if len(st.Holders) > 0 || !st.Held {
		return st.Holders
	}
	return []api.HolderStatus{{ClientID: st.ClientID, FencingToken: st.FencingToken, ExpiresAt: st.ExpiresAt, Mode: st.Mode}}
}

// withSignals returns ctx ended by SIGINT or SIGTERM, and which one came.
func withSignals(parent context.Context) (ctx context.Context, sig func() os.Signal, stop func()) {
	ctx, cancel := context.WithCancel(parent)
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, stopSignals...)
	var mu sync.Mutex
	var got os.Signal
	done := make(chan struct{})
	go func() {
		select {
		case s := <-ch:
			mu.Lock()
			got = s
			mu.Unlock()
			cancel()
		case <-done:
		}
	}()
	return ctx, func() os.Signal {
			mu.Lock()
			defer mu.Unlock()
			return got
		}, func() {
			signal.Stop(ch)
			close(done)
			cancel()
		}
}

func (e *env) revokeCmd() *cobra.Command {
	var token uint64
	c := &cobra.Command{
		Use:   "revoke NAME [--token N]",
		Short: "end a lock's grants, whoever holds them (admin token); print the tokens revoked",
		Long: `End the lock's grants, whoever holds them (an admin token when the cluster
runs with --auth-file): every grant, or only the one with token N. Holders
are told (lost, revoked), the lock-delay applies, waiters go on. Prints the
tokens revoked (-o json: {"revoked":[...]}); a token no grant has exits 5.`,
		Args: positional("NAME"),
		RunE: func(c *cobra.Command, args []string) error {
			return status(e.revoke(c.Context(), args[0], token))
		},
	}
	c.Flags().Uint64Var(&token, "token", 0, "revoke only the grant with this fencing token `N` (default: every grant)")
	return c
}

func (e *env) revoke(ctx context.Context, name string, token uint64) int {
	r, code := e.prepare(ctx, 0)
	if r == nil {
		return code
	}
	defer r.cancel()
	revoked, err := r.api.Revoke(r.ctx, name, token)
	if err != nil {
		if errors.Is(err, client.ErrNotHolder) {
			fmt.Fprintf(e.stderr, "lockctl: lock %s: no current grant has token %d\n", safe(name), token)
			return exitNotHolder
		}
		return e.fail(err, "lock "+name)
	}
	text := textValue(name) + " revoked nothing (no holder)"
	if len(revoked) > 0 {
		ts := make([]string, len(revoked))
		for i, t := range revoked {
			ts[i] = strconv.FormatUint(t, 10)
		}
		text = textValue(name) + " revoked tokens=" + strings.Join(ts, ",")
	}
	e.print(api.RevokeReply{Revoked: revoked}, text)
	return exitOK
}

// tokenFlag adds --token, which release and renew need.
func tokenFlag(c *cobra.Command, token *uint64) {
	c.Flags().Uint64Var(token, "token", 0, "fencing token `N` of the grant (required)")
	prev := c.Args
	c.Args = func(c *cobra.Command, args []string) error {
		if err := prev(c, args); err != nil {
			return err
		}
		if *token == 0 {
			return fmt.Errorf("%s: --token is required", c.Name())
		}
		return nil
	}
}

func (e *env) releaseCmd() *cobra.Command {
	var token uint64
	c := &cobra.Command{
		Use:   "release NAME --token N",
		Short: "release a lock held by --client-id",
		Long: `Release a lock held by --client-id with fencing token N. The default
client ID, user@host, is acquire's too; pass the --client-id acquire was
given. Exits 5 when that client does not hold the lock with that token, and
says who does.`,
		Example: "  lockctl release jobs/nightly --token 42",
		Args:    positional("NAME"),
		RunE: func(c *cobra.Command, args []string) error {
			return status(e.release(c.Context(), args[0], token))
		},
	}
	tokenFlag(c, &token)
	return c
}

func (e *env) release(ctx context.Context, name string, token uint64) int {
	r, code := e.prepare(ctx, 0)
	if r == nil {
		return code
	}
	defer r.cancel()
	if err := r.api.Release(r.ctx, name, e.clientID(), token); err != nil {
		return e.failNotHolder(r.api, err, name, token)
	}
	e.print(api.ReleaseReply{Released: true}, textValue(name)+" released")
	return exitOK
}

func (e *env) renewCmd() *cobra.Command {
	var token uint64
	var ttl time.Duration
	c := &cobra.Command{
		Use:   "renew NAME --token N [--ttl 30s]",
		Short: "extend a lock's TTL",
		Long: `Extend the TTL of a lock held by --client-id with fencing token N (the same
--client-id as acquire's). Exits 5 when the lock was lost meanwhile.`,
		Args: positional("NAME"),
		RunE: func(c *cobra.Command, args []string) error {
			return status(e.renew(c.Context(), args[0], token, ttl))
		},
	}
	tokenFlag(c, &token)
	durationVar(c.Flags(), &ttl, "ttl", 0, "new TTL (default: the lock's)")
	return c
}

func (e *env) renew(ctx context.Context, name string, token uint64, ttl time.Duration) int {
	r, code := e.prepare(ctx, 0)
	if r == nil {
		return code
	}
	defer r.cancel()
	rep, err := r.api.Renew(r.ctx, name, e.clientID(), token, ttl)
	if err != nil {
		return e.failNotHolder(r.api, err, name, token)
	}
	e.print(rep, fmt.Sprintf("%s renewed expires_at=%s", textValue(name), textValue(rep.ExpiresAt)))
	return exitOK
}

// statusLine is status's text: the lock on one line (the older fields
// name the holder with the lowest token), then one line per holder when
// several hold it.
func statusLine(st api.LockStatus) string {
	var b strings.Builder
	if !st.Held {
		fmt.Fprintf(&b, "%s free waiters=%d", textValue(st.Lock), st.Waiters)
		if st.Limit > 1 {
			fmt.Fprintf(&b, " limit=%d", st.Limit)
		}
	} else {
		fmt.Fprintf(&b, "%s held client_id=%s token=%d expires_at=%s session_id=%s waiters=%d mode=%s limit=%d holders=%d value=%s",
			textValue(st.Lock), textValue(st.ClientID), st.FencingToken, textValue(st.ExpiresAt), textValue(st.SessionID), st.Waiters,
			textValue(st.Mode), max(st.Limit, 1), max(st.HoldersTotal, len(st.Holders), 1), textValue(st.Value))
	}
	if st.DelayedUntil != "" {
		fmt.Fprintf(&b, " delayed_until=%s", textValue(st.DelayedUntil))
	}
	if len(st.Holders) > 1 {
		for _, h := range st.Holders {
			fmt.Fprintf(&b, "\n  holder client_id=%s token=%d mode=%s expires_at=%s value=%s", textValue(h.ClientID), h.FencingToken, textValue(h.Mode), textValue(h.ExpiresAt), textValue(h.Value))
		}
	}
	return b.String()
}

func (e *env) statusCmd() *cobra.Command {
	var stale bool
	c := &cobra.Command{
		Use:   "status NAME [--stale]",
		Short: "show who holds a lock: mode, limit, holders, value, waiters, delayed_until",
		Long: `Show a lock: held or free, the holder (the one with the lowest token), mode
(exclusive, shared), limit, holders (one line each when several), value,
waiters, and delayed_until while a lock-delay runs. -o json prints the
server's object as it is.

The read is linearizable: the leader answers. With --stale any member
answers from its own state, which may lag the leader's; the line then ends
in "(stale, from n2)", naming the member that answered (JSON: "stale": true).`,
		Args: positional("NAME"),
		RunE: func(c *cobra.Command, args []string) error {
			return status(e.status(c.Context(), args[0], stale))
		},
	}
	c.Flags().BoolVar(&stale, "stale", false, "let any member answer from its local state (no leader needed; may lag)")
	return c
}

func (e *env) status(ctx context.Context, name string, stale bool) int {
	r, code := e.prepare(ctx, 0)
	if r == nil {
		return code
	}
	defer r.cancel()
	if !stale {
		st, err := r.api.Status(r.ctx, name, false)
		if err != nil {
			return e.fail(err, "lock "+name)
		}
		e.print(st, statusLine(*st))
		return exitOK
	}
	st, member, err := r.api.StaleStatus(r.ctx, name)
	if err != nil {
		return e.fail(err, "lock "+name)
	}
	text := statusLine(*st)
	if st.Stale {
		// Name the member by its id when it says (GET /api/v1/status),
		// else by its URL.
		from := member
		if ns, err := r.api.MemberStatus(r.ctx, member); err == nil && ns.ID != "" {
			from = ns.ID
		}
		first, rest, _ := strings.Cut(text, "\n")
		text = first + " (stale, from " + textValue(from) + ")"
		if rest != "" {
			text += "\n" + rest
		}
	}
	e.print(st, text)
	return exitOK
}

// listPage is the most locks lockctl asks for in one request: the
// server's default page.
const listPage = 1000

func (e *env) listCmd() *cobra.Command {
	var prefix, after string
	var limit int
	c := &cobra.Command{
		Use:   "list [--prefix P] [--limit N] [--after NAME]",
		Short: "list held, awaited or delayed locks in name order",
		Long: `List the locks that are held, awaited or delayed, in name order, with mode,
limit, holders (every one, by token), expiry, waiters, value and
delayed_until: all of them (read page after page: a long list is not one
snapshot), or at most N, and then the --after NAME that goes on is printed
on stderr (-o json: the reply's "next"). A token needs read access on the
prefix (the empty prefix without --prefix).`,
		Args: positional(),
		RunE: func(c *cobra.Command, args []string) error {
			if limit < 0 {
				return fmt.Errorf("list: --limit %d: want 0 (all) or more", limit)
			}
			return status(e.list(c.Context(), prefix, limit, after))
		},
	}
	c.Flags().StringVar(&prefix, "prefix", "", "only locks whose name starts with `P`")
	c.Flags().IntVar(&limit, "limit", 0, "print at most `N` locks (0: all of them)")
	c.Flags().StringVar(&after, "after", "", "start after the lock `NAME` (the next of a list cut by --limit)")
	return c
}

func (e *env) list(ctx context.Context, prefix string, limit int, after string) int {
	r, code := e.prepare(ctx, 0)
	if r == nil {
		return code
	}
	defer r.cancel()
	// Page through the server's pages until the last, or until --limit.
	locks := []api.LockStatus{}
	next := after
	for {
		size := listPage
		if limit > 0 {
			size = min(size, limit-len(locks))
		}
		page, err := r.api.ListPage(r.ctx, prefix, next, size)
		if err != nil {
			return e.fail(err, "list")
		}
		locks = append(locks, page.Locks...)
		next = page.Next
		if next == "" || (limit > 0 && len(locks) >= limit) {
			break
		}
	}
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "LOCK\tMODE\tLIMIT\tHOLDER\tTOKEN\tEXPIRES\tWAITERS\tVALUE\tDELAYED_UNTIL")
	for _, l := range locks {
		holder, token := "-", "-"
		if len(l.Holders) > 0 {
			// Several holders (shared, semaphore): all of them, by token.
			hs, ts := make([]string, len(l.Holders)), make([]string, len(l.Holders))
			for i, h := range l.Holders {
				hs[i], ts[i] = textValue(h.ClientID), strconv.FormatUint(h.FencingToken, 10)
			}
			holder, token = strings.Join(hs, ","), strings.Join(ts, ",")
		} else if l.Held {
			holder, token = textValue(l.ClientID), fmt.Sprint(l.FencingToken)
		}
		mode := l.Mode
		if mode == "" {
			mode = api.ModeNone
			if l.Held {
				mode = api.ModeExclusive // a server that does not say
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%d\t%s\t%s\n", textValue(l.Lock), textValue(mode), max(l.Limit, 1), holder, token, textValue(l.ExpiresAt), l.Waiters, textValue(l.Value), textValue(l.DelayedUntil))
	}
	tw.Flush()
	e.print(api.LockList{Locks: locks, Next: next}, b.String())
	if next != "" && !e.jsonOut() {
		fmt.Fprintf(e.stderr, "lockctl: list: more locks follow; go on with --after %s\n", textValue(next))
	}
	return exitOK
}

// failNotHolder is fail for release and renew: a not_holder refusal says
// who holds the lock instead, and which --client-id to pass.
func (e *env) failNotHolder(a *client.API, err error, name string, token uint64) int {
	if !errors.Is(err, client.ErrNotHolder) {
		return e.fail(err, "lock "+name)
	}
	id := e.clientID()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	why := ""
	if st, serr := a.Status(ctx, name, false); serr == nil {
		var hs []string
		for _, h := range holdersOf(st) {
			if h.ClientID == id && h.FencingToken != token {
				hs = append(hs, fmt.Sprintf("by this client with token %d, not %d", h.FencingToken, token))
			} else {
				hs = append(hs, fmt.Sprintf("by client %s (token %d)", textValue(h.ClientID), h.FencingToken))
			}
		}
		if len(hs) == 0 {
			why = "; it is free (released, or its TTL ran out)"
		} else {
			why = "; it is held " + strings.Join(hs, ", ")
		}
	}
	e.note("lock %s: not the holder: client %s does not hold it with token %d%s. Pass the --client-id the lock was acquired with (the default, %s, is yours on this host).",
		name, textValue(id), token, why, textValue(userAtHost()))
	return exitNotHolder
}

// request is a command ready to call the API.
type request struct {
	api    *client.API
	ctx    context.Context
	cancel context.CancelFunc
}

// prepare builds the API client (only after the subcommand's flags are
// parsed: global flags such as --endpoints may follow the subcommand) and
// the request's context, which allows extra time beyond --timeout (a wait).
// A nil request means: exit with the code.
func (e *env) prepare(ctx context.Context, extra time.Duration) (*request, int) {
	return e.prepareFor(ctx, extra, "")
}

// prepareFor is prepare for a command that says on stderr what it waits
// for while no leader answers (what names its object).
func (e *env) prepareFor(ctx context.Context, extra time.Duration, what string) (*request, int) {
	a, err := e.apiFor(what)
	if err != nil {
		return nil, e.setupFailed(err)
	}
	rctx, cancel := e.ctx(ctx, extra)
	return &request{api: a, ctx: rctx, cancel: cancel}, 0
}
