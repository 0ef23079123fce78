package fence

// Record is what a Store keeps for one key.
type Record struct {
	// Token is the highest token accepted for the key; 0 when none was.
	Token uint64
	// Value is the value written with Put. Only meaningful when HasValue.
	Value []byte
	// HasValue is false for a key never written with Put (it may still have
	// a Token, admitted with Admit).
	HasValue bool
}

// Store keeps the highest accepted fencing token per resource key, and
// optionally a value written together with it.
//
// Admit and Put are each one atomic check-and-write: the comparison with the
// highest token and the update happen with no other Admit or Put on the same
// key in between, so concurrent writers can never move the token backwards.
// A token equal to the highest is accepted (the same holder writing again).
// A lower one gets an error for which errors.Is(err, ErrStaleToken) holds and
// errors.As finds a *StaleTokenError carrying the highest; nothing changes.
//
// Implementations must be safe for concurrent use.
type Store interface {
	// Get returns the record of key: the zero Record when there is none.
	Get(key string) (Record, error)
	// Admit raises the highest token of key to token, leaving any value as
	// it is, unless token is lower than the highest.
	Admit(key string, token uint64) error
	// Put raises the highest token of key to token and sets its value, in
	// one atomic (and for durable stores, one durable) step, unless token is
	// lower than the highest.
	Put(key string, token uint64, value []byte) error
}
