package ferrolock_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	ferrolock "example.invalid/ferrolock/ffi/go"
)

// oneNode is a manager on the first test node: a semaphore lives on one node.
func oneNode(t *testing.T, opts ...ferrolock.Option) *ferrolock.Manager {
	return manager(t, append([]ferrolock.Option{ferrolock.Nodes(fmt.Sprintf("redis://127.0.0.1:%d", ports[0]))}, opts...)...)
}

// Goroutines of two managers never hold more than the permits at once, and do reach them.
func TestPermitsExclusion(t *testing.T) {
	a, b := oneNode(t), oneNode(t)
	name := key("sem")
	const permits = 2
	var mu sync.Mutex
	inside, most := 0, 0
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := 0; i < 6; i++ {
		m := a
		if i%2 == 1 {
			m = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 3; j++ {
				err := m.WithPermit(context.Background(), name, permits, func(context.Context, *ferrolock.Lock) error {
					mu.Lock()
					inside++
					most = max(most, inside)
					mu.Unlock()
					time.Sleep(20 * time.Millisecond)
					mu.Lock()
					inside--
					mu.Unlock()
					return nil
				})
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if most > permits || most < permits {
		t.Fatalf("%d holders at once, permits %d", most, permits)
	}
}

// Count takes several permits; the package-level WithPermit releases when fn panics.
func TestPermitsCountAndPanic(t *testing.T) {
	m := oneNode(t)
	ctx := context.Background()
	name := key("sem-count")
	two, err := m.AcquirePermits(ctx, name, 3, ferrolock.Count(2))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.TryAcquirePermits(ctx, name, 3, ferrolock.Count(2)); !errors.Is(err, ferrolock.ErrNotAcquired) {
		t.Fatalf("2 more of 3 while 2 are held: %v, want ErrNotAcquired", err)
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("fn's panic was swallowed")
			}
		}()
		m.WithPermit(ctx, name, 3, func(context.Context, *ferrolock.Lock) error { panic("boom") })
	}()
	// The panicking holder gave its permit back: the last one is free.
	one, err := m.TryAcquirePermits(ctx, name, 3)
	if err != nil {
		t.Fatalf("the last permit after a panic in WithPermit: %v", err)
	}
	if err := two.Release(); err != nil {
		t.Fatal(err)
	}
	if err := one.Release(); err != nil {
		t.Fatal(err)
	}
	all, err := m.TryAcquirePermits(ctx, name, 3, ferrolock.Count(3))
	if err != nil {
		t.Fatalf("all 3 permits after every release: %v", err)
	}
	all.Release()
}

// Permits of a name that ctx's own WithLock scope holds as a lock would wait for that lock,
// which goes only when fn returns: refused at once, as Python's, Node's and the CLI's scopes
// refuse it, instead of waiting until ctx is done. Another WithLock's ctx waits as ever.
func TestPermitsInsideAWithLockOfTheirNameAreRefused(t *testing.T) {
	m := oneNode(t)
	name := key("sem-self")
	err := m.WithLock(context.Background(), name, func(ctx context.Context, _ *ferrolock.Lock) error {
		c, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		for _, try := range []func() (*ferrolock.Lock, error){
			func() (*ferrolock.Lock, error) { return m.AcquirePermits(c, name, 2) },
			func() (*ferrolock.Lock, error) { return m.TryAcquirePermits(c, name, 2) },
		} {
			p, err := try()
			if !errors.Is(err, ferrolock.ErrNotAcquired) || !strings.Contains(err.Error(), "would deadlock") {
				p.Release()
				t.Errorf("permits inside a WithLock of their name: %v, want ErrNotAcquired naming the deadlock", err)
			}
		}
		err := m.WithPermit(c, name, 2, func(context.Context, *ferrolock.Lock) error {
			t.Error("WithPermit ran fn inside a WithLock of its name")
			return nil
		})
		if !errors.Is(err, ferrolock.ErrNotAcquired) || !strings.Contains(err.Error(), "would deadlock") {
			t.Errorf("WithPermit inside a WithLock of its name: %v, want ErrNotAcquired naming the deadlock", err)
		}
		// Outside the scope, the lock is held by someone else: permits wait for it.
		_, err = m.TryAcquirePermits(context.Background(), name, 2)
		if !errors.Is(err, ferrolock.ErrNotAcquired) || strings.Contains(err.Error(), "deadlock") {
			t.Errorf("outside the scope: %v, want ErrNotAcquired, held", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Once the lock is released, the same permits are granted.
	p, err := m.TryAcquirePermits(context.Background(), name, 2)
	if err != nil {
		t.Fatalf("after the WithLock: %v", err)
	}
	if err := p.Release(); err != nil {
		t.Fatal(err)
	}
}

// Permits asked for inside the ctx's own WithPermit scopes of the name, which leave fewer
// free than asked, would wait for those scopes, which end only after the wait: refused at
// once, as Python's, Node's and the CLI's nested semaphores are. Asks the pool can still
// meet are granted, and goroutines started beside each other inside one scope still wait for
// each other.
func TestPermitsInsideTheirOwnWithPermitThatLeaveTooFewAreRefused(t *testing.T) {
	m := oneNode(t)
	name := key("sem-nested")
	err := m.WithPermit(context.Background(), name, 2, func(ctx context.Context, _ *ferrolock.Lock) error {
		c, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		// One of the two is left: granted.
		if err := m.WithPermit(c, name, 2, func(ctx context.Context, _ *ferrolock.Lock) error {
			// None is left but what the enclosing scopes hold.
			p, err := m.AcquirePermits(ctx, name, 2)
			if err == nil {
				p.Release()
			}
			if !errors.Is(err, ferrolock.ErrNotAcquired) || !strings.Contains(err.Error(), "would deadlock") {
				t.Errorf("AcquirePermits inside WithPermit scopes holding all: %v, want ErrNotAcquired naming the deadlock", err)
			}
			return nil
		}); err != nil {
			t.Errorf("1 of 2 permits inside a scope holding 1: %v", err)
		}
		err := m.WithPermit(c, name, 2, func(context.Context, *ferrolock.Lock) error {
			t.Error("WithPermit ran fn with more permits than its scopes leave")
			return nil
		}, ferrolock.Count(2))
		if !errors.Is(err, ferrolock.ErrNotAcquired) || !strings.Contains(err.Error(), "would deadlock") {
			t.Errorf("2 of 2 permits inside a scope holding 1: %v, want ErrNotAcquired naming the deadlock", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Siblings inside one scope: each waits for the other's permits, not for its scope.
	name = key("sem-siblings")
	err = m.WithPermit(context.Background(), name, 3, func(ctx context.Context, _ *ferrolock.Lock) error {
		var wg sync.WaitGroup
		errs := make(chan error, 2)
		for i := 0; i < 2; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs <- m.WithPermit(ctx, name, 3, func(context.Context, *ferrolock.Lock) error {
					time.Sleep(50 * time.Millisecond)
					return nil
				}, ferrolock.Count(2))
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Errorf("a sibling's 2 of 3 permits beside its scope's 1: %v", err)
			}
		}
		return nil
	}, ferrolock.Count(1))
	if err != nil {
		t.Fatal(err)
	}
}

// A ctx done while waiting returns ctx.Err() and leaves no permit taken.
func TestPermitsContextCancel(t *testing.T) {
	m, other := oneNode(t), oneNode(t)
	name := key("sem-cancel")
	held, err := m.AcquirePermits(context.Background(), name, 1)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan error, 1)
	go func() {
		_, err := other.AcquirePermits(ctx, name, 1)
		got <- err
	}()
	// Cancelled while it waits (the permit is held, so it cannot have been granted).
	time.Sleep(100 * time.Millisecond)
	cancel()
	if err := <-got; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled wait: %v, want context.Canceled", err)
	}
	if err := held.Release(); err != nil {
		t.Fatal(err)
	}
	l, err := m.TryAcquirePermits(context.Background(), name, 1)
	if err != nil {
		t.Fatalf("the permit after a cancelled wait and a release: %v (the cancelled acquire kept it)", err)
	}
	l.Release()
}

// Bad input is refused naming the bad value.
func TestPermitsBadInput(t *testing.T) {
	m := oneNode(t)
	ctx := context.Background()
	name := key("sem-bad")
	for _, c := range []struct {
		name    string
		permits int
		opts    []ferrolock.Option
		want    string
	}{
		{name, 0, nil, "permits 0"},
		{name, -1, nil, fmt.Sprintf("semaphore %q: permits -1", name)},
		{name, 2, []ferrolock.Option{ferrolock.Count(3)}, "count 3"},
		{name, 2, []ferrolock.Option{ferrolock.Count(-2)}, fmt.Sprintf("semaphore %q: count -2", name)},
		{"a{b}", 2, nil, "a{b}"},
		{"a}b", 2, nil, "a}b"},
		{"", 2, nil, "empty"},
		{"a\x00b", 2, nil, "NUL"},
	} {
		if _, err := m.TryAcquirePermits(ctx, c.name, c.permits, c.opts...); !errors.Is(err, ferrolock.ErrInvalidArgument) ||
			!strings.Contains(err.Error(), c.want) {
			t.Errorf("%q permits %d: %v, want ErrInvalidArgument naming %q", c.name, c.permits, err, c.want)
		}
	}
	if len(ports) > 1 {
		several := manager(t)
		if _, err := several.AcquirePermits(ctx, name, 2); !errors.Is(err, ferrolock.ErrInvalidArgument) ||
			!strings.Contains(err.Error(), "one node") {
			t.Errorf("%d nodes: %v, want ErrInvalidArgument saying one node", len(ports), err)
		}
	}
	// An extend's refused ttl names the semaphore, too short or too long.
	p, err := m.TryAcquirePermits(ctx, name, 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, ttl := range []time.Duration{50 * time.Millisecond, time.Duration(math.MaxInt64)} {
		if _, err := p.Extend(ctx, ttl); !errors.Is(err, ferrolock.ErrInvalidArgument) ||
			!strings.Contains(err.Error(), fmt.Sprintf("semaphore %q: ttl", name)) {
			t.Errorf("Extend(ctx, %v) of a semaphore's permit: %v, want ErrInvalidArgument naming the semaphore", ttl, err)
		}
	}
	if err := p.Release(); err != nil {
		t.Fatal(err)
	}
	// Once released, its calls say so naming the semaphore, as its other errors do.
	released := fmt.Sprintf("semaphore %q was", name)
	for what, err := range map[string]error{
		"a second Release": p.Release(),
		"Err":              p.Err(),
		"Extend":           func() error { _, err := p.Extend(ctx); return err }(),
	} {
		if !errors.Is(err, ferrolock.ErrNotHeld) || !strings.Contains(err.Error(), released) {
			t.Errorf("%s of a released permit: %v, want ErrNotHeld naming the semaphore", what, err)
		}
	}
	if _, err := m.TryAcquire(ctx, key("lock"), ferrolock.Count(2)); !errors.Is(err, ferrolock.ErrInvalidArgument) ||
		!strings.Contains(err.Error(), "count=2: Count is an option of AcquirePermits") {
		t.Errorf("Count on a lock: %v, want ErrInvalidArgument saying where Count belongs", err)
	}
	if _, err := ferrolock.NewManager(ferrolock.Count(2)); !errors.Is(err, ferrolock.ErrInvalidArgument) ||
		!strings.Contains(err.Error(), "Count is an option of AcquirePermits") {
		t.Errorf("Count on a manager: %v, want ErrInvalidArgument saying where Count belongs", err)
	}
}

// Set("count", n) takes n of any Go integer type, as Set promises (and max_extensions does).
func TestSetCountTakesEveryIntegerType(t *testing.T) {
	m := oneNode(t)
	ctx := context.Background()
	type permits uint16
	for _, v := range []any{int64(2), uint(2), uint32(2), permits(2)} {
		name := key("sem-count-types")
		two, err := m.TryAcquirePermits(ctx, name, 3, ferrolock.Set("count", v))
		if err != nil {
			t.Fatalf("Set(\"count\", %v) (%T): %v", v, v, err)
		}
		if _, err := m.TryAcquirePermits(ctx, name, 3, ferrolock.Count(2)); !errors.Is(err, ferrolock.ErrNotAcquired) {
			t.Errorf("Set(\"count\", %v) (%T) took fewer than 2 of 3 permits: a second 2 got %v", v, v, err)
		}
		two.Release()
	}
	for _, v := range []uint64{math.MaxUint32 + 1, math.MaxUint64} {
		if _, err := m.TryAcquirePermits(ctx, key("sem-count-types"), 3, ferrolock.Set("count", v)); !errors.Is(err, ferrolock.ErrInvalidArgument) ||
			!strings.Contains(err.Error(), fmt.Sprintf("count %d:", v)) {
			t.Errorf("Set(\"count\", uint64(%d)): %v, want ErrInvalidArgument naming it", v, err)
		}
	}
}
