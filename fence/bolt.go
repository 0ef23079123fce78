package fence

import (
	"encoding/binary"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// bucketRecords holds one record per key: see encodeRecord.
var bucketRecords = []byte("fence/records/v1")

// Record encoding: version byte, flags byte, 8-byte big-endian token, value.
const (
	recordVersion   = 1
	recordHeaderLen = 10
	flagHasValue    = 1
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

// Admit implements Store. Re-admitting the highest token writes nothing.
func (s *BoltStore) Admit(key string, token uint64) error {
	return s.update(key, token, func(rec Record) (Record, bool) {
		if rec.Token == token {
			return rec, false
		}
		rec.Token = token
		return rec, true
	})
}

// Put implements Store.
func (s *BoltStore) Put(key string, token uint64, value []byte) error {
	return s.update(key, token, func(Record) (Record, bool) {
		return Record{Token: token, Value: value, HasValue: true}, true
	})
}

// update runs check-and-write in one read-write transaction; bbolt runs
// those one at a time, which is what makes the check atomic.
func (s *BoltStore) update(key string, token uint64, next func(Record) (Record, bool)) error {
	var stale *StaleTokenError
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketRecords)
		k := []byte(key)
		cur, err := decodeRecord(b.Get(k))
		if err != nil {
			return err
		}
		if token < cur.Token {
			stale = &StaleTokenError{Key: key, Token: token, Highest: cur.Token}
			return stale
		}
		rec, write := next(cur)
		if !write {
			return nil
		}
		return b.Put(k, encodeRecord(rec))
	})
	if stale != nil {
		return stale
	}
	if err != nil {
		return fmt.Errorf("fence: write %q: %w", key, err)
	}
	return nil
}

func encodeRecord(rec Record) []byte {
	buf := make([]byte, recordHeaderLen, recordHeaderLen+len(rec.Value))
	buf[0] = recordVersion
	if rec.HasValue {
		buf[1] = flagHasValue
	}
	binary.BigEndian.PutUint64(buf[2:10], rec.Token)
	return append(buf, rec.Value...)
}

// decodeRecord decodes a stored record; nil (no record) gives the zero
// Record. The value is copied out of buf.
func decodeRecord(buf []byte) (Record, error) {
	if buf == nil {
		return Record{}, nil
	}
	if len(buf) < recordHeaderLen {
		return Record{}, fmt.Errorf("%w: %d bytes, want at least %d", ErrCorrupt, len(buf), recordHeaderLen)
	}
	if buf[0] != recordVersion {
		return Record{}, fmt.Errorf("%w: version %d", ErrCorrupt, buf[0])
	}
	if buf[1]&^flagHasValue != 0 {
		return Record{}, fmt.Errorf("%w: flags %#x", ErrCorrupt, buf[1])
	}
	rec := Record{
		Token:    binary.BigEndian.Uint64(buf[2:10]),
		HasValue: buf[1]&flagHasValue != 0,
	}
	if rec.HasValue {
		rec.Value = append([]byte{}, buf[recordHeaderLen:]...)
	} else if len(buf) != recordHeaderLen {
		return Record{}, fmt.Errorf("%w: value bytes without a value", ErrCorrupt)
	}
	return rec, nil
}
