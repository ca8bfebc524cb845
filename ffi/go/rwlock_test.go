package ferrolock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	ferrolock "example.invalid/ferrolock/ffi/go"
)

// Two readers hold one key at once; a writer is refused while they do, and readers and
// other writers while a writer holds.
func TestReadWriteExclusion(t *testing.T) {
	a, b := manager(t), manager(t)
	ctx := context.Background()
	k := key("rw")
	r1, err := a.AcquireRead(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := b.TryAcquireRead(ctx, k)
	if err != nil {
		t.Fatalf("a second reader beside the first: %v", err)
	}
	if _, err := b.TryAcquireWrite(ctx, k); !errors.Is(err, ferrolock.ErrNotAcquired) {
		t.Fatalf("a writer while two readers hold: %v, want ErrNotAcquired", err)
	}
	if err := r1.Release(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.TryAcquireWrite(ctx, k); !errors.Is(err, ferrolock.ErrNotAcquired) {
		t.Fatalf("a writer while one reader holds: %v, want ErrNotAcquired", err)
	}
	if err := r2.Release(); err != nil {
		t.Fatal(err)
	}
	w, err := a.AcquireWrite(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.TryAcquireRead(ctx, k); !errors.Is(err, ferrolock.ErrNotAcquired) {
		t.Fatalf("a reader while a writer holds: %v, want ErrNotAcquired", err)
	}
	if _, err := b.TryAcquireWrite(ctx, k); !errors.Is(err, ferrolock.ErrNotAcquired) {
		t.Fatalf("a second writer: %v, want ErrNotAcquired", err)
	}
	if err := w.Release(); err != nil {
		t.Fatal(err)
	}
}

// An owner (a WithReadLock scope, reentrant) holding only the read side is refused the
// write side with an error that says why; a read ttl above 30 s is refused naming it.
func TestReadWriteRefusals(t *testing.T) {
	m := manager(t, ferrolock.Reentrant(true))
	k := key("rw-upgrade")
	err := m.WithReadLock(context.Background(), k, func(ctx context.Context, _ *ferrolock.Lock) error {
		_, err := m.TryAcquireWrite(ctx, k)
		return err
	})
	if !errors.Is(err, ferrolock.ErrInvalidArgument) || !strings.Contains(err.Error(), "read->write upgrade is refused") {
		t.Fatalf("an upgrade inside WithReadLock: %v, want a refused upgrade", err)
	}
	_, err = m.AcquireRead(context.Background(), key("rw-ttl"), ferrolock.TTL(31e9))
	if !errors.Is(err, ferrolock.ErrInvalidArgument) || !strings.Contains(err.Error(), "31s") {
		t.Fatalf("a read ttl of 31 s: %v, want ErrInvalidArgument naming 31s", err)
	}
	_, err = m.AcquireWrite(context.Background(), "")
	if !errors.Is(err, ferrolock.ErrInvalidArgument) {
		t.Fatalf("an empty key: %v, want ErrInvalidArgument", err)
	}
}

// A scope is the owner of both sides without Reentrant, as in every binding: under its own
// read hold it is refused the write side at once (before, it waited for itself forever), and
// under its own write hold it takes the read side (a downgrade). A plain lock that the scope
// holds is refused to a nested acquire that is not reentrant on both, naming the deadlock,
// while a ctx outside the scope just finds the key held.
func TestAScopeNeverWaitsForItself(t *testing.T) {
	m := manager(t)
	k := key("rw-self")
	bounded := func(ctx context.Context) (context.Context, context.CancelFunc) {
		return context.WithTimeout(ctx, 20*time.Second)
	}
	err := m.WithReadLock(context.Background(), k, func(ctx context.Context, _ *ferrolock.Lock) error {
		c, cancel := bounded(ctx)
		defer cancel()
		_, err := m.AcquireWrite(c, k)
		return err
	})
	if !errors.Is(err, ferrolock.ErrInvalidArgument) || !strings.Contains(err.Error(), "read->write upgrade is refused") {
		t.Fatalf("an upgrade inside WithReadLock: %v, want a refused upgrade", err)
	}
	err = m.WithWriteLock(context.Background(), k, func(ctx context.Context, _ *ferrolock.Lock) error {
		c, cancel := bounded(ctx)
		defer cancel()
		r, err := m.AcquireRead(c, k)
		if err != nil {
			return err
		}
		return r.Release()
	})
	if err != nil {
		t.Fatalf("a downgrade inside WithWriteLock: %v", err)
	}
	plain := key("plain-self")
	for _, reentrant := range []bool{false, true} {
		err = m.WithLock(context.Background(), plain, func(ctx context.Context, _ *ferrolock.Lock) error {
			c, cancel := bounded(ctx)
			defer cancel()
			_, err := m.Acquire(c, plain, ferrolock.Reentrant(reentrant))
			if !errors.Is(err, ferrolock.ErrNotAcquired) || !strings.Contains(err.Error(), "would deadlock") {
				t.Errorf("reentrant %v inside a plain WithLock: %v, want ErrNotAcquired naming the deadlock", reentrant, err)
			}
			// Another owner, outside the scope, finds it held.
			_, err = m.TryAcquire(context.Background(), plain)
			if !errors.Is(err, ferrolock.ErrNotAcquired) || strings.Contains(err.Error(), "deadlock") {
				t.Errorf("outside the scope: %v, want ErrNotAcquired, held", err)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	// Reentrant on both: the owner re-enters.
	err = m.WithLock(context.Background(), plain, func(ctx context.Context, _ *ferrolock.Lock) error {
		c, cancel := bounded(ctx)
		defer cancel()
		l, err := m.Acquire(c, plain, ferrolock.Reentrant(true))
		if err != nil {
			return err
		}
		return l.Release()
	}, ferrolock.Reentrant(true))
	if err != nil {
		t.Fatalf("a reentrant re-entry: %v", err)
	}
	// Released early by fn: a nested acquire waits for nobody.
	err = m.WithLock(context.Background(), plain, func(ctx context.Context, l *ferrolock.Lock) error {
		if err := l.Release(); err != nil {
			return err
		}
		c, cancel := bounded(ctx)
		defer cancel()
		again, err := m.Acquire(c, plain)
		if err != nil {
			return err
		}
		return again.Release()
	})
	if err != nil {
		t.Fatalf("after fn released the scope's lock: %v", err)
	}
}

// WithReadLock and WithWriteLock release on return and when fn panics: a writer (a reader)
// of another manager gets the key afterwards.
func TestWithReadWriteLockRelease(t *testing.T) {
	m, other := manager(t), manager(t)
	ctx := context.Background()
	k := key("rw-with")
	held := false
	err := m.WithReadLock(ctx, k, func(ctx context.Context, l *ferrolock.Lock) error {
		_, err := other.TryAcquireWrite(ctx, k)
		held = errors.Is(err, ferrolock.ErrNotAcquired)
		return nil
	})
	if err != nil || !held {
		t.Fatalf("WithReadLock: %v (writer kept out inside: %v)", err, held)
	}
	w, err := other.TryAcquireWrite(ctx, k)
	if err != nil {
		t.Fatalf("a writer after WithReadLock returned: %v", err)
	}
	w.Release()

	recovered := func() (r any) {
		defer func() { r = recover() }()
		m.WithReadLock(ctx, k, func(context.Context, *ferrolock.Lock) error { panic("boom in reader") })
		return nil
	}()
	if recovered != "boom in reader" {
		t.Fatalf("the caller recovered %v, want fn's panic", recovered)
	}
	w, err = other.TryAcquireWrite(ctx, k)
	if err != nil {
		t.Fatalf("a writer after WithReadLock's fn panicked: %v", err)
	}
	w.Release()

	recovered = func() (r any) {
		defer func() { r = recover() }()
		m.WithWriteLock(ctx, k, func(context.Context, *ferrolock.Lock) error { panic("boom in writer") })
		return nil
	}()
	if recovered != "boom in writer" {
		t.Fatalf("the caller recovered %v, want fn's panic", recovered)
	}
	r, err := other.TryAcquireRead(ctx, k)
	if err != nil {
		t.Fatalf("a reader after WithWriteLock's fn panicked: %v", err)
	}
	r.Release()
}

// A writer waiting behind a reader, cancelled through its context, leaves nothing behind:
// neither a hold nor a place in the queue that would keep the next writer's first try out.
func TestReadWriteContextCancel(t *testing.T) {
	reader, waiter, next := manager(t), manager(t), manager(t)
	k := key("rw-cancel")
	r, err := reader.AcquireRead(context.Background(), k)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan error, 1)
	go func() {
		_, err := waiter.AcquireWrite(ctx, k)
		got <- err
	}()
	// Cancelled while it waits (the reader holds, so it cannot have been granted).
	time.Sleep(100 * time.Millisecond)
	cancel()
	if err := <-got; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled wait: %v, want context.Canceled", err)
	}
	if err := r.Release(); err != nil {
		t.Fatal(err)
	}
	w, err := next.TryAcquireWrite(context.Background(), k)
	if err != nil {
		t.Fatalf("a writer's first try after a cancelled writer and the reader's release: %v", err)
	}
	if err := w.Release(); err != nil {
		t.Fatal(err)
	}
	for _, port := range ports {
		if n := keysNamed(t, port, k); n != 0 {
			t.Fatalf("%d keys named %s left on :%d", n, k, port)
		}
	}
}
