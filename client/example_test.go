package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/client"
	"github.com/lockd/lockd/client/lockdtest"
)

// Hold a lock for a piece of work. The work's ctx is cancelled the moment
// the lock is lost; the token goes with every write the work does.
func ExampleClient_Do() {
	ctx := context.Background()
	c, err := client.New(ctx, client.Config{Endpoints: []string{"http://127.0.0.1:7070"}})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	err = c.Do(ctx, "nightly-report", func(ctx context.Context, token uint64) error {
		return writeReport(ctx, token)
	}, client.WithWaitTimeout(time.Minute))
	if errors.Is(err, client.ErrWaitTimeout) {
		log.Print("someone else is still writing the report")
	}
}

func writeReport(ctx context.Context, token uint64) error { return nil }

// Acquire, watch Lost, release.
func ExampleClient_Acquire() {
	ctx := context.Background()
	c, err := client.New(ctx, client.Config{
		Endpoints:  []string{"http://10.0.0.1:7070", "http://10.0.0.2:7070", "http://10.0.0.3:7070"},
		ClientID:   "worker-7",
		SessionTTL: 10 * time.Second,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	l, err := c.Acquire(ctx, "payment-processor", client.WithWaitTimeout(30*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer l.Release(ctx)
	for {
		select {
		case <-l.Lost():
			log.Printf("lost %s: %v; stop writing now", l.Name(), l.Err())
			return
		case <-time.After(time.Second):
			// one step of work, fenced with l.Token()
		}
	}
}

// Pass the fencing token to a resource server such as fencestore.
func ExampleLock_Fence() {
	ctx := context.Background()
	c, err := client.New(ctx, client.Config{Endpoints: []string{"http://127.0.0.1:7070"}})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	l, err := c.TryAcquire(ctx, "orders")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Release(ctx)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPut, "http://127.0.0.1:7090/v1/objects/orders", nil)
	l.Fence(req) // Fencing-Token, Fencing-Lock, Fencing-Proof
	_, _ = http.DefaultClient.Do(req)
}

// A lock with a TTL of its own, renewed by the client while held.
func ExampleWithAutoRenew() {
	ctx := context.Background()
	c, err := client.New(ctx, client.Config{Endpoints: []string{"http://127.0.0.1:7070"}})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	l, err := c.Acquire(ctx, "leader-election", client.WithTTL(5*time.Second), client.WithAutoRenew())
	if err != nil {
		log.Fatal(err)
	}
	<-l.Lost()
}

// Match errors by sentinel; the server's code and message are there too.
func ExampleServerError() {
	var err error = &client.ServerError{API: api.Error{Code: api.CodeLockHeld, Message: "lock x is held"}, Status: 409, Holder: "worker-3"}
	var ae *api.Error
	fmt.Println(errors.Is(err, client.ErrLockHeld), errors.Is(err, client.ErrWaitTimeout))
	fmt.Println(errors.As(err, &ae), ae.Code)
	fmt.Println(err)
	// Output:
	// true false
	// true lock_held
	// lockd: lock_held: lock x is held (held by worker-3)
}

// The whole cycle against the in-memory fake of package lockdtest.
func Example() {
	fake := lockdtest.New(lockdtest.Options{})
	defer fake.Close()
	ctx := context.Background()

	c, err := client.New(ctx, client.Config{Endpoints: fake.URLs(), ClientID: "example"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	l, err := c.Acquire(ctx, "jobs/nightly")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("holding", l.Name(), "with token", l.Token())
	if _, err := c.API().Acquire(ctx, "jobs/nightly", "someone-else", 0, 0); errors.Is(err, client.ErrLockHeld) {
		fmt.Println("someone-else:", err)
	}
	if err := l.Release(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("released; lost:", l.Err())
	// Output:
	// holding jobs/nightly with token 1
	// someone-else: lockd: lock_held: lock jobs/nightly not acquired (held by example)
	// released; lost: lockd: lock released
}

// A read-write lock: readers hold it WithShared, together; a writer holds
// it alone. Queues are FIFO across modes, so a writer waiting behind
// readers is not overtaken by readers that come after it.
func ExampleWithShared() {
	ctx := context.Background()
	c, err := client.New(ctx, client.Config{Endpoints: []string{"http://127.0.0.1:7070"}})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	read := func() error {
		l, err := c.Acquire(ctx, "catalog", client.WithShared(), client.WithWaitTimeout(10*time.Second))
		if err != nil {
			return err
		}
		defer l.Release(ctx)
		return readCatalog(ctx, l) // l.Mode() == api.ModeShared
	}
	write := func() error {
		l, err := c.Acquire(ctx, "catalog", client.WithWaitTimeout(10*time.Second))
		if err != nil {
			return err
		}
		defer l.Release(ctx)
		// A resource server that checks proofs refuses a shared grant's
		// writes: only the exclusive holder's token writes.
		return writeCatalog(ctx, l)
	}
	if err := read(); err != nil {
		log.Print(err)
	}
	if err := write(); err != nil {
		log.Print(err)
	}
}

func readCatalog(ctx context.Context, l *client.Lock) error  { return nil }
func writeCatalog(ctx context.Context, l *client.Lock) error { return nil }

// A semaphore: at most 4 exports run at once across the fleet, each with
// a fencing token of its own. Every client names the same limit; one that
// names another gets ErrLimitMismatch while the lock is in use.
func ExampleWithLimit() {
	ctx := context.Background()
	c, err := client.New(ctx, client.Config{Endpoints: []string{"http://127.0.0.1:7070"}})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	err = c.Do(ctx, "exports", func(ctx context.Context, token uint64) error {
		return runExport(ctx, token)
	}, client.WithLimit(4), client.WithWaitTimeout(time.Minute))
	switch {
	case errors.Is(err, client.ErrWaitTimeout):
		log.Print("4 exports are running; try later")
	case errors.Is(err, client.ErrLimitMismatch):
		log.Print("the exports lock is in use with another limit")
	}
}

func runExport(ctx context.Context, token uint64) error { return nil }

// A money transfer holds both accounts at once: AcquireMany takes every
// lock in one step or none, in a single queue position per lock, so two
// transfers between the same accounts in opposite directions cannot
// deadlock. The locks come back in name order and share one fate: if one
// is lost, Lost closes on both.
func ExampleClient_AcquireMany() {
	fake := lockdtest.New(lockdtest.Options{})
	defer fake.Close()
	ctx := context.Background()
	c, err := client.New(ctx, client.Config{Endpoints: fake.URLs(), ClientID: "payments"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	transfer := func(from, to string, cents int) error {
		ls, err := c.AcquireMany(ctx, []string{"accounts/" + from, "accounts/" + to}, client.WithWaitTimeout(5*time.Second))
		if err != nil {
			return err
		}
		defer func() {
			for _, l := range ls {
				l.Release(ctx)
			}
		}()
		for _, l := range ls {
			fmt.Printf("holding %s with token %d\n", l.Name(), l.Token())
		}
		select {
		case <-ls[0].Lost(): // the same as ls[1].Lost()
			return ls[0].Err()
		default:
		}
		// Debit and credit here, each write fenced with its account's
		// token (Lock.Fence).
		return nil
	}
	if err := transfer("bob", "alice", 500); err != nil {
		log.Fatal(err)
	}
	// Output:
	// holding accounts/alice with token 1
	// holding accounts/bob with token 2
}

// A singleton scheduler: every replica runs this, and exactly one of them
// schedules at a time. A replica campaigns; once elected it schedules until
// its leadership ends (Done: its session expired because it was cut off,
// or the lock was revoked), then stops at once and campaigns again. On
// SIGTERM it resigns, and the next replica takes over in the same step.
// The fencing token goes with every write the scheduler makes, so a
// deposed leader's late writes are refused.
func ExampleElection() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	c, err := client.New(ctx, client.Config{Endpoints: []string{"http://127.0.0.1:7070"}, SessionTTL: 10 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	host, _ := os.Hostname()
	e := client.NewElection(c, "scheduler")
	for ctx.Err() == nil {
		if err := e.Campaign(ctx, host); err != nil {
			if ctx.Err() == nil {
				log.Printf("campaign: %v", err)
				time.Sleep(time.Second)
			}
			continue
		}
		log.Printf("leading with token %d", e.Token())
		// The scheduler's ctx ends when the leadership does.
		sctx, cancel := context.WithCancel(ctx)
		go func() {
			select {
			case <-e.Done():
			case <-sctx.Done():
			}
			cancel()
		}()
		runScheduler(sctx, e.Token())
		cancel()
		if ctx.Err() == nil {
			log.Printf("leadership lost: %v", e.Err())
		}
	}
	rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := e.Resign(rctx); err != nil {
		log.Printf("resign: %v (the session's end releases it)", err)
	}
}

// runScheduler schedules jobs until ctx ends, fencing every write with
// token.
func runScheduler(ctx context.Context, token uint64) { <-ctx.Done() }

// Follow who leads, from anywhere.
func ExampleElection_Observe() {
	fake := lockdtest.New(lockdtest.Options{})
	defer fake.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	newClient := func(id string) *client.Client {
		c, err := client.New(ctx, client.Config{Endpoints: fake.URLs(), ClientID: id})
		if err != nil {
			log.Fatal(err)
		}
		return c
	}
	a, b, o := newClient("a"), newClient("b"), newClient("observer")
	defer a.Close()
	defer b.Close()
	defer o.Close()

	leaders, err := client.NewElection(o, "db-primary").Observe(ctx)
	if err != nil {
		log.Fatal(err)
	}
	ea := client.NewElection(a, "db-primary")
	if err := ea.Campaign(ctx, "10.0.0.1:5432"); err != nil {
		log.Fatal(err)
	}
	show := func(li client.LeaderInfo) { fmt.Println(li.Value, "by", li.ClientID, "token", li.Token) }
	show(<-leaders)
	elected := make(chan error, 1)
	go func() { elected <- client.NewElection(b, "db-primary").Campaign(ctx, "10.0.0.2:5432") }()
	for len(fake.Waiters("db-primary")) == 0 {
		time.Sleep(10 * time.Millisecond) // b queues behind a
	}
	if err := ea.Resign(ctx); err != nil {
		log.Fatal(err)
	}
	show(<-leaders)
	fmt.Println("b elected:", <-elected == nil)
	// Output:
	// 10.0.0.1:5432 by a token 1
	// 10.0.0.2:5432 by b token 2
	// b elected: true
}

// Follow every lock under a prefix as it changes.
func ExampleClient_WatchPrefix() {
	ctx := context.Background()
	c, err := client.New(ctx, client.Config{Endpoints: []string{"http://127.0.0.1:7070"}})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	events, err := c.WatchPrefix(ctx, "jobs/")
	if err != nil {
		log.Fatal(err)
	}
	for ev := range events {
		if ev.Status.Held {
			log.Printf("%s held by %s (token %d) at index %d", ev.Lock, ev.Status.ClientID, ev.Status.FencingToken, ev.Index)
		} else {
			log.Printf("%s free at index %d", ev.Lock, ev.Index)
		}
	}
}
