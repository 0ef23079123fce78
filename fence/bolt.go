package fence

import (
	"encoding/binary"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/lockd/lockd/api"
)

// bucketRecords holds one record per key: see encodeRecord.
var bucketRecords = []byte("fence/records/v1")

// Record encoding. Version 2, written by this code:
//
//	version (2) || flags || token (8 bytes BE) || lock length (2 bytes BE) || lock || value
//
// Version 1, written before keys were bound to locks, is read as an unbound
// record: version (1) || flags || token (8 bytes BE) || value. A version 1
// key is bound by its next write that names a lock.
const (
	recordV1          = 1
	recordV2          = 2
	recordV1HeaderLen = 10
	recordHeaderLen   = 12 // version 2, before the lock
	flagHasValue      = 1
)

// BoltStore is a durable Store in a bbolt file. Every Admit and Put is one
// bbolt read-write transaction, fsync'd before it returns, so a Put's value
// and token are written together or not at all.
type BoltStore struct {
	db *bolt.DB
}

var _ Store = (*BoltStore)(nil)

// OpenBoltStore opens (creating if needed) the bbolt file at path. It fails
// after a second if another process holds the file.
func OpenBoltStore(path string) (*BoltStore, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		return nil, fmt.Errorf("fence: open %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(bucketRecords)
		return err
	})
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("fence: init %s: %w", path, err)
	}
	return &BoltStore{db: db}, nil
}

// Close closes the file. The store must not be used afterwards.
func (s *BoltStore) Close() error { return s.db.Close() }

// Get implements Store.
func (s *BoltStore) Get(key string) (Record, error) {
	var rec Record
	err := s.db.View(func(tx *bolt.Tx) error {
		var err error
		// decodeRecord copies: bbolt's bytes are only valid inside the tx.
		rec, err = decodeRecord(tx.Bucket(bucketRecords).Get([]byte(key)))
		return err
	})
	if err != nil {
		return Record{}, fmt.Errorf("fence: get %q: %w", key, err)
	}
	return rec, nil
}

// Admit implements Store. Re-admitting the highest token under the key's
// lock writes nothing.
func (s *BoltStore) Admit(key string, w Write) error {
	return s.update(key, func(cur Record) (Record, bool, error) {
		next, err := w.Apply(key, cur)
		return next, err == nil && (next.Token != cur.Token || next.Lock != cur.Lock), err
	})
}

// Put implements Store.
func (s *BoltStore) Put(key string, w Write, value []byte) error {
	return s.update(key, func(cur Record) (Record, bool, error) {
		next, err := w.Apply(key, cur)
		next.Value, next.HasValue = value, true
		return next, err == nil, err
	})
}

// Reset implements Store.
func (s *BoltStore) Reset(key string, token uint64) (Record, error) {
	var prev Record
	err := s.update(key, func(cur Record) (Record, bool, error) {
		prev = cur
		next := cur
		next.Token, next.Lock = token, ""
		return next, next.Token != cur.Token || next.Lock != cur.Lock, nil
	})
	if err != nil {
		return Record{}, err
	}
	return prev, nil
}

// update runs check-and-write in one read-write transaction; bbolt runs
// those one at a time, which is what makes the check atomic. next returns
// the record to store, whether to write it, and a refusal.
func (s *BoltStore) update(key string, next func(Record) (Record, bool, error)) error {
	var refused error
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketRecords)
		k := []byte(key)
		cur, err := decodeRecord(b.Get(k))
		if err != nil {
			return err
		}
		rec, write, err := next(cur)
		if err != nil {
			refused = err
			return err
		}
		if !write {
			return nil
		}
		return b.Put(k, encodeRecord(rec))
	})
	if refused != nil {
		return refused // a *StaleTokenError or *LockMismatchError, as is
	}
	if err != nil {
		return fmt.Errorf("fence: write %q: %w", key, err)
	}
	return nil
}

func encodeRecord(rec Record) []byte {
	buf := make([]byte, recordHeaderLen, recordHeaderLen+len(rec.Lock)+len(rec.Value))
	buf[0] = recordV2
	if rec.HasValue {
		buf[1] = flagHasValue
	}
	binary.BigEndian.PutUint64(buf[2:10], rec.Token)
	binary.BigEndian.PutUint16(buf[10:12], uint16(len(rec.Lock))) // a lock name is at most api.MaxLockName bytes
	buf = append(buf, rec.Lock...)
	return append(buf, rec.Value...)
}

// decodeRecord decodes a stored record of either version; nil (no record)
// gives the zero Record. The value is copied out of buf, and every length
// read from buf is checked against what buf holds.
func decodeRecord(buf []byte) (Record, error) {
	if buf == nil {
		return Record{}, nil
	}
	if len(buf) < recordV1HeaderLen {
		return Record{}, fmt.Errorf("%w: %d bytes, want at least %d", ErrCorrupt, len(buf), recordV1HeaderLen)
	}
	if buf[1]&^flagHasValue != 0 {
		return Record{}, fmt.Errorf("%w: flags %#x", ErrCorrupt, buf[1])
	}
	rec := Record{
		Token:    binary.BigEndian.Uint64(buf[2:10]),
		HasValue: buf[1]&flagHasValue != 0,
	}
	var rest []byte
	switch buf[0] {
	case recordV1:
		rest = buf[recordV1HeaderLen:]
	case recordV2:
		if len(buf) < recordHeaderLen {
			return Record{}, fmt.Errorf("%w: %d bytes, want at least %d", ErrCorrupt, len(buf), recordHeaderLen)
		}
		n := int(binary.BigEndian.Uint16(buf[10:12]))
		if n > api.MaxLockName || n > len(buf)-recordHeaderLen {
			return Record{}, fmt.Errorf("%w: lock of %d bytes in a record of %d", ErrCorrupt, n, len(buf))
		}
		rec.Lock = string(buf[recordHeaderLen : recordHeaderLen+n])
		rest = buf[recordHeaderLen+n:]
	default:
		return Record{}, fmt.Errorf("%w: version %d", ErrCorrupt, buf[0])
	}
	if rec.HasValue {
		rec.Value = append([]byte{}, rest...)
	} else if len(rest) != 0 {
		return Record{}, fmt.Errorf("%w: value bytes without a value", ErrCorrupt)
	}
	return rec, nil
}
