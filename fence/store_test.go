package fence

import (
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"

	bolt "go.etcd.io/bbolt"
	"pgregory.net/rapid"
)

// storeFactory makes a fresh store for one test.
type storeFactory struct {
	name string
	open func(t testing.TB) Store
}

func storeFactories() []storeFactory {
	return []storeFactory{
		{"memory", func(testing.TB) Store { return NewMemoryStore() }},
		{"bolt", func(t testing.TB) Store { return openBolt(t, filepath.Join(t.TempDir(), "f.db")) }},
	}
}

func openBolt(t testing.TB, path string) *BoltStore {
	t.Helper()
	s, err := OpenBoltStore(path)
	if err != nil {
		t.Fatalf("OpenBoltStore: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// tb is what the helpers need of testing.TB and *rapid.T alike.
type tb interface {
	Helper()
	Fatalf(format string, args ...any)
}

func mustGet(t tb, s Store, key string) Record {
	t.Helper()
	rec, err := s.Get(key)
	if err != nil {
		t.Fatalf("Get(%q): %v", key, err)
	}
	return rec
}

// wantStale checks err is a stale-token error carrying highest.
func wantStale(t tb, err error, highest uint64) {
	t.Helper()
	if !errors.Is(err, ErrStaleToken) {
		t.Fatalf("err = %v, want ErrStaleToken", err)
	}
	var se *StaleTokenError
	if !errors.As(err, &se) {
		t.Fatalf("err = %T, want *StaleTokenError", err)
	}
	if se.Highest != highest {
		t.Fatalf("Highest = %d, want %d", se.Highest, highest)
	}
}

func TestStoreSemantics(t *testing.T) {
	for _, sf := range storeFactories() {
		t.Run(sf.name, func(t *testing.T) {
			tests := []struct {
				name string
				run  func(t *testing.T, s Store)
			}{
				{"empty key has zero record", func(t *testing.T, s Store) {
					if rec := mustGet(t, s, "k"); rec.Token != 0 || rec.HasValue || rec.Value != nil {
						t.Fatalf("Get = %+v, want zero", rec)
					}
				}},
				{"put then get", func(t *testing.T, s Store) {
					if err := s.Put("k", Write{Token: 5}, []byte("v5")); err != nil {
						t.Fatal(err)
					}
					rec := mustGet(t, s, "k")
					if rec.Token != 5 || !rec.HasValue || string(rec.Value) != "v5" {
						t.Fatalf("Get = %+v", rec)
					}
				}},
				{"lower token refused, value unchanged", func(t *testing.T, s Store) {
					_ = s.Put("k", Write{Token: 7}, []byte("v7"))
					wantStale(t, s.Put("k", Write{Token: 6}, []byte("v6")), 7)
					wantStale(t, s.Admit("k", Write{Token: 3}), 7)
					if rec := mustGet(t, s, "k"); rec.Token != 7 || string(rec.Value) != "v7" {
						t.Fatalf("Get = %+v, want token 7 value v7", rec)
					}
				}},
				{"equal token accepted", func(t *testing.T, s Store) {
					_ = s.Put("k", Write{Token: 7}, []byte("a"))
					if err := s.Put("k", Write{Token: 7}, []byte("b")); err != nil {
						t.Fatalf("equal token: %v", err)
					}
					if err := s.Admit("k", Write{Token: 7}); err != nil {
						t.Fatalf("equal admit: %v", err)
					}
					if rec := mustGet(t, s, "k"); string(rec.Value) != "b" {
						t.Fatalf("value = %q, want b", rec.Value)
					}
				}},
				{"admit raises token and keeps value", func(t *testing.T, s Store) {
					_ = s.Put("k", Write{Token: 2}, []byte("v2"))
					if err := s.Admit("k", Write{Token: 9}); err != nil {
						t.Fatal(err)
					}
					rec := mustGet(t, s, "k")
					if rec.Token != 9 || string(rec.Value) != "v2" || !rec.HasValue {
						t.Fatalf("Get = %+v", rec)
					}
					wantStale(t, s.Put("k", Write{Token: 8}, nil), 9)
				}},
				{"admit alone records no value", func(t *testing.T, s Store) {
					_ = s.Admit("k", Write{Token: 4})
					if rec := mustGet(t, s, "k"); rec.Token != 4 || rec.HasValue {
						t.Fatalf("Get = %+v", rec)
					}
				}},
				{"empty value is a value", func(t *testing.T, s Store) {
					_ = s.Put("k", Write{Token: 1}, []byte{})
					if rec := mustGet(t, s, "k"); !rec.HasValue || len(rec.Value) != 0 {
						t.Fatalf("Get = %+v", rec)
					}
				}},
				{"keys are independent", func(t *testing.T, s Store) {
					_ = s.Put("a", Write{Token: 100}, []byte("a"))
					if err := s.Put("b", Write{Token: 1}, []byte("b")); err != nil {
						t.Fatalf("other key: %v", err)
					}
				}},
				{"max token", func(t *testing.T, s Store) {
					const max = ^uint64(0)
					_ = s.Put("k", Write{Token: max}, []byte("m"))
					wantStale(t, s.Put("k", Write{Token: max - 1}, nil), max)
					if err := s.Put("k", Write{Token: max}, []byte("m2")); err != nil {
						t.Fatal(err)
					}
				}},
				{"returned value is a copy", func(t *testing.T, s Store) {
					in := []byte("abc")
					_ = s.Put("k", Write{Token: 1}, in)
					in[0] = 'X'
					out := mustGet(t, s, "k").Value
					out[1] = 'Y'
					if got := mustGet(t, s, "k").Value; string(got) != "abc" {
						t.Fatalf("value = %q, want abc", got)
					}
				}},
			}
			for _, tc := range tests {
				t.Run(tc.name, func(t *testing.T) { tc.run(t, sf.open(t)) })
			}
		})
	}
}

func TestBoltStoreRestartKeepsHighest(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f.db")
	s, err := OpenBoltStore(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Put("k", Write{Token: 42}, []byte("v42")); err != nil {
		t.Fatal(err)
	}
	if err := s.Admit("other", Write{Token: 7}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = openBolt(t, path)
	if rec := mustGet(t, s, "k"); rec.Token != 42 || string(rec.Value) != "v42" {
		t.Fatalf("after restart Get = %+v", rec)
	}
	wantStale(t, s.Put("k", Write{Token: 41}, []byte("old")), 42)
	wantStale(t, s.Admit("other", Write{Token: 6}), 7)
	if rec := mustGet(t, s, "k"); string(rec.Value) != "v42" {
		t.Fatalf("stale write after restart changed value to %q", rec.Value)
	}
}

func TestBoltStoreSecondOpenFails(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f.db")
	openBolt(t, path)
	if s, err := OpenBoltStore(path); err == nil {
		_ = s.Close()
		t.Fatal("second OpenBoltStore of a held file succeeded")
	}
}

func TestDecodeRecord(t *testing.T) {
	good := encodeRecord(Record{Token: 3, Lock: "billing/ledger", Value: []byte("xy"), HasValue: true})
	// v1 is the layout written before keys were bound to locks.
	v1 := append([]byte{1, 1, 0, 0, 0, 0, 0, 0, 0, 7}, "old"...)
	withLockLen := func(n uint16) []byte {
		b := append([]byte{}, good...)
		b[10], b[11] = byte(n>>8), byte(n)
		return b
	}
	tests := []struct {
		name    string
		in      []byte
		want    Record
		corrupt bool
	}{
		{"nil is no record", nil, Record{}, false},
		{"round trip", good, Record{Token: 3, Lock: "billing/ledger", Value: []byte("xy"), HasValue: true}, false},
		{"token only", encodeRecord(Record{Token: 9}), Record{Token: 9}, false},
		{"lock without value", encodeRecord(Record{Token: 9, Lock: "L"}), Record{Token: 9, Lock: "L"}, false},
		{"version 1 reads as unbound", v1, Record{Token: 7, Value: []byte("old"), HasValue: true}, false},
		{"version 1 token only", []byte{1, 0, 0, 0, 0, 0, 0, 0, 0, 5}, Record{Token: 5}, false},
		{"short", good[:5], Record{}, true},
		{"version 2 cut in its header", good[:11], Record{}, true},
		{"lock longer than the record", withLockLen(200), Record{}, true},
		{"lock longer than a lock name", withLockLen(300), Record{}, true},
		{"bad version", append([]byte{3}, good[1:]...), Record{}, true},
		{"bad flags", append([]byte{2, 6}, good[2:]...), Record{}, true},
		{"value without flag", append(encodeRecord(Record{Token: 1, Lock: "L"}), 'z'), Record{}, true},
		{"version 1 value without flag", []byte{1, 0, 0, 0, 0, 0, 0, 0, 0, 5, 'z'}, Record{}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := decodeRecord(tc.in)
			if tc.corrupt {
				if !errors.Is(err, ErrCorrupt) {
					t.Fatalf("err = %v, want ErrCorrupt", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Token != tc.want.Token || got.Lock != tc.want.Lock || got.HasValue != tc.want.HasValue || string(got.Value) != string(tc.want.Value) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// wantMismatch checks err is a lock-mismatch error naming bound.
func wantMismatch(t tb, err error, bound string) {
	t.Helper()
	var me *LockMismatchError
	if !errors.Is(err, ErrLockMismatch) || !errors.As(err, &me) {
		t.Fatalf("err = %v, want a *LockMismatchError", err)
	}
	if me.Bound != bound {
		t.Fatalf("Bound = %q, want %q", me.Bound, bound)
	}
}

// TestStoreBindsKeyToLock: the first write naming a lock binds the key to
// it; writes under another lock, or none, are refused whatever their token
// (the tenant's token may well be higher: tokens are global); a guarded
// write rebinds; Reset lowers the token and unbinds, keeping the value.
func TestStoreBindsKeyToLock(t *testing.T) {
	for _, sf := range storeFactories() {
		t.Run(sf.name, func(t *testing.T) {
			s := sf.open(t)
			billing := Write{Token: 10, Lock: "billing/ledger"}
			if err := s.Put("ledger", billing, []byte("balance")); err != nil {
				t.Fatal(err)
			}
			wantMismatch(t, s.Put("ledger", Write{Token: 20, Lock: "a/x"}, []byte("evil")), "billing/ledger")
			wantMismatch(t, s.Admit("ledger", Write{Token: 20, Lock: "a/x"}), "billing/ledger")
			wantMismatch(t, s.Put("ledger", Write{Token: 20}, []byte("evil")), "billing/ledger")
			// The binding is checked before the token: a foreign lock with a
			// stale token is a mismatch, not stale.
			wantMismatch(t, s.Put("ledger", Write{Token: 1, Lock: "a/x"}, nil), "billing/ledger")
			if rec := mustGet(t, s, "ledger"); rec.Token != 10 || rec.Lock != "billing/ledger" || string(rec.Value) != "balance" {
				t.Fatalf("after refused writes: %+v", rec)
			}
			if err := s.Put("ledger", billing, []byte("balance 2")); err != nil {
				t.Fatalf("the key's own holder was refused: %v", err)
			}
			wantStale(t, s.Put("ledger", Write{Token: 9, Lock: "billing/ledger"}, nil), 10)

			// A write naming no lock leaves an unbound key unbound; the
			// first that names one binds it.
			if err := s.Put("free", Write{Token: 1}, []byte("v")); err != nil {
				t.Fatal(err)
			}
			if rec := mustGet(t, s, "free"); rec.Lock != "" {
				t.Fatalf("a lockless write bound the key to %q", rec.Lock)
			}
			if err := s.Admit("free", Write{Token: 2, Lock: "L1"}); err != nil {
				t.Fatal(err)
			}
			wantMismatch(t, s.Admit("free", Write{Token: 3, Lock: "L2"}), "L1")

			// A guard's lock wins over the stored one and replaces it.
			if err := s.Admit("free", Write{Token: 3, Lock: "G", Guarded: true}); err != nil {
				t.Fatalf("guarded write: %v", err)
			}
			wantMismatch(t, s.Admit("free", Write{Token: 4, Lock: "L1"}), "G")
			wantStale(t, s.Admit("free", Write{Token: 2, Lock: "G", Guarded: true}), 3)
			wantMismatch(t, s.Admit("free", Write{Token: 9, Guarded: true}), "G")

			// Reset: the operator's way out of a key blocked by the maximum
			// token, or bound to the wrong lock.
			if err := s.Put("stuck", Write{Token: ^uint64(0), Lock: "wrong"}, []byte("kept")); err != nil {
				t.Fatal(err)
			}
			prev, err := s.Reset("stuck", 5)
			if err != nil || prev.Token != ^uint64(0) || prev.Lock != "wrong" || string(prev.Value) != "kept" {
				t.Fatalf("Reset = %+v, %v", prev, err)
			}
			if rec := mustGet(t, s, "stuck"); rec.Token != 5 || rec.Lock != "" || string(rec.Value) != "kept" {
				t.Fatalf("after Reset: %+v", rec)
			}
			wantStale(t, s.Put("stuck", Write{Token: 4, Lock: "right"}, nil), 5)
			if err := s.Put("stuck", Write{Token: 5, Lock: "right"}, []byte("new")); err != nil {
				t.Fatalf("after Reset: %v", err)
			}
			if prev, err := s.Reset("never-written", 0); err != nil || prev.Token != 0 || prev.HasValue || prev.Lock != "" {
				t.Fatalf("Reset of an absent key = %+v, %v", prev, err)
			}
			if rec := mustGet(t, s, "never-written"); rec.Token != 0 || rec.HasValue {
				t.Fatalf("Reset to 0 of an absent key stored %+v", rec)
			}
		})
	}
}

// TestBoltStoreRestartKeepsBinding: the binding is durable, and a record
// written in the version 1 layout (before bindings) is bound by its next
// write that names a lock.
func TestBoltStoreRestartKeepsBinding(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f.db")
	s, err := OpenBoltStore(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Put("ledger", Write{Token: 10, Lock: "billing/ledger"}, []byte("v")); err != nil {
		t.Fatal(err)
	}
	err = s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketRecords).Put([]byte("legacy"), []byte{1, 1, 0, 0, 0, 0, 0, 0, 0, 7, 'o', 'l', 'd'})
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = openBolt(t, path)
	if rec := mustGet(t, s, "ledger"); rec.Lock != "billing/ledger" || rec.Token != 10 {
		t.Fatalf("after restart: %+v", rec)
	}
	wantMismatch(t, s.Put("ledger", Write{Token: 99, Lock: "a/x"}, nil), "billing/ledger")
	if rec := mustGet(t, s, "legacy"); rec.Lock != "" || rec.Token != 7 || string(rec.Value) != "old" {
		t.Fatalf("version 1 record: %+v", rec)
	}
	wantStale(t, s.Admit("legacy", Write{Token: 6, Lock: "L"}), 7)
	if err := s.Admit("legacy", Write{Token: 8, Lock: "L"}); err != nil {
		t.Fatal(err)
	}
	if rec := mustGet(t, s, "legacy"); rec.Lock != "L" || rec.Token != 8 || string(rec.Value) != "old" {
		t.Fatalf("version 1 record after a write: %+v", rec)
	}
}

// TestStoreConcurrentWritersNeverGoBackwards races writers with distinct
// tokens on one key. A check-then-write that is not atomic lets a lower
// token overwrite a higher one; then the final record is not the maximum's.
func TestStoreConcurrentWritersNeverGoBackwards(t *testing.T) {
	for _, sf := range storeFactories() {
		t.Run(sf.name, func(t *testing.T) {
			rounds, writers := 100, 8
			if sf.name == "bolt" {
				rounds = 10 // each write is an fsync
			}
			s := sf.open(t)
			for r := 0; r < rounds; r++ {
				key := fmt.Sprintf("k%d", r)
				var wg sync.WaitGroup
				for i := 1; i <= writers; i++ {
					token := uint64(i)
					wg.Add(1)
					go func() {
						defer wg.Done()
						var err error
						if token%2 == 0 {
							err = s.Put(key, Write{Token: token}, []byte(fmt.Sprint(token)))
						} else {
							err = s.Admit(key, Write{Token: token})
						}
						var se *StaleTokenError
						if err != nil && (!errors.As(err, &se) || se.Highest <= token) {
							t.Errorf("token %d: %v", token, err)
						}
					}()
				}
				wg.Wait()
				rec := mustGet(t, s, key)
				if rec.Token != uint64(writers) {
					t.Fatalf("round %d: highest = %d, want %d", r, rec.Token, writers)
				}
				// the highest Put was token == writers (even)
				if string(rec.Value) != fmt.Sprint(writers) {
					t.Fatalf("round %d: value = %q, want %d", r, rec.Value, writers)
				}
			}
		})
	}
}

// TestStoreModel drives both stores with random operations (writes under
// random locks, guarded or not, and resets) and compares each answer with
// a map-based model written out independently of Write.Apply.
func TestStoreModel(t *testing.T) {
	for _, sf := range storeFactories() {
		t.Run(sf.name, func(t *testing.T) {
			rapid.Check(t, func(rt *rapid.T) {
				s := sf.open(t)
				model := map[string]Record{}
				keys := rapid.SampledFrom([]string{"a", "b", "c/d"})
				tokens := rapid.Uint64Range(0, 20)
				locks := rapid.SampledFrom([]string{"", "L1", "L2"})
				drawWrite := func(rt *rapid.T) Write {
					w := Write{Token: tokens.Draw(rt, "token"), Lock: locks.Draw(rt, "lock")}
					w.Guarded = w.Lock != "" && rapid.Bool().Draw(rt, "guarded")
					return w
				}
				// check applies the model's rule; it returns the new record,
				// or false after checking err is the refusal the model wants.
				check := func(rt *rapid.T, k string, w Write, err error) (Record, bool) {
					cur := model[k]
					switch {
					case !w.Guarded && cur.Lock != "" && cur.Lock != w.Lock:
						wantMismatch(rt, err, cur.Lock)
						return cur, false
					case w.Token < cur.Token:
						wantStale(rt, err, cur.Token)
						return cur, false
					case err != nil:
						rt.Fatalf("write %+v to %q: %v", w, k, err)
					}
					cur.Token = w.Token
					if w.Lock != "" {
						cur.Lock = w.Lock
					}
					return cur, true
				}
				rt.Repeat(map[string]func(*rapid.T){
					"put": func(rt *rapid.T) {
						k, w := keys.Draw(rt, "key"), drawWrite(rt)
						v := rapid.SliceOfN(rapid.Byte(), 0, 8).Draw(rt, "value")
						if next, ok := check(rt, k, w, s.Put(k, w, v)); ok {
							next.Value, next.HasValue = v, true
							model[k] = next
						}
					},
					"admit": func(rt *rapid.T) {
						k, w := keys.Draw(rt, "key"), drawWrite(rt)
						if next, ok := check(rt, k, w, s.Admit(k, w)); ok {
							model[k] = next
						}
					},
					"reset": func(rt *rapid.T) {
						k, tok := keys.Draw(rt, "key"), tokens.Draw(rt, "token")
						prev, err := s.Reset(k, tok)
						want := model[k]
						if err != nil || prev.Token != want.Token || prev.Lock != want.Lock || string(prev.Value) != string(want.Value) {
							rt.Fatalf("Reset(%q) = %+v, %v; model had %+v", k, prev, err, want)
						}
						want.Token, want.Lock = tok, ""
						model[k] = want
					},
					"": func(rt *rapid.T) {
						for k, want := range model {
							got := mustGet(rt, s, k)
							if got.Token != want.Token || got.Lock != want.Lock || got.HasValue != want.HasValue || string(got.Value) != string(want.Value) {
								rt.Fatalf("key %q: store %+v, model %+v", k, got, want)
							}
						}
					},
				})
			})
		})
	}
}
