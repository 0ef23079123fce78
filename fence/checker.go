package fence

import "sync"

// Checker admits fenced writes per resource key against a Store (the
// highest token and the lock the key is bound to), and can order a caller's
// own writes by token (Do).
type Checker struct {
	store Store
	locks keyLocks
}

// NewChecker returns a Checker that keeps its tokens in store; a nil store
// means a new MemoryStore.
func NewChecker(store Store) *Checker {
	if store == nil {
		store = NewMemoryStore()
	}
	return &Checker{store: store}
}

// Store returns the store the Checker keeps its tokens in.
func (c *Checker) Store() Store { return c.store }

// Check admits w for key: nil if w's token is not lower than any token
// admitted before for key (it is now the highest) and w is made under the
// key's lock (an unbound key becomes bound to w.Lock, when w names one);
// otherwise an error that errors.Is ErrStaleToken (a *StaleTokenError
// carrying the highest) or ErrLockMismatch (a *LockMismatchError). See
// Write.Apply. Check is atomic per key: concurrent calls are admitted in
// some order in which the highest token never goes down.
func (c *Checker) Check(key string, w Write) error {
	unlock := c.locks.lock(key)
	defer unlock()
	return c.store.Admit(key, w)
}

// Do admits w for key as Check does and, if admitted, runs fn while
// holding key's lock, so no other Check or Do on key runs in between. So the
// writes made by fn take effect in token order: once a token has been
// admitted, no fn of a lower token runs afterwards. Do returns the admission
// error (fn does not run) or fn's error.
//
// Do orders writes within this process only, and the admission is recorded
// before fn runs: a crash inside fn leaves the token raised without fn's
// write, which keeps older holders out. Where value and token must be stored
// together, use Store.Put.
func (c *Checker) Do(key string, w Write, fn func() error) error {
	unlock := c.locks.lock(key)
	defer unlock()
	if err := c.store.Admit(key, w); err != nil {
		return err
	}
	return fn()
}

// Highest returns the highest token admitted for key, 0 if none.
func (c *Checker) Highest(key string) (uint64, error) {
	rec, err := c.store.Get(key)
	return rec.Token, err
}

// keyLocks is a mutex per key, created on demand and dropped when unused, so
// memory stays bounded by the number of keys in use at once.
type keyLocks struct {
	mu sync.Mutex
	m  map[string]*keyLock
}

type keyLock struct {
	mu   sync.Mutex
	refs int // guarded by keyLocks.mu
}

func (k *keyLocks) lock(key string) (unlock func()) {
	k.mu.Lock()
	if k.m == nil {
		k.m = make(map[string]*keyLock)
	}
	l := k.m[key]
	if l == nil {
		l = &keyLock{}
		k.m[key] = l
	}
	l.refs++
	k.mu.Unlock()

	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		k.mu.Lock()
		l.refs--
		if l.refs == 0 {
			delete(k.m, key)
		}
		k.mu.Unlock()
	}
}
