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
func (s *MemoryStore) Admit(key string, w Write) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	next, err := w.Apply(key, s.recs[key])
	if err != nil {
		return err
	}
	s.recs[key] = next
	return nil
}

// Put implements Store. It keeps a copy of value.
func (s *MemoryStore) Put(key string, w Write, value []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	next, err := w.Apply(key, s.recs[key])
	if err != nil {
		return err
	}
	next.Value, next.HasValue = clone(value), true
	s.recs[key] = next
	return nil
}

// Reset implements Store.
func (s *MemoryStore) Reset(key string, token uint64) (Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	prev, ok := s.recs[key]
	if !ok && token == 0 {
		return Record{}, nil
	}
	next := prev
	next.Token, next.Lock = token, ""
	s.recs[key] = next
	prev.Value = clone(prev.Value)
	return prev, nil
}

// clone copies b, so no caller aliases the stored bytes.
func clone(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append([]byte{}, b...)
}
