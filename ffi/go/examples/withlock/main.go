// Takes a lock on the nodes in FERROLOCK_NODES, works under it, releases it.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	ferrolock "example.invalid/ferrolock/ffi/go"
)

func main() {
	err := ferrolock.WithLock(context.Background(), "orders:1001", func(ctx context.Context, l *ferrolock.Lock) error {
		// ctx is cancelled if the lock is lost (before its validity ends).
		ctx, cancel := context.WithTimeout(ctx, time.Minute) // bounds the work
		defer cancel()
		fmt.Printf("holding %s for %v more (renewed while held)\n", l.Key(), l.Validity().Round(time.Millisecond))
		return ctx.Err()
	}, ferrolock.Wait(5*time.Second), ferrolock.TTL(10*time.Second)) // Wait bounds the wait only
	switch {
	case errors.Is(err, ferrolock.ErrNotAcquired):
		fmt.Fprintln(os.Stderr, "still held elsewhere after 5 s of waiting:", err)
		os.Exit(1)
	case err != nil:
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
