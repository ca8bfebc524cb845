// Takes a lock on the nodes in FERROLOCK_NODES, works under it, releases it.
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	ferrolock "example.invalid/ferrolock/ffi/go"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second) // the wait's bound
	defer cancel()
	err := ferrolock.WithLock(ctx, "orders:1001", func(ctx context.Context, l *ferrolock.Lock) error {
		// ctx is cancelled if the lock is lost (before its validity ends).
		fmt.Printf("holding %s for %v more (renewed while held)\n", l.Key(), l.Validity().Round(time.Millisecond))
		return nil
	}, ferrolock.TTL(10*time.Second))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
