package fence

import "sync"

// MemoryStore is a Store in memory: the highest tokens are lost when the
// process ends. Use it for tests, or where the fenced resource is itself
// in memory.
type MemoryStore struct {
	mu   sync.Mutex
	recs map[string]Record
}

var _ Store = (*MemoryStore)(nil)

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore() *MemoryStore {
	return &MemoryStore{recs: make(map[string]Record)}
}

// Get implements Store. The returned Value is a copy.
func (s *MemoryStore) Get(key string) (Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rec := s.recs[key]
	rec.Value = clone(rec.Value)
	return rec, nil
}

// Admit implements Store.
func (s *MemoryStore) Admit(key string, token uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	rec := s.recs[key]
	if token < rec.Token {
		return &StaleTokenError{Key: key, Token: token, Highest: rec.Token}
	}
	rec.Token = token
	s.recs[key] = rec
	return nil
}

// Put implements Store. It keeps a copy of value.
func (s *MemoryStore) Put(key string, token uint64, value []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	rec := s.recs[key]
	if token < rec.Token {
		return &StaleTokenError{Key: key, Token: token, Highest: rec.Token}
	}
	s.recs[key] = Record{Token: token, Value: clone(value), HasValue: true}
	return nil
}

// clone copies b, so no caller aliases the stored bytes.
func clone(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append([]byte{}, b...)
}
