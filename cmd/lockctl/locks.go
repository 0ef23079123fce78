package main

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

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

func (e *env) acquire(ctx context.Context, args []string) int {
	fs := e.command("acquire", "acquire NAME [--ttl 30s] [--wait 0s]")
	ttl := fs.Duration("ttl", 30*time.Second, "lock TTL")
	wait := fs.Duration("wait", 0, "how long to wait for the lock (0: try once)")
	pos, code, ok := e.parse(fs, args, "NAME")
	if !ok {
		return code
	}
	r, code := e.prepare(ctx, pos, *wait)
	if r == nil {
		return code
	}
	defer r.cancel()
	name := pos[0]
	rep, err := r.api.Acquire(r.ctx, name, e.clientID(), *ttl, *wait)
	if err != nil {
		e.nameHolder(r.api, name, &err)
		return e.fail(err, "lock "+name)
	}
	e.print(rep, fmt.Sprintf("%s acquired token=%d expires_at=%s client_id=%s", name, rep.FencingToken, orDash(rep.ExpiresAt), orDash(rep.ClientID)))
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

func statusLine(st api.LockStatus) string {
	if !st.Held {
		return fmt.Sprintf("%s free waiters=%d", st.Lock, st.Waiters)
	}
	return fmt.Sprintf("%s held client_id=%s token=%d expires_at=%s session_id=%s waiters=%d",
		st.Lock, st.ClientID, st.FencingToken, orDash(st.ExpiresAt), orDash(st.SessionID), st.Waiters)
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
	fmt.Fprintln(tw, "LOCK\tHOLDER\tTOKEN\tEXPIRES\tWAITERS")
	for _, l := range locks {
		holder, token := "-", "-"
		if l.Held {
			holder, token = l.ClientID, fmt.Sprint(l.FencingToken)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\n", l.Lock, holder, token, orDash(l.ExpiresAt), l.Waiters)
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
