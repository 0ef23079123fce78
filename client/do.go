package client

import (
	"context"
	"fmt"
	"sync"
)

// Do acquires lock name (as Acquire, with opts), runs fn with the lock's
// fencing token, and releases the lock after fn returns. The ctx fn gets is
// cancelled the moment the lock is lost, with the loss as its cause
// (context.Cause). Do returns fn's error; if fn returned nil but the lock
// was lost meanwhile, an error wrapping the loss; else the release's error.
func (c *Client) Do(ctx context.Context, name string, fn func(ctx context.Context, token uint64) error, opts ...AcquireOption) error {
	l, err := c.Acquire(ctx, name, opts...)
	if err != nil {
		return err
	}
	fctx, cancel := context.WithCancelCause(ctx)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		select {
		case <-l.Lost():
			cancel(fmt.Errorf("lockd: lock %q lost: %w", name, l.Err()))
		case <-stop:
		}
	}()
	ferr := fn(fctx, l.Token())
	close(stop)
	wg.Wait()
	cancel(nil)
	lostErr := l.Err()

	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.CloseTimeout)
	rerr := l.Release(rctx)
	rcancel()
	switch {
	case ferr != nil:
		return ferr
	case lostErr != nil:
		return fmt.Errorf("lockd: lock %q was lost while fn ran: %w", name, lostErr)
	}
	return rerr
}
