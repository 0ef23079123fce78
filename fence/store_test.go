package fence

import (
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"

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
					if err := s.Put("k", 5, []byte("v5")); err != nil {
						t.Fatal(err)
					}
					rec := mustGet(t, s, "k")
					if rec.Token != 5 || !rec.HasValue || string(rec.Value) != "v5" {
						t.Fatalf("Get = %+v", rec)
					}
				}},
				{"lower token refused, value unchanged", func(t *testing.T, s Store) {
					_ = s.Put("k", 7, []byte("v7"))
					wantStale(t, s.Put("k", 6, []byte("v6")), 7)
					wantStale(t, s.Admit("k", 3), 7)
					if rec := mustGet(t, s, "k"); rec.Token != 7 || string(rec.Value) != "v7" {
						t.Fatalf("Get = %+v, want token 7 value v7", rec)
					}
				}},
				{"equal token accepted", func(t *testing.T, s Store) {
					_ = s.Put("k", 7, []byte("a"))
					if err := s.Put("k", 7, []byte("b")); err != nil {
						t.Fatalf("equal token: %v", err)
					}
					if err := s.Admit("k", 7); err != nil {
						t.Fatalf("equal admit: %v", err)
					}
					if rec := mustGet(t, s, "k"); string(rec.Value) != "b" {
						t.Fatalf("value = %q, want b", rec.Value)
					}
				}},
				{"admit raises token and keeps value", func(t *testing.T, s Store) {
					_ = s.Put("k", 2, []byte("v2"))
					if err := s.Admit("k", 9); err != nil {
						t.Fatal(err)
					}
					rec := mustGet(t, s, "k")
					if rec.Token != 9 || string(rec.Value) != "v2" || !rec.HasValue {
						t.Fatalf("Get = %+v", rec)
					}
					wantStale(t, s.Put("k", 8, nil), 9)
				}},
				{"admit alone records no value", func(t *testing.T, s Store) {
					_ = s.Admit("k", 4)
					if rec := mustGet(t, s, "k"); rec.Token != 4 || rec.HasValue {
						t.Fatalf("Get = %+v", rec)
					}
				}},
				{"empty value is a value", func(t *testing.T, s Store) {
					_ = s.Put("k", 1, []byte{})
					if rec := mustGet(t, s, "k"); !rec.HasValue || len(rec.Value) != 0 {
						t.Fatalf("Get = %+v", rec)
					}
				}},
				{"keys are independent", func(t *testing.T, s Store) {
					_ = s.Put("a", 100, []byte("a"))
					if err := s.Put("b", 1, []byte("b")); err != nil {
						t.Fatalf("other key: %v", err)
					}
				}},
				{"max token", func(t *testing.T, s Store) {
					const max = ^uint64(0)
					_ = s.Put("k", max, []byte("m"))
					wantStale(t, s.Put("k", max-1, nil), max)
					if err := s.Put("k", max, []byte("m2")); err != nil {
						t.Fatal(err)
					}
				}},
				{"returned value is a copy", func(t *testing.T, s Store) {
					in := []byte("abc")
					_ = s.Put("k", 1, in)
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
	if err := s.Put("k", 42, []byte("v42")); err != nil {
		t.Fatal(err)
	}
	if err := s.Admit("other", 7); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = openBolt(t, path)
	if rec := mustGet(t, s, "k"); rec.Token != 42 || string(rec.Value) != "v42" {
		t.Fatalf("after restart Get = %+v", rec)
	}
	wantStale(t, s.Put("k", 41, []byte("old")), 42)
	wantStale(t, s.Admit("other", 6), 7)
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
	good := encodeRecord(Record{Token: 3, Value: []byte("xy"), HasValue: true})
	tests := []struct {
		name    string
		in      []byte
		want    Record
		corrupt bool
	}{
		{"nil is no record", nil, Record{}, false},
		{"round trip", good, Record{Token: 3, Value: []byte("xy"), HasValue: true}, false},
		{"token only", encodeRecord(Record{Token: 9}), Record{Token: 9}, false},
		{"short", good[:5], Record{}, true},
		{"bad version", append([]byte{2}, good[1:]...), Record{}, true},
		{"bad flags", append([]byte{1, 6}, good[2:]...), Record{}, true},
		{"value without flag", append(encodeRecord(Record{Token: 1}), 'z'), Record{}, true},
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
			if got.Token != tc.want.Token || got.HasValue != tc.want.HasValue || string(got.Value) != string(tc.want.Value) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
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
							err = s.Put(key, token, []byte(fmt.Sprint(token)))
						} else {
							err = s.Admit(key, token)
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

// TestStoreModel drives both stores with random operations and compares
// each answer with a map-based model.
func TestStoreModel(t *testing.T) {
	for _, sf := range storeFactories() {
		t.Run(sf.name, func(t *testing.T) {
			rapid.Check(t, func(rt *rapid.T) {
				s := sf.open(t)
				model := map[string]Record{}
				keys := rapid.SampledFrom([]string{"a", "b", "c/d"})
				tokens := rapid.Uint64Range(0, 20)
				rt.Repeat(map[string]func(*rapid.T){
					"put": func(rt *rapid.T) {
						k, tok := keys.Draw(rt, "key"), tokens.Draw(rt, "token")
						v := rapid.SliceOfN(rapid.Byte(), 0, 8).Draw(rt, "value")
						err := s.Put(k, tok, v)
						if cur := model[k]; tok < cur.Token {
							wantStale(rt, err, cur.Token)
							return
						}
						if err != nil {
							rt.Fatalf("Put: %v", err)
						}
						model[k] = Record{Token: tok, Value: v, HasValue: true}
					},
					"admit": func(rt *rapid.T) {
						k, tok := keys.Draw(rt, "key"), tokens.Draw(rt, "token")
						err := s.Admit(k, tok)
						cur := model[k]
						if tok < cur.Token {
							wantStale(rt, err, cur.Token)
							return
						}
						if err != nil {
							rt.Fatalf("Admit: %v", err)
						}
						cur.Token = tok
						model[k] = cur
					},
					"": func(rt *rapid.T) {
						for k, want := range model {
							got := mustGet(rt, s, k)
							if got.Token != want.Token || got.HasValue != want.HasValue || string(got.Value) != string(want.Value) {
								rt.Fatalf("key %q: store %+v, model %+v", k, got, want)
							}
						}
					},
				})
			})
		})
	}
}
