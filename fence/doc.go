// Package fence lets a resource server refuse writes from a lock holder that
// has lost its lock, using the fencing tokens that lockd hands out with every
// grant.
//
// lockd gives each grant a token strictly greater than every token it issued
// before. A client sends its token with every write (header Fencing-Token).
// The resource server remembers, per resource, the highest token it has
// accepted and refuses anything lower: a holder that paused past its TTL and
// wakes up after a newer holder has written is turned away with
// 409 stale_token instead of overwriting the newer data. An equal token is
// accepted, so the same holder may write many times.
//
// Tokens are global: lockd has one counter for every lock. So a token is
// only comparable with tokens of the same lock, and each key is bound to the
// one lock that guards it: by configuration (Guards, WithLockFunc;
// fencestore --guard PREFIX=LOCK, the longest matching prefix wins), else by
// the first accepted write that names a lock in Fencing-Lock, kept in the
// Store from then on. A write naming another lock gets 403
// permission_denied whatever its token; without the binding, a holder of any
// lock with a higher token could overwrite the key and fence its real
// holder out for good.
//
// The package has three layers:
//
//   - A Store keeps the highest accepted token and the lock binding per
//     key. Its Admit and Put check and update both in one atomic step
//     (Write.Apply), so two writers racing with tokens 5 and 6 can never
//     leave 5 accepted after 6. NewMemoryStore keeps it in memory;
//     OpenBoltStore keeps it in a bbolt file, and its Put writes the value,
//     token and binding in one transaction, so a crash never separates them.
//   - A Checker admits writes against a Store, and Middleware wraps any
//     net/http handler with the header parsing, proof checking and error
//     replies.
//   - NewServer is the whole fencestore resource server (cmd/fencestore).
//
// A Verifier holds the checks of a write's credentials (lock name, guard,
// proof) that Middleware and NewServer apply before Write.Apply, so that a
// resource that is not an HTTP handler refuses exactly the same writes:
// package fence/sqlfence does, for rows of PostgreSQL and SQLite, in the
// transaction of the writes it guards.
//
// # Guarantees
//
// Middleware admits the token at check time: when it calls the wrapped
// handler, the request's token was not lower than any token admitted before
// for that key, and it has become the new highest. It cannot make the wrapped
// handler's own write atomic with that check. Two requests with tokens 6 and
// then 7 may both be admitted and their handlers may still run concurrently,
// so 6's write can land after 7's. WithSerializedWrites closes that gap within
// one process: it holds a per-key lock from the check until the handler
// returns, so fenced writes to one key take effect in token order. Neither
// survives a crash between the check and the handler's write: the token may be
// recorded without the value, which errs on the safe side (the older holder
// stays fenced out).
//
// The fencestore server (NewServer) gives the stronger guarantee: the value and
// its token are checked and written in one Store.Put, one bbolt transaction,
// so the stored value is always the one written with the highest accepted
// token, across crashes and restarts.
//
// A token is the latest only until the next holder of the same lock writes:
// a holder that lost its lock can still write while no newer holder has.
// That is inherent to fencing tokens; proof expiry (below) narrows it.
//
// # Proofs
//
// A token alone can be invented by any client: without proofs, fencing
// keeps honest clients apart, and nothing more. In particular any client can
// send the largest token, 18446744073709551615, after which no write to that
// key is ever accepted again (fencestore's admin reset, Store.Reset, is the
// way out).
//
// When the resource server is given lockd's Ed25519 public key
// (WithVerifyKey, ServerConfig.VerifyKey), it also requires header
// Fencing-Proof: a signature by the lock service over the lock name (header
// Fencing-Lock), the token, the grant's mode and its expiry, made by
// SignGrant and checked by VerifyGrant (format version 2; see ProofLen). A
// write is then refused with 403 permission_denied when the proof is
// missing or bad, names another lock than the key's, is a shared grant's
// (readers cannot write), or has expired (Middleware: unless
// WithoutProofExpiry). A stale token is answered 409 even when its proof has
// also expired.
//
// What a proof promises: that the lock service's private key signed that
// grant, so a client without the key cannot make one for a lock, token or
// mode it was not granted, nor change one it was. What it does not promise:
// that the grant is still held (a released or expired grant's proof stays
// valid until its expiry, and one with expiry 0, a session lock without a
// TTL, never expires); that it is secret (anyone who sees a proof, in
// transit or in logs, can replay it: use TLS); that clocks agree (the
// expiry is the lock service's, compared with the resource server's clock);
// or anything once the private key leaks. A renewal does not re-sign: the
// holder gets a fresh proof by acquiring again, which for the current holder
// returns the same token with a renewed expiry.
package fence
