// Package client is the Go client of lockd, a distributed lock service on
// Raft.
//
// A Client holds one session, carried by one WebSocket connection to the
// leader (found from any member). It sends keepalives at about a third of
// the session TTL, and after a connection loss or a leader change it
// reconnects with backoff and jitter, resumes the session and re-sends the
// acquires still waiting, which keep their place in the lock's queue. An
// acquire whose caller gives up (its ctx ends) is withdrawn from the queue
// (a cancel; a grant that raced it is released), so no lock is granted to
// a waiter nobody listens for. Goroutines of one Client that want the same
// lock are served in the order they asked, and a release hands the lock to
// the next of them in one committed step. An overloaded cluster's refusals
// are waited out and retried, as a leader election is.
//
//	c, err := client.New(ctx, client.Config{Endpoints: []string{"http://127.0.0.1:7070"}})
//	...
//	defer c.Close()
//	err = c.Do(ctx, "nightly-report", func(ctx context.Context, token uint64) error {
//		// ctx is cancelled the moment the lock is lost; pass token to
//		// every resource the work writes to (see Lock.Fence).
//		return run(ctx, token)
//	})
//
// New looks for a leader until ctx ends or Config.DialTimeout (10s by
// default) has passed, then fails with an error matching ErrNoLeader that
// wraps the last attempt's error — at once, matching ErrUnreachable too,
// when every endpoint refused the connection or the TLS handshake for a
// reason waiting cannot fix. Once open, the Client reconnects by itself
// until Close.
//
// # The conservative local lease
//
// The client counts a lock as lost when its own deadline runs out: the time
// it sent the last keepalive (or renew, or acquire) the leader confirmed,
// plus the TTL. The server measures the same TTL from when it received that
// message, so the client's deadline comes first, and Lock.Lost is closed
// before the server could give the lock to anyone else. A session-bound lock
// (no TTL of its own) follows the session's deadline; a lock with a TTL
// follows the earlier of the two. A margin (Config.LeaseMargin) comes off
// each deadline for timer lateness and clock-rate drift; it grows with the
// TTL.
//
// The lease is always what the server granted, never what the caller asked
// for: a grant without expires_at has no TTL of its own, one with expires_at
// has the server's TTL. When the grant alone cannot tell which TTL the
// server holds and from when (a wait re-sent after a reconnect — a resend
// without ttl_ms keeps the TTL the wait was queued with — or a late
// grant), the client confirms it with a renew
// carrying an explicit TTL before Acquire returns. A renew without an answer
// may have been applied: the lease then ends no later than its send time
// plus its TTL. A Release without an answer may have been applied too: the
// lock counts as gone (Lost closes, Err matches ErrUnknownOutcome) and the
// client goes on releasing it in the background.
//
// Lost is also closed when the server pushes "lost", answers not_holder, or
// ends the session. Pushes sent while the client was disconnected are lost
// with the connection, so after every resume of the session the client reads
// the status of each lock it holds from the leader and closes Lost of those
// it no longer holds (and takes an earlier expiry the leader reports).
//
// # Lock kinds
//
// Options choose the kind of a lock: WithShared for the readers of a
// read-write lock, WithLimit for a semaphore of n permits, WithLockDelay
// to keep a lock from everyone for a while after its grant ends without a
// release, WithValue to publish a value with the grant (Lock.SetValue
// changes it). AcquireMany takes several locks in one step or none; the
// locks it returns share one fate (see Lock.Lost). Client.Revoke ends
// grants as an administrator; their holders see ErrRevoked.
//
// # Watches and elections
//
// Watch and WatchPrefix follow locks as they change: first the current
// state, then the status after each committed change, each lock's in log
// order. They ride the session's WebSocket and survive reconnects: the
// client watches again and delivers a lock's status only when its index
// moved on, so nothing comes twice or out of order and the latest state
// always comes. WithConnEvents adds the watch's connection state to its
// events (lost, and established again with how many locks it caught up
// on). API.WaitStatus is the HTTP blocking query.
//
// Election is a leader election on a lock with values (Campaign, Proclaim,
// Resign, Leader, Observe, Done), in the shape of etcd's
// concurrency.Election.
//
// # Errors
//
// Errors match the package's sentinels with errors.Is (ErrLockHeld,
// ErrWaitTimeout, ErrNotHolder, ErrSessionExpired, ErrNoLeader,
// ErrUnreachable, ErrOverloaded, ErrCancelled, ErrLimitMismatch,
// ErrResourceExhausted, ...); an
// error reply of the server is a *ServerError that also unwraps to the wire
// *api.Error.
//
// # Plain HTTP
//
// API is a thin client of the HTTP API for calls without a session: locks
// held by client ID and TTL, lock status, sessions, cluster membership and
// backups (SnapshotSave, SnapshotRestore).
//
// # TLS and tokens
//
// Config.TLSConfig (APIConfig.TLSConfig) secures https:// endpoints and the
// wss:// session: RootCAs to trust the members, Certificates when they
// require client certificates. Config.Token is sent as a bearer token on
// every request and on the WebSocket upgrade. A refused token gives errors
// matching ErrUnauthenticated (401) or ErrPermissionDenied (403), which are
// never retried. A token with read access only makes a read-only Client
// (Client.ReadOnly): no session, watches and reads only — enough for
// dashboards and Election.Observe.
//
// The token goes only to members of the cluster: the configured endpoints
// and the leader one of them names (X-Lockd-Leader, or the leader of a
// WebSocket not_leader reply). Other redirects, and any from https to http,
// are not followed (ErrUntrustedRedirect).
package client
