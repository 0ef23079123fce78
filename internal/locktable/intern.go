package locktable

import "hash/maphash"

// idCache interns the client and session ids of grants and waits. Every
// command decoded from the log carries its own copy of its ids, so a
// million locks held by a few hundred clients kept a million copies of a
// few hundred strings (16–32 B each, 15–30 MiB on every member).
//
// A small direct-mapped cache rather than a table of every id: it needs no
// reference counts, and it stays bounded whatever ids clients send (an id
// that misses is kept as decoded, and replaces the slot's). Ids are
// compared by value everywhere, so which copy a holder keeps changes
// nothing that is replicated, and Apply stays deterministic in what it
// does to the state.
type idCache struct {
	slots *[idCacheSlots]string // allocated on first use
	seed  maphash.Seed
}

// idCacheSlots is a power of two well above the number of clients that
// usually share a table; 64 KiB of string headers.
const idCacheSlots = 4096

// intern returns the cached copy of s, or s, which it caches.
func (c *idCache) intern(s string) string {
	if s == "" {
		return s
	}
	if c.slots == nil {
		c.slots, c.seed = new([idCacheSlots]string), maphash.MakeSeed()
	}
	slot := &c.slots[maphash.String(c.seed, s)&(idCacheSlots-1)]
	if *slot == s {
		return *slot
	}
	*slot = s
	return s
}
