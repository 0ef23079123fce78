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
// The package has three layers:
//
//   - A Store keeps the highest accepted token per key. Its Admit and Put
//     compare and raise the token in one atomic step, so two writers racing
//     with tokens 5 and 6 can never leave 5 accepted after 6. NewMemoryStore
//     keeps it in memory; OpenBoltStore keeps it in a bbolt file, and its Put
//     writes the value and the token in one transaction, so a crash never
//     separates them.
//   - A Checker admits tokens against a Store, and Middleware wraps any
//     net/http handler with the header parsing, proof checking and error
//     replies.
//   - NewServer is the whole fencestore resource server (cmd/fencestore).
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
// # Proofs
//
// A token alone can be invented by any client. When the resource server is
// given lockd's Ed25519 public key (WithVerifyKey, ServerConfig.VerifyKey), it
// also requires header Fencing-Proof: a signature by the lock service over the
// lock name (header Fencing-Lock), the token and an expiry, made by Sign and
// checked by Verify. A missing or bad proof gets 403 permission_denied.
package fence
