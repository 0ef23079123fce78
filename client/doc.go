// Package client is the Go client of lockd, a distributed lock service on
// Raft.
//
// A Client holds one session, carried by one WebSocket connection to the
// leader (found from any member). It sends keepalives at about a third of
// the session TTL, and after a connection loss or a leader change it
// reconnects with backoff and jitter, resumes the session and re-sends the
// acquires still waiting, which keep their place in the lock's queue.
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
// # The conservative local lease
//
// The client counts a lock as lost when its own deadline runs out: the time
// it sent the last keepalive (or renew, or acquire) the leader confirmed,
// plus the TTL. The server measures the same TTL from when it received that
// message, so the client's deadline comes first, and Lock.Lost is closed
// before the server could give the lock to anyone else. A session-bound lock
// (no TTL of its own) follows the session's deadline; a lock with a TTL
// follows the earlier of the two. A small margin (Config.LeaseMargin)
// comes off each deadline for timer lateness. Lost is also closed when the server pushes
// "lost", answers not_holder, or ends the session.
//
// # Errors
//
// Errors match the package's sentinels with errors.Is (ErrLockHeld,
// ErrWaitTimeout, ErrNotHolder, ErrSessionExpired, ErrNoLeader, ...); an
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
// never retried.
package client
