package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
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
