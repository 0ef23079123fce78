package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/client"
)

func (e *env) sessionCmd() *cobra.Command {
	c := group(&cobra.Command{
		Use:   "session",
		Short: "open, keep alive and end HTTP sessions",
		Long: `HTTP sessions: a lock acquired with a session id is held until released,
until its own TTL (if any) runs out, or until the session expires (no
keepalive for its TTL) or is deleted — whichever is first. lockctl run and
elect open their own sessions; these commands are for scripts that manage
one by hand.`,
	}, "create, keepalive ID or delete ID")
	var ttl time.Duration
	create := &cobra.Command{
		Use:   "create [--ttl 15s]",
		Short: "open an HTTP session; print its id",
		Args:  positional(),
		RunE: func(c *cobra.Command, _ []string) error {
			return e.withRequest(c, func(r *request) error {
				rep, err := r.api.CreateSession(r.ctx, e.clientID(), ttl)
				if err != nil {
					return status(e.fail(err, "session create"))
				}
				e.print(rep, fmt.Sprintf("session_id=%s ttl_ms=%d", textValue(rep.SessionID), rep.TTLms))
				return nil
			})
		},
	}
	durationVar(create.Flags(), &ttl, "ttl", 15*time.Second, "session TTL")
	keepalive := &cobra.Command{
		Use:   "keepalive ID",
		Short: "refresh a session",
		Long:  "Refresh a session: its TTL starts again. Exits 5 when it expired or does not exist.",
		Args:  positional("ID"),
		RunE: func(c *cobra.Command, args []string) error {
			return e.withRequest(c, func(r *request) error {
				rep, err := r.api.KeepAlive(r.ctx, args[0])
				if err != nil {
					return status(e.fail(err, "session "+args[0]))
				}
				e.print(rep, fmt.Sprintf("session_id=%s ttl_ms=%d", textValue(args[0]), rep.TTLms))
				return nil
			})
		},
	}
	del := &cobra.Command{
		Use:   "delete ID",
		Short: "end a session, releasing its locks",
		Long:  "End a session: its locks are released (no lock-delay applies) and its waits dropped. Exits 5 when it expired or does not exist.",
		Args:  positional("ID"),
		RunE: func(c *cobra.Command, args []string) error {
			return e.withRequest(c, func(r *request) error {
				if err := r.api.DeleteSession(r.ctx, args[0]); err != nil {
					return status(e.fail(err, "session "+args[0]))
				}
				e.print(map[string]any{"deleted": true, "session_id": args[0]}, "session "+textValue(args[0])+" deleted")
				return nil
			})
		},
	}
	c.AddCommand(create, keepalive, del)
	return c
}

func (e *env) clusterCmd() *cobra.Command {
	c := group(&cobra.Command{
		Use:   "cluster",
		Short: "show and change the cluster's membership",
		Long: `The cluster's membership and leadership. status needs any token (clients
find the members with it); add, remove and transfer need an admin token.
A change the cluster refuses (no such member, an invalid address, a member
that cannot catch up) exits 8.`,
	}, "status, add, remove or transfer")
	var all bool
	st := &cobra.Command{
		Use:   "status [--all]",
		Short: "show the leader and the members, as one member sees them",
		Long: `Show the leader, the term and the members (id, Raft and HTTP address, voter,
leader) as the first member that answers sees them (GET /api/v1/cluster:
any token will do). --all asks every member for its own view instead:
that is lockctl endpoint status.`,
		Args: positional(),
		RunE: func(c *cobra.Command, _ []string) error {
			if all {
				return status(e.endpointStatus(c.Context()))
			}
			return status(e.clusterStatus(c.Context()))
		},
	}
	st.Flags().BoolVar(&all, "all", false, "every member's own view: role, term, indexes, log store, version (lockctl endpoint status)")
	add := &cobra.Command{
		Use:   "add ID RAFTADDR HTTPADDR",
		Short: "add a voter (admin token)",
		Long: `Add member ID, which listens for Raft at RAFTADDR (host:port) and serves
the client API at HTTPADDR, as a voter. The leader adds it as a non-voter,
waits until it has caught up, then promotes it. Usually a new member asks
for this itself (lockd --join). A refusal exits 8.`,
		Args: positional("ID", "RAFTADDR", "HTTPADDR"),
		RunE: func(c *cobra.Command, args []string) error {
			return e.withRequest(c, func(r *request) error {
				m := api.AddMemberRequest{ID: args[0], RaftAddr: args[1], HTTPAddr: args[2]}
				if err := r.api.AddMember(r.ctx, m); err != nil {
					return status(e.failCluster(err, "cluster add "+args[0]))
				}
				e.print(m, "member "+textValue(args[0])+" added")
				return nil
			})
		},
	}
	remove := &cobra.Command{
		Use:   "remove ID",
		Short: "remove a member (admin token)",
		Long: `Remove member ID from the cluster. Removing the leader hands leadership
over first. An unknown ID exits 8.`,
		Args:              positional("ID"),
		ValidArgsFunction: e.completeMembers,
		RunE: func(c *cobra.Command, args []string) error {
			return e.withRequest(c, func(r *request) error {
				if err := r.api.RemoveMember(r.ctx, args[0]); err != nil {
					return status(e.failCluster(err, "cluster remove "+args[0]))
				}
				e.print(map[string]any{"removed": args[0]}, "member "+textValue(args[0])+" removed")
				return nil
			})
		},
	}
	var to string
	transfer := &cobra.Command{
		Use:   "transfer [--to ID]",
		Short: "hand the leadership over (admin token)",
		Long:  "Ask the leader to hand its leadership over: to member ID, or to one the cluster picks. An unknown ID exits 8.",
		Args:  positional(),
		RunE: func(c *cobra.Command, _ []string) error {
			return e.withRequest(c, func(r *request) error {
				if err := r.api.TransferLeadership(r.ctx, to); err != nil {
					return status(e.failCluster(err, "cluster transfer"))
				}
				e.print(api.TransferRequest{To: to}, "leadership transfer requested")
				return nil
			})
		},
	}
	transfer.Flags().StringVar(&to, "to", "", "member `ID` to hand the leadership to (default: the cluster picks)")
	_ = transfer.RegisterFlagCompletionFunc("to", e.completeMembers)
	c.AddCommand(st, add, remove, transfer)
	return c
}

func (e *env) clusterStatus(ctx context.Context) int {
	r, code := e.prepare(ctx, 0)
	if r == nil {
		return code
	}
	defer r.cancel()
	st, err := r.api.Cluster(r.ctx)
	if err != nil {
		return e.fail(err, "cluster status")
	}
	var b strings.Builder
	fmt.Fprintf(&b, "leader %s %s term %d\n", textValue(st.LeaderID), textValue(st.LeaderHTTP), st.Term)
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tRAFT\tHTTP\tVOTER\tLEADER")
	for _, m := range st.Members {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%v\t%v\n", textValue(m.ID), textValue(m.RaftAddr), textValue(m.HTTPAddr), m.Voter, m.ID == st.LeaderID)
	}
	tw.Flush()
	e.print(st, b.String())
	return exitOK
}

// failCluster reports a failed membership change: the cluster's refusal
// (no such member, a bad address, ...) exits 8; auth, no leader and the
// rest as everywhere.
func (e *env) failCluster(err error, what string) int {
	var se *client.ServerError
	if code := exitCode(err); !errors.As(err, &se) || (code != exitError && code != exitNotHolder) {
		return e.fail(err, what)
	}
	hint := ""
	if se.API.Code == api.CodeNotFound {
		hint = " (lockctl cluster status lists the members)"
	}
	fmt.Fprintf(e.stderr, "lockctl: %s: refused by the cluster: %s%s\n", safe(what), safe(orDash(se.API.Message)), hint)
	return exitCluster
}

// completeMembers completes member ids, asked of the cluster within a
// second or two (nothing when it does not answer).
func (e *env) completeMembers(c *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
	if c.Name() == "remove" && len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	if err := e.setup(c); err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	a, err := e.api()
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	ctx, cancel := context.WithTimeout(c.Context(), 2*time.Second)
	defer cancel()
	st, err := a.Cluster(ctx)
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var ids []string
	for _, m := range st.Members {
		ids = append(ids, m.ID+"\t"+m.HTTPAddr)
	}
	return ids, cobra.ShellCompDirectiveNoFileComp
}

func (e *env) endpointCmd() *cobra.Command {
	c := group(&cobra.Command{
		Use:   "endpoint",
		Short: "every member's own view of the cluster",
	}, "status")
	st := &cobra.Command{
		Use:   "status",
		Short: "every member's own view: role, term, commit and applied index, last token, log store, version",
		Long: `Ask every member for its own view, like etcdctl endpoint status --cluster:
the member list comes from the cluster (GET /api/v1/cluster, any token),
then each member answers GET /api/v1/status at its HTTP address (no token
needed): id, role (leader, follower, candidate), term, commit index,
applied index, the last fencing token it has applied, its Raft log store
and its lockd version. A member that does not answer within --timeout is
shown as unreachable, with the error. Exits 0 when any member answered,
6 when none did.

A follower whose applied index lags the leader's is catching up; one
whose term is behind has not heard from the leader. (lockctl cluster
status --all prints the same.)`,
		Args: positional(),
		RunE: func(c *cobra.Command, _ []string) error {
			return status(e.endpointStatus(c.Context()))
		},
	}
	c.AddCommand(st)
	return c
}

// memberView is one row of endpoint status: a member, and its own view
// when it answered.
type memberView struct {
	ID        string          `json:"id"`
	Endpoint  string          `json:"endpoint"`
	Reachable bool            `json:"reachable"`
	Error     string          `json:"error,omitempty"`
	Status    *api.NodeStatus `json:"status,omitempty"`
}

// answered records a member's answer to GET /api/v1/status.
func (v *memberView) answered(ns *api.NodeStatus, err error) {
	if err != nil {
		v.Error = strings.TrimPrefix(err.Error(), "GET "+v.Endpoint+"/api/v1/status: ")
		if errors.Is(err, client.ErrHTTPSRequired) {
			v.Error = "speaks HTTPS: use https:// endpoints and --cacert"
		}
		return
	}
	v.Reachable, v.Status, v.Error = true, ns, ""
	if ns.ID != "" && ns.ID != v.ID {
		v.Error = "answers as member " + ns.ID
	}
}

// endpointStatusReply is endpoint status's -o json.
type endpointStatusReply struct {
	Members []memberView `json:"members"`
}

// memberURL is a member's client API URL: its http_addr, given the scheme
// of the endpoints when it has none.
func (e *env) memberURL(httpAddr string) string {
	if httpAddr == "" || strings.Contains(httpAddr, "://") {
		return strings.TrimRight(httpAddr, "/")
	}
	scheme := "http"
	if eps := e.endpoints(); len(eps) > 0 {
		if u, err := url.Parse(eps[0]); err == nil && u.Scheme != "" {
			scheme = u.Scheme
		}
	}
	return scheme + "://" + httpAddr
}

func (e *env) endpointStatus(ctx context.Context) int {
	r, code := e.prepare(ctx, 0)
	if r == nil {
		return code
	}
	defer r.cancel()
	cs, err := r.api.Cluster(r.ctx)
	if err != nil {
		return e.fail(err, "endpoint status")
	}
	views := make([]memberView, len(cs.Members))
	known := map[string]bool{}
	for i, m := range cs.Members {
		views[i] = memberView{ID: m.ID, Endpoint: e.memberURL(m.HTTPAddr)}
		known[views[i].Endpoint] = true
	}
	// A member whose HTTP address the cluster does not know yet (it
	// publishes it once it has joined) may be one of the endpoints given.
	var extra []string
	for _, ep := range e.endpoints() {
		if ep = strings.TrimRight(ep, "/"); !known[ep] {
			extra = append(extra, ep)
		}
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range views {
		if views[i].Endpoint == "" {
			continue
		}
		wg.Go(func() {
			ns, err := r.api.MemberStatus(r.ctx, views[i].Endpoint)
			mu.Lock()
			defer mu.Unlock()
			views[i].answered(ns, err)
		})
	}
	for _, ep := range extra {
		wg.Go(func() {
			ns, err := r.api.MemberStatus(r.ctx, ep)
			if err != nil {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			for i := range views {
				if views[i].ID == ns.ID && views[i].Endpoint == "" {
					views[i].Endpoint = ep
					views[i].answered(ns, nil)
				}
			}
		})
	}
	wg.Wait()
	for i := range views {
		if views[i].Endpoint == "" {
			views[i].Error = "no HTTP address known (the member has not published it yet)"
		}
	}

	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tENDPOINT\tROLE\tTERM\tCOMMIT\tAPPLIED\tLAST_TOKEN\tLOG_STORE\tVERSION\tREACHABLE")
	answered := 0
	for _, v := range views {
		if !v.Reachable {
			fmt.Fprintf(tw, "%s\t%s\t-\t-\t-\t-\t-\t-\t-\tno: %s\n", textValue(v.ID), textValue(v.Endpoint), safe(v.Error))
			continue
		}
		answered++
		s := v.Status
		reach := "yes"
		if v.Error != "" {
			reach += " (" + safe(v.Error) + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\n", textValue(v.ID), textValue(v.Endpoint), textValue(strings.ToLower(s.State)),
			s.Term, s.CommitIndex, s.AppliedIndex, s.LastToken, textValue(s.LogStore), textValue(s.Version), reach)
	}
	tw.Flush()
	e.print(endpointStatusReply{Members: views}, b.String())
	if answered == 0 {
		fmt.Fprintf(e.stderr, "lockctl: endpoint status: none of the %d members answered\n", len(views))
		return exitNoLeader
	}
	return exitOK
}

// withRequest runs fn with a request to the cluster, answering a failed
// set-up (endpoints, TLS, token) with its exit status.
func (e *env) withRequest(c *cobra.Command, fn func(r *request) error) error {
	r, code := e.prepare(c.Context(), 0)
	if r == nil {
		return status(code)
	}
	defer r.cancel()
	return fn(r)
}
