package locktable_test

import (
	"bytes"
	"strings"
	"testing"

	lt "github.com/lockd/lockd/internal/locktable"
)

// holderSpec is one lock with a holder in a hand-made format 1 snapshot.
type holderSpec struct {
	lock, client, session string
	token                 uint64
	ttl                   int64
}

// snapshotWith writes a format 1 snapshot: the sessions (id, client), the
// held locks, no waiters, members or memo.
func snapshotWith(last uint64, sessions [][2]string, locks []holderSpec) []byte {
	w := newSnapWriter(1, last)
	w.uvarint(uint64(len(sessions)))
	for _, s := range sessions {
		w.strs(s[0], s[1])
		w.varint(15000)
		w.varint(t0)
	}
	w.uvarint(uint64(len(locks)))
	for _, l := range locks {
		w.str(l.lock)
		w.byte(1)
		w.strs(l.client, l.session)
		w.uvarint(l.token)
		w.varint(l.ttl)
		if l.ttl > 0 {
			w.varint(t0 + l.ttl)
		} else {
			w.varint(0)
		}
		w.varint(t0)
		w.uvarint(0) // waiters
	}
	w.uvarint(0) // members
	w.uvarint(0) // memo
	return w.b
}

// TestRestoreRefusesBrokenInvariants: a backup is restored only if it holds
// a state Apply could have made (SPEC semantics 12, restore never installs
// what the state machine would not keep).
func TestRestoreRefusesBrokenInvariants(t *testing.T) {
	good := holderSpec{"a", "c1", "", 1, 1000}
	if _, err := lt.Restore(snapshotWith(5, nil, []holderSpec{good})); err != nil {
		t.Fatalf("a valid snapshot was refused: %v", err)
	}
	for _, tc := range []struct {
		name     string
		sessions [][2]string
		locks    []holderSpec
		want     string
	}{
		{"empty lock name", nil, []holderSpec{{"", "c", "", 1, 1000}}, "lock name"},
		{"invalid lock name", nil, []holderSpec{{"a b", "c", "", 1, 1000}}, "lock name"},
		{"invalid UTF-8 client id", nil, []holderSpec{{"a", "c\xff", "", 1, 1000}}, "UTF-8"},
		{"empty client id", nil, []holderSpec{{"a", "", "", 1, 1000}}, "holder of a"},
		{"three holders share a token", nil, []holderSpec{{"a", "c", "", 3, 1000}, {"b", "c", "", 3, 1000}, {"c", "c", "", 3, 1000}}, "token 3 held on both"},
		{"holder of a session that does not exist", nil, []holderSpec{{"a", "c", "ghost", 1, 0}}, "does not exist"},
		{"neither TTL nor session", nil, []holderSpec{{"a", "c", "", 1, 0}}, "never be freed"},
		{"token zero", nil, []holderSpec{{"a", "c", "", 0, 1000}}, "outside"},
		{"session id with a space", [][2]string{{"s 1", "c"}}, nil, "session id"},
	} {
		_, err := lt.Restore(snapshotWith(5, tc.sessions, tc.locks))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: restore gave %v, want an error naming %q", tc.name, err, tc.want)
		}
	}
}

// TestClientIDIsTiedToItsIdentity: within one lock prefix, a token that
// names another identity's client id can neither release, renew nor
// re-acquire (and so take over) that identity's grant.
func TestClientIDIsTiedToItsIdentity(t *testing.T) {
	tb := lt.New()
	own := func(c lt.Command, owner string) lt.Command { c.Owner = owner; return c }
	r := tb.Apply(own(acq("shared/x", "worker", 60000, 0, t0), "alice"))
	if !r.Granted {
		t.Fatalf("acquire: %+v", r)
	}
	before := tb.Snapshot()
	if r := tb.Apply(own(rel("shared/x", "worker", r.Token, t0+1), "mallory")); r.Code != lt.CodeNotHolder {
		t.Fatalf("release by another identity: %v, want not_holder", r.Code)
	}
	if r := tb.Apply(own(renew("shared/x", "worker", 1, 60000, t0+1), "mallory")); r.Code != lt.CodeNotHolder {
		t.Fatalf("renew by another identity: %v, want not_holder", r.Code)
	}
	if r := tb.Apply(own(acq("shared/x", "worker", 60000, 0, t0+1), "mallory")); r.Granted || r.Code != lt.CodeLockHeld {
		t.Fatalf("re-acquire by another identity: %+v, want lock_held", r)
	}
	if !bytes.Equal(before, tb.Snapshot()) {
		t.Fatal("refused requests changed the state")
	}
	if r := tb.Apply(own(rel("shared/x", "worker", 1, t0+2), "alice")); r.Code != lt.OK {
		t.Fatalf("release by the owner: %v", r.Code)
	}
}
