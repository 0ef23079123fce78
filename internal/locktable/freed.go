package locktable

// freedLocks remembers, for the most recently dropped locks, the log index
// of their last change, so a free lock's status carries an index that moves
// only when that lock changes: a blocking query on it (index=N) waits
// instead of answering at every change of some other lock. Locks dropped
// longer ago share floor, an index at or above each one's last change,
// which moves only as the ring turns over. Bounded (freedLockSize entries)
// and derived from Apply alone; not encoded: a restored table starts with
// floor at the snapshot's last change.
type freedLocks struct {
	idx   map[string]uint64
	ring  []freedLock
	head  int
	floor uint64
}

type freedLock struct {
	name  string
	index uint64
}

const freedLockSize = 4096

func (f *freedLocks) add(name string, index uint64) {
	if f.idx == nil {
		f.idx = map[string]uint64{}
	}
	e := freedLock{name, index}
	if len(f.ring) < freedLockSize {
		f.ring = append(f.ring, e)
	} else {
		old := f.ring[f.head]
		if f.idx[old.name] == old.index {
			delete(f.idx, old.name)
		}
		f.floor = max(f.floor, old.index)
		f.ring[f.head] = e
		f.head = (f.head + 1) % freedLockSize
	}
	f.idx[name] = index
}

// index is the last-change index to report for a lock not in the table.
func (f *freedLocks) index(name string) uint64 {
	if i, ok := f.idx[name]; ok {
		return i
	}
	return f.floor
}
