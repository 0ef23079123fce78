package sqlfence_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockd/lockd/fence"
	"github.com/lockd/lockd/fence/sqlfence"
)

// attempt is one fenced write of the concurrency test, as its writer saw it.
type attempt struct {
	id      int
	token   uint64
	err     error
	highest uint64 // from a refusal
}

// TestConcurrentWritersOneKey: many goroutines write to one key with
// interleaved tokens, some of them stale (a writer that keeps an old token,
// as a paused holder does), across 2^63 (where a signed column would wrap).
// Every admitted write leaves one row, in the order the key's row lock
// admitted them. Checked: the stored token only rises (watched while it
// happens); a stale writer's row never appears (rows in order have
// non-decreasing tokens, and no refused attempt left a row); refusals are
// exactly the tokens below the highest (each admitted token is at least
// every token admitted before it, and each refusal names a highest that
// was admitted and is above its token); nothing deadlocks (a deadline).
func TestConcurrentWritersOneKey(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) { concurrentWriters(t, b, sqlfence.Config{}, 12, 15) })
	}
	t.Run("postgres-serializable", func(t *testing.T) {
		// Every transaction that waited for the row lock while another
		// committed fails with 40001 here, and is retried.
		retries := &countingHandler{}
		concurrentWriters(t, backends[1], sqlfence.Config{Isolation: sql.LevelSerializable, MaxAttempts: 200,
			MaxBackoff: 50 * time.Millisecond, Logger: slog.New(retries)}, 6, 10)
		if retries.n.Load() == 0 {
			t.Fatal("no transaction was retried: the test did not see a serialization failure")
		}
		t.Logf("%d retries", retries.n.Load())
	})
}

func concurrentWriters(t *testing.T, b backend, cfg sqlfence.Config, writers, perWriter int) {
	f, db := newFence(t, b, cfg)
	createNotes(t, b, db)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	const base = 1<<63 - 40 // tokens cross 2^63 halfway
	var next atomic.Uint64
	next.Store(base)
	var mu sync.Mutex
	var attempts []attempt

	// The watcher: the stored token never goes down.
	stopWatch := make(chan struct{})
	watchErr := make(chan error, 1)
	go func() {
		var last uint64
		for {
			select {
			case <-stopWatch:
				watchErr <- nil
				return
			default:
			}
			rec, err := f.Get(ctx, "k")
			if err != nil {
				watchErr <- err
				return
			}
			if rec.Token < last {
				watchErr <- fmt.Errorf("the stored token went down from %d to %d", last, rec.Token)
				return
			}
			last = rec.Token
			time.Sleep(time.Millisecond)
		}
	}()

	var wg sync.WaitGroup
	var ids atomic.Int64
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			var mine uint64
			for i := 0; i < perWriter; i++ {
				// Mostly a fresh token; sometimes the old one again, as a
				// holder that paused and still believes in its grant.
				if mine == 0 || rng.IntN(3) > 0 {
					mine = next.Add(uint64(1 + rng.IntN(3)))
				}
				if rng.IntN(4) == 0 {
					time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
				}
				a := attempt{id: int(ids.Add(1)), token: mine}
				a.err = f.Do(ctx, "k", fence.Credentials{Token: mine, Lock: "L"}, func(ctx context.Context, tx sqlfence.Tx) error {
					_, err := tx.ExecContext(ctx, sqlFor(b, `INSERT INTO notes (k, token, note) VALUES ('k', $1, $2)`),
						fmt.Sprintf("%020d", mine), strconv.Itoa(a.id))
					return err
				})
				var stale *fence.StaleTokenError
				if errors.As(a.err, &stale) {
					a.highest = stale.Highest
				}
				mu.Lock()
				attempts = append(attempts, a)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(stopWatch)
	if err := <-watchErr; err != nil {
		t.Fatal(err)
	}
	if ctx.Err() != nil {
		t.Fatal("the writers did not finish in time: a deadlock?")
	}

	// The rows, in the order the row lock admitted their writes.
	rows, err := db.QueryContext(ctx, `SELECT token, note FROM notes WHERE k = 'k' ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		token uint64
		id    int
	}
	var written []row
	for rows.Next() {
		var tok, id string
		if err := rows.Scan(&tok, &id); err != nil {
			t.Fatal(err)
		}
		r := row{}
		r.token, _ = strconv.ParseUint(tok, 10, 64)
		r.id, _ = strconv.Atoi(id)
		written = append(written, r)
	}
	rows.Close()

	byID := map[int]attempt{}
	admittedTokens := map[uint64]bool{}
	var admitted, refused int
	var highest uint64
	for _, a := range attempts {
		byID[a.id] = a
		switch {
		case a.err == nil:
			admitted++
			admittedTokens[a.token] = true
			highest = max(highest, a.token)
		case errors.Is(a.err, fence.ErrStaleToken):
			refused++
		default:
			t.Fatalf("attempt %d (token %d): %v", a.id, a.token, a.err)
		}
	}
	if admitted == 0 || refused == 0 {
		t.Fatalf("%d admitted, %d refused: the test wants both", admitted, refused)
	}
	if len(written) != admitted {
		t.Fatalf("%d rows for %d admitted writes", len(written), admitted)
	}
	var prev uint64
	for i, r := range written {
		a, ok := byID[r.id]
		if !ok || a.err != nil {
			t.Fatalf("row %d is attempt %d's, which was not admitted (%v): a stale writer's row", i, r.id, a.err)
		}
		if r.token < prev {
			t.Fatalf("row %d has token %d after a row of token %d: a stale write landed", i, r.token, prev)
		}
		prev = r.token
	}
	for _, a := range attempts {
		if a.err == nil {
			continue
		}
		if a.highest <= a.token || !admittedTokens[a.highest] {
			t.Fatalf("attempt %d with token %d refused naming highest %d, which is not an admitted token above it", a.id, a.token, a.highest)
		}
	}
	wantRecord(t, f, "k", highest, "L")
	tokens := make([]uint64, 0, len(admittedTokens))
	for tok := range admittedTokens {
		tokens = append(tokens, tok)
	}
	sort.Slice(tokens, func(i, j int) bool { return tokens[i] < tokens[j] })
	t.Logf("%d writes admitted, %d refused; admitted tokens %d..%d", admitted, refused, tokens[0], tokens[len(tokens)-1])
}

// countingHandler counts the log lines of retries.
type countingHandler struct{ n atomic.Int64 }

func (h *countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countingHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message == "retrying fenced transaction" {
		h.n.Add(1)
	}
	return nil
}
func (h *countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countingHandler) WithGroup(string) slog.Handler      { return h }

// TestHolderInsideTransactionHoldsTheKey: a holder that stops inside fn
// (paused, or just slow) keeps the key's row lock, so the next holder
// waits; when the first commits, its write lands first, which is the token
// order, and then the next holder's. A lower token arriving after a higher
// one committed is refused.
func TestHolderInsideTransactionHoldsTheKey(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		f, db := newFence(t, b, sqlfence.Config{})
		createNotes(t, b, db)
		inside, release := make(chan struct{}), make(chan struct{})
		first := make(chan error, 1)
		go func() {
			first <- f.Do(ctx, "k", fence.Credentials{Token: 5, Lock: "L"}, func(ctx context.Context, tx sqlfence.Tx) error {
				if err := note(b, "k", 5, "five")(ctx, tx); err != nil {
					return err
				}
				close(inside)
				<-release
				return nil
			})
		}()
		<-inside
		second := make(chan error, 1)
		go func() {
			second <- f.Do(ctx, "k", fence.Credentials{Token: 6, Lock: "L"}, note(b, "k", 6, "six"))
		}()
		select {
		case err := <-second:
			t.Fatalf("the next holder's write finished while the first held the key: %v", err)
		case <-time.After(300 * time.Millisecond):
		}
		close(release)
		if err := <-first; err != nil {
			t.Fatal(err)
		}
		if err := <-second; err != nil {
			t.Fatal(err)
		}
		wantStale(t, f.Do(ctx, "k", fence.Credentials{Token: 5, Lock: "L"}, note(b, "k", 5, "late")), 5, 6)
		if got := notes(t, db, b, "k"); len(got) != 2 || got[0] != "five" || got[1] != "six" {
			t.Fatalf("notes = %v, want five, six", got)
		}
	})
}
