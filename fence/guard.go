package fence

import (
	"fmt"
	"sort"
	"strings"
)

// Guard binds every key that starts with Prefix to Lock: only writes made
// under Lock (Fencing-Lock, and with a verify key, a proof of Lock) may
// change them. An empty Prefix matches every key.
type Guard struct {
	Prefix string
	Lock   string
}

// ParseGuard parses "PREFIX=LOCK", fencestore's --guard. The split is at the
// last "=", which a lock name cannot contain, so a prefix may hold "=".
func ParseGuard(s string) (Guard, error) {
	i := strings.LastIndexByte(s, '=')
	if i < 0 {
		return Guard{}, fmt.Errorf("guard %s: want PREFIX=LOCK", quote(s))
	}
	g := Guard{Prefix: s[:i], Lock: s[i+1:]}
	if reason := checkLockName(g.Lock); reason != "" {
		return Guard{}, fmt.Errorf("guard %s: lock %s", quote(s), reason)
	}
	return g, nil
}

// Guards maps a key to the lock that guards it: the Guard with the longest
// prefix of the key wins. A nil *Guards guards nothing. It is read-only
// after NewGuards, so safe for concurrent use.
type Guards struct {
	byLen []Guard // longest prefix first
}

// NewGuards checks gs and returns them ready for lookups. Each lock must be
// a valid lock name; a prefix given twice must name the same lock (two locks
// for one prefix would leave the key's lock to a guess).
func NewGuards(gs ...Guard) (*Guards, error) {
	seen := make(map[string]string, len(gs))
	out := &Guards{}
	for _, g := range gs {
		if reason := checkLockName(g.Lock); reason != "" {
			return nil, fmt.Errorf("fence: guard of prefix %s: lock %s", quote(g.Prefix), reason)
		}
		if lock, dup := seen[g.Prefix]; dup {
			if lock != g.Lock {
				return nil, fmt.Errorf("fence: prefix %s is guarded by two locks, %s and %s", quote(g.Prefix), quote(lock), quote(g.Lock))
			}
			continue
		}
		seen[g.Prefix] = g.Lock
		out.byLen = append(out.byLen, g)
	}
	sort.SliceStable(out.byLen, func(i, j int) bool { return len(out.byLen[i].Prefix) > len(out.byLen[j].Prefix) })
	return out, nil
}

// Lock returns the lock that guards key, "" when no guard matches it.
// Guards are few (they come from configuration), so a scan is enough.
func (g *Guards) Lock(key string) string {
	if g == nil {
		return ""
	}
	for _, gd := range g.byLen {
		if strings.HasPrefix(key, gd.Prefix) {
			return gd.Lock
		}
	}
	return ""
}

// List returns the guards, longest prefix first.
func (g *Guards) List() []Guard {
	if g == nil {
		return nil
	}
	return append([]Guard(nil), g.byLen...)
}
