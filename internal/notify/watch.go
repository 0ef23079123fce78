package notify

import (
	"strings"
	"sync"

	"github.com/lockd/lockd/internal/locktable"
)

// Watches hands committed changes of lock statuses to watchers of one lock
// or of a name prefix: blocking queries and WebSocket watches. Publish is
// called by the one goroutine that follows the log, in log order, so every
// watcher sees a lock's changes in log order.
//
// A parked watcher costs memory, not CPU: it is a buffered channel in two
// maps and a goroutine blocked on it; nothing polls. A watcher that does
// not keep up never slows the publisher: its buffer fills, further changes
// are dropped for it and it is flagged for a resync (Watch.Resync), after
// which it re-reads and goes on.
type Watches struct {
	mu       sync.Mutex
	byLock   map[string]map[*Watch]struct{}
	prefixes map[*Watch]struct{}
	count    int
	// published: the changes of every entry up to this index have been
	// handed to their watchers (Advance); syncing: watches waiting for a
	// Synced mark (SyncAt).
	published uint64
	syncing   map[*Watch]struct{}
	// onCount is told the number of watchers whenever it changes between
	// zero and non-zero (the state machine adapter records statuses only
	// while someone watches).
	onCount func(watching bool)
}

// NewWatches returns an empty set; onCount may be nil.
func NewWatches(onCount func(watching bool)) *Watches {
	return &Watches{byLock: map[string]map[*Watch]struct{}{}, prefixes: map[*Watch]struct{}{},
		syncing: map[*Watch]struct{}{}, onCount: onCount}
}

// Change is one committed change of a lock's status: the status right
// after the entry at Index applied. Every watcher and parked query it
// reaches shares it (read only), and its encoding: Encoded makes it once.
//
// Or, with Synced set, the mark a watch asked for with SyncAt: every change
// at or below Index was handed to the watch before it (Status is empty).
type Change struct {
	Index  uint64
	Status locktable.LockInfo
	Synced bool

	once sync.Once
	enc  []byte
}

// Encoded returns enc(c), computed once however many readers ask: one
// change fanned out to thousands of watchers is encoded once, not once per
// watcher (a status with 64 holders of 4 KiB values is 256 KiB).
func (c *Change) Encoded(enc func(*Change) []byte) []byte {
	c.once.Do(func() { c.enc = enc(c) })
	return c.enc
}

// Watch is one watcher. Its changes arrive on C in log order; Resync
// signals that changes were dropped (buffer full, or the state was replaced
// or leadership changed) and the watcher must re-read.
type Watch struct {
	ws     *Watches
	lock   string // one lock, or
	prefix string // every lock under a prefix ("" with lock "" is every lock)
	single bool
	c      chan *Change // pointers: a buffer costs 8 bytes a slot, and a change fans out uncopied
	resync chan struct{}
	closed bool
	syncAt uint64 // the index of the Synced mark it waits for (0: none)
}

// C delivers the changes; they are shared by every watcher: read only.
func (w *Watch) C() <-chan *Change { return w.c }

// Scope is what the watch follows: one lock (prefix false), or every lock
// under a prefix.
func (w *Watch) Scope() (name string, prefix bool) {
	if w.single {
		return w.lock, false
	}
	return w.prefix, true
}

// Resync is signalled when changes were dropped for this watcher.
func (w *Watch) Resync() <-chan struct{} { return w.resync }

// WatchLock watches one lock, buffering up to buf changes.
func (ws *Watches) WatchLock(lock string, buf int) *Watch {
	w := &Watch{ws: ws, lock: lock, single: true, c: make(chan *Change, buf), resync: make(chan struct{}, 1)}
	ws.mu.Lock()
	m := ws.byLock[lock]
	if m == nil {
		m = map[*Watch]struct{}{}
		ws.byLock[lock] = m
	}
	m[w] = struct{}{}
	ws.addLocked(1)
	ws.mu.Unlock()
	return w
}

// WatchPrefix watches every lock whose name starts with prefix.
func (ws *Watches) WatchPrefix(prefix string, buf int) *Watch {
	w := &Watch{ws: ws, prefix: prefix, c: make(chan *Change, buf), resync: make(chan struct{}, 1)}
	ws.mu.Lock()
	ws.prefixes[w] = struct{}{}
	ws.addLocked(1)
	ws.mu.Unlock()
	return w
}

func (ws *Watches) addLocked(n int) {
	before := ws.count
	ws.count += n
	if ws.onCount != nil && (before == 0) != (ws.count == 0) {
		ws.onCount(ws.count > 0)
	}
}

// Close stops the watch; its channel is not closed (the owner stops
// reading).
func (w *Watch) Close() {
	ws := w.ws
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if w.closed {
		return
	}
	w.closed = true
	if w.single {
		if m := ws.byLock[w.lock]; m != nil {
			delete(m, w)
			if len(m) == 0 {
				delete(ws.byLock, w.lock)
			}
		}
	} else {
		delete(ws.prefixes, w)
	}
	delete(ws.syncing, w)
	ws.addLocked(-1)
}

// SyncAt asks for a Synced mark on C once the changes of every entry up to
// index have been handed to the watch, after them: at once if they have
// been. A watcher that read the state in pieces, each at its own index,
// learns from it when every change up to the last piece's index is in its
// hands. If the mark does not fit the buffer, the watch is flagged for a
// resync instead.
func (w *Watch) SyncAt(index uint64) {
	ws := w.ws
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if w.closed {
		return
	}
	if ws.published >= index {
		w.deliver(&Change{Index: index, Synced: true})
		return
	}
	w.syncAt = index
	ws.syncing[w] = struct{}{}
}

// Advance records that the changes of every entry up to index have been
// published (the one goroutine that follows the log calls it after each
// entry's Publish, whether or not the entry changed a watched lock), and
// hands out the Synced marks that were waiting for it.
func (ws *Watches) Advance(index uint64) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if index <= ws.published {
		return
	}
	ws.published = index
	for w := range ws.syncing {
		if w.syncAt <= index {
			w.deliver(&Change{Index: w.syncAt, Synced: true})
			w.syncAt = 0
			delete(ws.syncing, w)
		}
	}
}

// Watching reports whether anyone watches.
func (ws *Watches) Watching() bool {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return ws.count > 0
}

// Count returns the number of open watches.
func (ws *Watches) Count() int {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return ws.count
}

// Interested reports whether a change of lock has a watcher.
func (ws *Watches) Interested(lock string) bool {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if len(ws.byLock[lock]) > 0 {
		return true
	}
	for w := range ws.prefixes {
		if strings.HasPrefix(lock, w.prefix) {
			return true
		}
	}
	return false
}

// Publish hands the changes of one committed entry to their watchers.
func (ws *Watches) Publish(changes []Change) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.count == 0 {
		return
	}
	for i := range changes {
		ch := &changes[i]
		for w := range ws.byLock[ch.Status.Name] {
			w.deliver(ch)
		}
		for w := range ws.prefixes {
			if strings.HasPrefix(ch.Status.Name, w.prefix) {
				w.deliver(ch)
			}
		}
	}
}

func (w *Watch) deliver(ch *Change) {
	select {
	case w.c <- ch:
	default:
		w.flag()
	}
}

func (w *Watch) flag() {
	select {
	case w.resync <- struct{}{}:
	default:
	}
}

// Reset tells every watcher to re-read: the state was replaced by a
// snapshot, or leadership changed.
func (ws *Watches) Reset() {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	for _, m := range ws.byLock {
		for w := range m {
			w.flag()
		}
	}
	for w := range ws.prefixes {
		w.flag()
	}
}
