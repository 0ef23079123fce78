package fence

// Record is what a Store keeps for one key.
type Record struct {
	// Token is the highest token accepted for the key; 0 when none was.
	Token uint64
	// Lock is the lock the key is bound to: the lock named by the first
	// accepted write that named one, or the guard's lock of the last
	// guarded write. "" while the key is unbound.
	Lock string
	// Value is the value written with Put. Only meaningful when HasValue.
	Value []byte
	// HasValue is false for a key never written with Put (it may still have
	// a Token, admitted with Admit).
	HasValue bool
}

// Write is one fenced write as a Store checks it.
type Write struct {
	// Token is the write's fencing token.
	Token uint64
	// Lock is the lock the write was made under (header Fencing-Lock); ""
	// when it names none, which only an unbound key accepts.
	Lock string
	// Guarded says Lock is the key's lock by configuration (a guard, see
	// Guards), not by the client's word: it wins over the lock stored for
	// the key and replaces it, so the key stays bound to it even if the
	// guard is later removed.
	Guarded bool
}

// Apply is the rule every Store follows: it returns the record to keep
// after admitting w for key, whose current record is cur, or the refusal
// (cur unchanged):
//
//   - a key bound to a lock admits only writes under that lock
//     (*LockMismatchError), unless the write is Guarded;
//   - a token lower than cur.Token is stale (*StaleTokenError);
//   - otherwise the token becomes the highest and, if the write names a
//     lock, the key is bound to it.
//
// The binding is checked before the token, so a write under a foreign lock
// is refused for what it is, whatever its token. A Store implementation
// calls Apply inside its atomic step; Middleware and NewServer also call it
// to refuse early.
func (w Write) Apply(key string, cur Record) (Record, error) {
	if w.Guarded && w.Lock == "" {
		// A guard always names a lock; refuse rather than let an empty
		// one pass every binding.
		return cur, &LockMismatchError{Key: key, Bound: cur.Lock}
	}
	if !w.Guarded && cur.Lock != "" && w.Lock != cur.Lock {
		return cur, &LockMismatchError{Key: key, Lock: w.Lock, Bound: cur.Lock}
	}
	if w.Token < cur.Token {
		return cur, &StaleTokenError{Key: key, Token: w.Token, Highest: cur.Token}
	}
	next := cur
	next.Token = w.Token
	if w.Lock != "" {
		next.Lock = w.Lock
	}
	return next, nil
}

// Store keeps, per resource key, the highest accepted fencing token, the
// lock the key is bound to, and optionally a value written together with
// them.
//
// Admit and Put are each one atomic check-and-write following Write.Apply:
// the checks and the update happen with no other Admit, Put or Reset on the
// same key in between, so concurrent writers can never move the token
// backwards nor bind one key to two locks. A token equal to the highest is
// accepted (the same holder writing again). A lower one gets an error for
// which errors.Is(err, ErrStaleToken) holds and errors.As finds a
// *StaleTokenError carrying the highest; a write under another lock than the
// key's gets a *LockMismatchError (errors.Is(err, ErrLockMismatch));
// nothing changes.
//
// Implementations must be safe for concurrent use.
type Store interface {
	// Get returns the record of key: the zero Record when there is none.
	Get(key string) (Record, error)
	// Admit applies w to key (Write.Apply), leaving any value as it is.
	Admit(key string, w Write) error
	// Put applies w to key (Write.Apply) and sets its value, in one atomic
	// (and for durable stores, one durable) step.
	Put(key string, w Write, value []byte) error
	// Reset is the operator's way out of a key that no holder can write any
	// more: it sets the key's highest token to token (0 lets every token in
	// again), even below the current one, and unbinds the key from its
	// lock; the value stays. It returns the record as it was. Resetting a
	// key without a record to token 0 stores nothing.
	Reset(key string, token uint64) (Record, error)
}
