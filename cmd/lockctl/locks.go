package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/client"
)

// command prepares a command's flag set with a usage line.
func (e *env) command(name, synopsis string) *flag.FlagSet {
	fs := newFlagSet(name, e.stderr, e.g)
	fs.Usage = func() {
		fmt.Fprintf(e.stderr, "usage: lockctl %s\n", synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// parse parses a command line and checks the common flags.
func (e *env) parse(fs *flag.FlagSet, args []string, names ...string) ([]string, int, bool) {
	pos, err := parseExact(fs, args, names...)
	if err == nil {
		err = e.checkOutput()
	}
	if err != nil {
		return nil, usageErr(e.stderr, err), false
	}
	return pos, 0, true
}

// kindFlags are the lock-kind flags of acquire and run.
type kindFlags struct {
	shared    bool
	limit     int
	lockDelay time.Duration
	value     string
	valueSet  bool
}

func addKindFlags(fs *flag.FlagSet) *kindFlags {
	k := &kindFlags{}
	fs.BoolVar(&k.shared, "shared", false, "take a shared grant (readers of a read-write lock); default exclusive")
	fs.IntVar(&k.limit, "limit", 0, "semaphore size: up to N holders at once (1–10000; default: what the lock has, 1 for a new one)")
	fs.DurationVar(&k.lockDelay, "lock-delay", 0, "after the grant ends without a release (expiry, session end, revocation), grant the lock to no one for D (≤ 1m)")
	fs.Func("value", "the grant's value, shown in the lock's status (≤ 4096 bytes)", func(v string) error {
		k.value, k.valueSet = v, true
		return nil
	})
	return k
}

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

func (e *env) acquire(ctx context.Context, args []string) int {
	fs := e.command("acquire", "acquire NAME [NAME...] [--ttl 30s] [--wait 0s] [--shared] [--limit N] [--lock-delay D] [--value V]")
	ttl := fs.Duration("ttl", 30*time.Second, "lock TTL")
	wait := fs.Duration("wait", 0, "how long to wait for the lock (0: try once)")
	kf := addKindFlags(fs)
	pos, rest, err := parseArgs(fs, args, 0)
	var names []string
	if err == nil {
		err = e.checkOutput()
	}
	if err == nil {
		names, err = lockNames(append(pos, rest...))
	}
	if err == nil && len(names) == 0 {
		err = errors.New("acquire: missing NAME")
	}
	if err == nil {
		err = kf.check(len(names) > 1)
	}
	if err != nil {
		return usageErr(e.stderr, err)
	}
	r, code := e.prepare(ctx, names, *wait)
	if r == nil {
		return code
	}
	defer r.cancel()
	var value *string
	if kf.valueSet {
		value = &kf.value
	}
	var delay *int64
	if kf.lockDelay > 0 {
		delay = msPtr(kf.lockDelay)
	}
	var waitMs, ttlMs *int64 // absent: the server's defaults
	if *wait > 0 {
		waitMs = msPtr(*wait)
	}
	if *ttl > 0 {
		ttlMs = msPtr(*ttl)
	}
	what := "lock " + names[0]
	var rep *api.AcquireReply
	if len(names) == 1 {
		req := api.AcquireRequest{ClientID: e.clientID(), TTLms: ttlMs, WaitTimeoutMs: waitMs, Mode: kf.mode(), LockDelayMs: delay, Value: value}
		if kf.limit > 0 {
			n := int64(kf.limit)
			req.Limit = &n
		}
		rep, err = r.api.AcquireRequest(r.ctx, names[0], req)
	} else {
		what = "locks " + strings.Join(names, ",")
		rep, err = r.api.AcquireMany(r.ctx, api.MultiAcquireRequest{ClientID: e.clientID(), Locks: names, Mode: kf.mode(),
			TTLms: ttlMs, WaitTimeoutMs: waitMs, LockDelayMs: delay, Value: value})
	}
	if err != nil {
		e.nameHolder(r.api, names[0], &err)
		return e.fail(err, what)
	}
	if len(rep.Grants) == 0 {
		line := fmt.Sprintf("%s acquired token=%d expires_at=%s client_id=%s", names[0], rep.FencingToken, orDash(rep.ExpiresAt), orDash(rep.ClientID))
		if rep.Mode != "" {
			line += " mode=" + rep.Mode
		}
		e.print(rep, line)
		return exitOK
	}
	var b strings.Builder
	for _, g := range rep.Grants {
		fmt.Fprintf(&b, "%s acquired token=%d expires_at=%s client_id=%s mode=%s\n", g.Lock, g.FencingToken, orDash(g.ExpiresAt), orDash(rep.ClientID), orDash(g.Mode))
	}
	e.print(rep, b.String())
	return exitOK
}

func (e *env) revoke(ctx context.Context, args []string) int {
	fs := e.command("revoke", "revoke NAME [--token N]")
	token := fs.Uint64("token", 0, "revoke only the grant with this fencing token (default: every grant)")
	r, code := e.request(ctx, fs, args, "NAME")
	if r == nil {
		return code
	}
	defer r.cancel()
	name := r.pos[0]
	revoked, err := r.api.Revoke(r.ctx, name, *token)
	if err != nil {
		if errors.Is(err, client.ErrNotHolder) {
			fmt.Fprintf(e.stderr, "lockctl: lock %s: no current grant has token %d\n", name, *token)
			return exitNotHolder
		}
		return e.fail(err, "lock "+name)
	}
	text := name + " revoked nothing (no holder)"
	if len(revoked) > 0 {
		ts := make([]string, len(revoked))
		for i, t := range revoked {
			ts[i] = strconv.FormatUint(t, 10)
		}
		text = name + " revoked tokens=" + strings.Join(ts, ",")
	}
	e.print(api.RevokeReply{Revoked: revoked}, text)
	return exitOK
}

// tokenRequest parses a command that needs --token (release, renew).
func (e *env) tokenRequest(ctx context.Context, fs *flag.FlagSet, token *uint64, args []string) (*request, int) {
	pos, code, ok := e.parse(fs, args, "NAME")
	if !ok {
		return nil, code
	}
	if *token == 0 {
		return nil, usageErr(e.stderr, fmt.Errorf("%s: --token is required", fs.Name()))
	}
	return e.prepare(ctx, pos, 0)
}

func (e *env) release(ctx context.Context, args []string) int {
	fs := e.command("release", "release NAME --token N")
	token := fs.Uint64("token", 0, "fencing token of the grant (required)")
	r, code := e.tokenRequest(ctx, fs, token, args)
	if r == nil {
		return code
	}
	defer r.cancel()
	if err := r.api.Release(r.ctx, r.pos[0], e.clientID(), *token); err != nil {
		return e.fail(err, "lock "+r.pos[0])
	}
	e.print(api.ReleaseReply{Released: true}, r.pos[0]+" released")
	return exitOK
}

func (e *env) renew(ctx context.Context, args []string) int {
	fs := e.command("renew", "renew NAME --token N [--ttl 30s]")
	token := fs.Uint64("token", 0, "fencing token of the grant (required)")
	ttl := fs.Duration("ttl", 0, "new TTL (default: the lock's)")
	r, code := e.tokenRequest(ctx, fs, token, args)
	if r == nil {
		return code
	}
	defer r.cancel()
	rep, err := r.api.Renew(r.ctx, r.pos[0], e.clientID(), *token, *ttl)
	if err != nil {
		return e.fail(err, "lock "+r.pos[0])
	}
	e.print(rep, fmt.Sprintf("%s renewed expires_at=%s", r.pos[0], orDash(rep.ExpiresAt)))
	return exitOK
}

// textValue shows a value in a key=value line: as it is when it has no
// spaces, quotes or control characters, else quoted.
func textValue(v string) string {
	if v == "" {
		return "-"
	}
	if strings.ContainsFunc(v, func(r rune) bool { return r <= ' ' || r == '"' || r == '=' || r == 0x7f || !unicode.IsPrint(r) }) {
		return strconv.Quote(v)
	}
	return v
}

// statusLine is status's text: the lock on one line (the older fields
// name the holder with the lowest token), then one line per holder when
// several hold it.
func statusLine(st api.LockStatus) string {
	var b strings.Builder
	if !st.Held {
		fmt.Fprintf(&b, "%s free waiters=%d", st.Lock, st.Waiters)
		if st.Limit > 1 {
			fmt.Fprintf(&b, " limit=%d", st.Limit)
		}
	} else {
		fmt.Fprintf(&b, "%s held client_id=%s token=%d expires_at=%s session_id=%s waiters=%d mode=%s limit=%d holders=%d value=%s",
			st.Lock, st.ClientID, st.FencingToken, orDash(st.ExpiresAt), orDash(st.SessionID), st.Waiters,
			orDash(st.Mode), max(st.Limit, 1), max(len(st.Holders), 1), textValue(st.Value))
	}
	if st.DelayedUntil != "" {
		fmt.Fprintf(&b, " delayed_until=%s", st.DelayedUntil)
	}
	if len(st.Holders) > 1 {
		for _, h := range st.Holders {
			fmt.Fprintf(&b, "\n  holder client_id=%s token=%d mode=%s expires_at=%s value=%s", h.ClientID, h.FencingToken, orDash(h.Mode), orDash(h.ExpiresAt), textValue(h.Value))
		}
	}
	return b.String()
}

func (e *env) status(ctx context.Context, args []string) int {
	fs := e.command("status", "status NAME [--stale]")
	stale := fs.Bool("stale", false, "let any member answer from its local state")
	r, code := e.request(ctx, fs, args, "NAME")
	if r == nil {
		return code
	}
	defer r.cancel()
	st, err := r.api.Status(r.ctx, r.pos[0], *stale)
	if err != nil {
		return e.fail(err, "lock "+r.pos[0])
	}
	e.print(st, statusLine(*st))
	return exitOK
}

// listPage is the most locks lockctl asks for in one request: the
// server's default page.
const listPage = 1000

func (e *env) list(ctx context.Context, args []string) int {
	fs := e.command("list", "list [--prefix P] [--limit N] [--after NAME]")
	prefix := fs.String("prefix", "", "only locks whose name starts with P")
	limit := fs.Int("limit", 0, "print at most N locks (0: all of them)")
	after := fs.String("after", "", "start after the lock NAME (the next of a list cut by --limit)")
	pos, code, ok := e.parse(fs, args)
	if !ok {
		return code
	}
	if *limit < 0 {
		return usageErr(e.stderr, fmt.Errorf("list: --limit %d: want 0 (all) or more", *limit))
	}
	r, code := e.prepare(ctx, pos, 0)
	if r == nil {
		return code
	}
	defer r.cancel()
	// Page through the server's pages until the last, or until --limit.
	locks := []api.LockStatus{}
	next := *after
	for {
		size := listPage
		if *limit > 0 {
			size = min(size, *limit-len(locks))
		}
		page, err := r.api.ListPage(r.ctx, *prefix, next, size)
		if err != nil {
			return e.fail(err, "list")
		}
		locks = append(locks, page.Locks...)
		next = page.Next
		if next == "" || (*limit > 0 && len(locks) >= *limit) {
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
				hs[i], ts[i] = h.ClientID, strconv.FormatUint(h.FencingToken, 10)
			}
			holder, token = strings.Join(hs, ","), strings.Join(ts, ",")
		} else if l.Held {
			holder, token = l.ClientID, fmt.Sprint(l.FencingToken)
		}
		mode := l.Mode
		if mode == "" {
			mode = api.ModeNone
			if l.Held {
				mode = api.ModeExclusive // a server that does not say
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%d\t%s\t%s\n", l.Lock, mode, max(l.Limit, 1), holder, token, orDash(l.ExpiresAt), l.Waiters, textValue(l.Value), orDash(l.DelayedUntil))
	}
	tw.Flush()
	e.print(api.LockList{Locks: locks, Next: next}, b.String())
	if next != "" && !e.jsonOut() {
		fmt.Fprintf(e.stderr, "lockctl: list: more locks follow; go on with --after %s\n", next)
	}
	return exitOK
}

// request is a parsed subcommand ready to call the API.
type request struct {
	pos    []string
	api    *client.API
	ctx    context.Context
	cancel context.CancelFunc
}

// request parses a subcommand's flags and prepares the call.
func (e *env) request(ctx context.Context, fs *flag.FlagSet, args []string, names ...string) (*request, int) {
	pos, code, ok := e.parse(fs, args, names...)
	if !ok {
		return nil, code
	}
	return e.prepare(ctx, pos, 0)
}

// prepare builds the API client (only after the subcommand's flags are
// parsed: global flags such as --endpoints may follow the subcommand) and
// the request's context, which allows extra time beyond --timeout (a wait).
// A nil request means: exit with the code.
func (e *env) prepare(ctx context.Context, pos []string, extra time.Duration) (*request, int) {
	a, err := e.api()
	if err != nil {
		return nil, e.setupFailed(err)
	}
	rctx, cancel := e.ctx(ctx, extra)
	return &request{pos: pos, api: a, ctx: rctx, cancel: cancel}, 0
}

func (e *env) session(ctx context.Context, args []string) int {
	if len(args) == 0 {
		return usageErr(e.stderr, fmt.Errorf("session: want create, keepalive ID or delete ID"))
	}
	switch sub, args := args[0], args[1:]; sub {
	case "create":
		fs := e.command("session create", "session create [--ttl 15s]")
		ttl := fs.Duration("ttl", 15*time.Second, "session TTL")
		r, code := e.request(ctx, fs, args)
		if r == nil {
			return code
		}
		defer r.cancel()
		rep, err := r.api.CreateSession(r.ctx, e.clientID(), *ttl)
		if err != nil {
			return e.fail(err, "session create")
		}
		e.print(rep, fmt.Sprintf("session_id=%s ttl_ms=%d", rep.SessionID, rep.TTLms))
	case "keepalive":
		r, code := e.request(ctx, e.command("session keepalive", "session keepalive ID"), args, "ID")
		if r == nil {
			return code
		}
		defer r.cancel()
		rep, err := r.api.KeepAlive(r.ctx, r.pos[0])
		if err != nil {
			return e.fail(err, "session "+r.pos[0])
		}
		e.print(rep, fmt.Sprintf("session_id=%s ttl_ms=%d", r.pos[0], rep.TTLms))
	case "delete":
		r, code := e.request(ctx, e.command("session delete", "session delete ID"), args, "ID")
		if r == nil {
			return code
		}
		defer r.cancel()
		if err := r.api.DeleteSession(r.ctx, r.pos[0]); err != nil {
			return e.fail(err, "session "+r.pos[0])
		}
		e.print(map[string]any{"deleted": true, "session_id": r.pos[0]}, "session "+r.pos[0]+" deleted")
	default:
		return usageErr(e.stderr, fmt.Errorf("session: unknown subcommand %q (want create, keepalive or delete)", sub))
	}
	return exitOK
}

func (e *env) cluster(ctx context.Context, args []string) int {
	if len(args) == 0 {
		return usageErr(e.stderr, fmt.Errorf("cluster: want status, add, remove or transfer"))
	}
	switch sub, args := args[0], args[1:]; sub {
	case "status":
		r, code := e.request(ctx, e.command("cluster status", "cluster status"), args)
		if r == nil {
			return code
		}
		defer r.cancel()
		st, err := r.api.Cluster(r.ctx)
		if err != nil {
			return e.fail(err, "cluster status")
		}
		var b strings.Builder
		fmt.Fprintf(&b, "leader %s %s term %d\n", orDash(st.LeaderID), orDash(st.LeaderHTTP), st.Term)
		tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tRAFT\tHTTP\tVOTER\tLEADER")
		for _, m := range st.Members {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%v\t%v\n", m.ID, m.RaftAddr, m.HTTPAddr, m.Voter, m.ID == st.LeaderID)
		}
		tw.Flush()
		e.print(st, b.String())
	case "add":
		r, code := e.request(ctx, e.command("cluster add", "cluster add ID RAFTADDR HTTPADDR"), args, "ID", "RAFTADDR", "HTTPADDR")
		if r == nil {
			return code
		}
		defer r.cancel()
		m := api.AddMemberRequest{ID: r.pos[0], RaftAddr: r.pos[1], HTTPAddr: r.pos[2]}
		if err := r.api.AddMember(r.ctx, m); err != nil {
			return e.fail(err, "cluster add "+r.pos[0])
		}
		e.print(m, "member "+r.pos[0]+" added")
	case "remove":
		r, code := e.request(ctx, e.command("cluster remove", "cluster remove ID"), args, "ID")
		if r == nil {
			return code
		}
		defer r.cancel()
		if err := r.api.RemoveMember(r.ctx, r.pos[0]); err != nil {
			return e.fail(err, "cluster remove "+r.pos[0])
		}
		e.print(map[string]any{"removed": r.pos[0]}, "member "+r.pos[0]+" removed")
	case "transfer":
		fs := e.command("cluster transfer", "cluster transfer [--to ID]")
		to := fs.String("to", "", "member to hand the leadership to (default: the cluster picks)")
		r, code := e.request(ctx, fs, args)
		if r == nil {
			return code
		}
		defer r.cancel()
		if err := r.api.TransferLeadership(r.ctx, *to); err != nil {
			return e.fail(err, "cluster transfer")
		}
		e.print(api.TransferRequest{To: *to}, "leadership transfer requested")
	default:
		return usageErr(e.stderr, fmt.Errorf("cluster: unknown subcommand %q (want status, add, remove or transfer)", sub))
	}
	return exitOK
}
