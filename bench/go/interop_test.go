package main

import (
	"context"
	"errors"
	"testing"
	"time"

	ferrolock "example.invalid/ferrolock/ffi/go"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"
)

// ferrolock's plain lock and redsync's mutex have the same layout (a string at the key
// itself, SET NX PX, released by compare-and-delete), so a Go program moving from redsync to
// ferrolock can run both side by side: each must see the other's lock as taken.
func TestRedsyncAndFerrolockExcludeEachOtherOnOneKey(t *testing.T) {
	s, err := startServer()
	if err != nil {
		t.Fatal(err)
	}
	defer s.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := redis.NewClient(&redis.Options{Addr: s.Addr, DisableIdentity: true})
	defer c.Close()
	rs := redsync.New(goredis.NewPool(c))
	m, err := ferrolockManager([]string{s.URL})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	const key = "interop:orders"
	mutex := rs.NewMutex(key, redsync.WithExpiry(ttl), redsync.WithTries(1))

	// ferrolock holds it: redsync is refused, and sees ferrolock's token at the key.
	l, err := m.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Get(ctx, key).Val(); got != l.Token() {
		t.Fatalf("value at %q = %q, want ferrolock's token %q", key, got, l.Token())
	}
	var taken *redsync.ErrTaken
	if err := mutex.LockContext(ctx); !errors.As(err, &taken) {
		t.Fatalf("redsync while ferrolock holds %q: err = %v, want ErrTaken", key, err)
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}

	// redsync holds it: ferrolock is refused, and gets it once redsync lets go.
	if err := mutex.LockContext(ctx); err != nil {
		t.Fatalf("redsync after ferrolock's release: %v", err)
	}
	if _, err := m.TryAcquire(ctx, key); !errors.Is(err, ferrolock.ErrNotAcquired) {
		t.Fatalf("ferrolock while redsync holds %q: err = %v, want ErrNotAcquired", key, err)
	}
	if ok, err := mutex.UnlockContext(ctx); !ok || err != nil {
		t.Fatalf("redsync unlock: %v %v", ok, err)
	}
	l, err = m.TryAcquire(ctx, key)
	if err != nil {
		t.Fatalf("ferrolock after redsync's unlock: %v", err)
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	if n := c.Exists(ctx, key).Val(); n != 0 {
		t.Fatalf("%q still exists after both released", key)
	}
}
