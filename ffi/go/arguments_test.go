package ferrolock_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	ferrolock "example.invalid/ferrolock/ffi/go"
)

// noPanic runs f, turning a panic into an error: a misuse that panics deep inside the
// package fails its case instead of ending the test binary.
func noPanic(f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panicked: %v", r)
		}
	}()
	return f()
}

// invalidNaming fails unless err is ErrInvalidArgument with want in its message.
func invalidNaming(t *testing.T, what string, err error, want string) {
	t.Helper()
	var fe *ferrolock.Error
	if !errors.Is(err, ferrolock.ErrInvalidArgument) || !errors.As(err, &fe) || !strings.Contains(fe.Message, want) {
		t.Errorf("%s: %v (want INVALID_ARGUMENT naming %q)", what, err, want)
	}
}

// A nil fn is refused before the key is taken: it used to be called, and panic, with the lock
// held (released only by the deferred end of scope, had the caller recovered).
func TestANilFnIsRefusedBeforeAcquiring(t *testing.T) {
	// As TestDefaultWithLock: whichever of the two makes the default manager, it is this one.
	t.Setenv("FERROLOCK_NODES", fmt.Sprintf("redis://127.0.0.1:%d", ports[0]))
	ctx := context.Background()
	m, one := manager(t), oneNode(t)
	part := key("nil-fn")
	var fn func(context.Context, *ferrolock.Lock) error
	cases := []struct {
		op   string
		call func(k string) error
	}{
		{"WithLock", func(k string) error { return m.WithLock(ctx, k, fn) }},
		{"WithReadLock", func(k string) error { return m.WithReadLock(ctx, k, fn) }},
		{"WithWriteLock", func(k string) error { return m.WithWriteLock(ctx, k, fn) }},
		{"WithPermit", func(k string) error { return one.WithPermit(ctx, k, 2, fn) }},
		{"WithLock", func(k string) error { return ferrolock.WithLock(ctx, k, fn) }},
		{"WithReadLock", func(k string) error { return ferrolock.WithReadLock(ctx, k, fn) }},
		{"WithWriteLock", func(k string) error { return ferrolock.WithWriteLock(ctx, k, fn) }},
		{"WithPermit", func(k string) error { return ferrolock.WithPermit(ctx, k, 2, fn) }},
	}
	for i, c := range cases {
		err := noPanic(func() error { return c.call(fmt.Sprintf("%s:%d", part, i)) })
		invalidNaming(t, fmt.Sprintf("case %d, %s with a nil fn", i, c.op), err, c.op+": fn is nil")
	}
	for _, port := range ports {
		if n := keysNamed(t, port, part); n != 0 {
			t.Errorf("port %d: %d keys named after %s: a nil fn's key was taken", port, n, part)
		}
	}
}

// A nil *Manager, a nil *Lock (what a failed NewManager or Acquire returns next to its error)
// and a nil ctx are refused naming them, where they used to panic deep inside; the methods
// without an error result say "nothing held".
func TestANilReceiverOrCtxIsRefused(t *testing.T) {
	ctx := context.Background()
	var noCtx context.Context
	var nilM *ferrolock.Manager
	var nilL *ferrolock.Lock
	fn := func(context.Context, *ferrolock.Lock) error { return nil }
	m := manager(t)
	k := key("nil-args")
	lockErr := func(_ *ferrolock.Lock, err error) error { return err }
	cases := []struct {
		what, want string
		call       func() error
	}{
		{"Acquire on a nil Manager", "Acquire: nil *Manager", func() error { return lockErr(nilM.Acquire(ctx, k)) }},
		{"TryAcquire on a nil Manager", "TryAcquire: nil *Manager", func() error { return lockErr(nilM.TryAcquire(ctx, k)) }},
		{"AcquireRead on a nil Manager", "AcquireRead: nil *Manager", func() error { return lockErr(nilM.AcquireRead(ctx, k)) }},
		{"AcquireWrite on a nil Manager", "AcquireWrite: nil *Manager", func() error { return lockErr(nilM.AcquireWrite(ctx, k)) }},
		{"TryAcquireRead on a nil Manager", "TryAcquireRead: nil *Manager", func() error { return lockErr(nilM.TryAcquireRead(ctx, k)) }},
		{"TryAcquireWrite on a nil Manager", "TryAcquireWrite: nil *Manager", func() error { return lockErr(nilM.TryAcquireWrite(ctx, k)) }},
		{"AcquirePermits on a nil Manager", "AcquirePermits: nil *Manager", func() error { return lockErr(nilM.AcquirePermits(ctx, k, 2)) }},
		{"TryAcquirePermits on a nil Manager", "TryAcquirePermits: nil *Manager", func() error { return lockErr(nilM.TryAcquirePermits(ctx, k, 2)) }},
		{"WithLock on a nil Manager", "WithLock: nil *Manager", func() error { return nilM.WithLock(ctx, k, fn) }},
		{"WithReadLock on a nil Manager", "WithReadLock: nil *Manager", func() error { return nilM.WithReadLock(ctx, k, fn) }},
		{"WithWriteLock on a nil Manager", "WithWriteLock: nil *Manager", func() error { return nilM.WithWriteLock(ctx, k, fn) }},
		{"WithPermit on a nil Manager", "WithPermit: nil *Manager", func() error { return nilM.WithPermit(ctx, k, 2, fn) }},
		{"ReleaseAll on a nil Manager", "ReleaseAll: nil *Manager", func() error { _, err := nilM.ReleaseAll(time.Second); return err }},
		{"Close on a nil Manager", "Close: nil *Manager", func() error { return nilM.Close() }},
		{"Acquire with a nil ctx", "Acquire: ctx is nil", func() error { return lockErr(m.Acquire(noCtx, k)) }},
		{"TryAcquire with a nil ctx", "TryAcquire: ctx is nil", func() error { return lockErr(m.TryAcquire(noCtx, k)) }},
		{"AcquireRead with a nil ctx", "AcquireRead: ctx is nil", func() error { return lockErr(m.AcquireRead(noCtx, k)) }},
		{"AcquirePermits with a nil ctx", "AcquirePermits: ctx is nil", func() error { return lockErr(m.AcquirePermits(noCtx, k, 2)) }},
		{"WithLock with a nil ctx", "WithLock: ctx is nil", func() error { return m.WithLock(noCtx, k, fn) }},
		{"WithWriteLock with a nil ctx", "WithWriteLock: ctx is nil", func() error { return m.WithWriteLock(noCtx, k, fn) }},
		{"Release of a nil Lock", "Release: nil *Lock", func() error { return nilL.Release() }},
		{"Extend of a nil Lock", "Extend: nil *Lock", func() error { _, err := nilL.Extend(ctx); return err }},
		{"Err of a nil Lock", "Err: nil *Lock", func() error { return nilL.Err() }},
	}
	for _, c := range cases {
		invalidNaming(t, c.what, noPanic(c.call), c.want)
	}
	l, err := m.Acquire(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	invalidNaming(t, "Extend with a nil ctx", noPanic(func() error { _, err := l.Extend(noCtx); return err }), "Extend: ctx is nil")
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	err = noPanic(func() error {
		select {
		case <-nilL.Lost():
		default:
			return errors.New("Lost() of a nil Lock is not closed")
		}
		if f, ok := nilL.Fence(); ok || f != 0 || nilL.Validity() != 0 || nilL.Key() != "" || nilL.Token() != "" {
			return fmt.Errorf("a nil Lock reads fence %d %v, validity %v, key %q, token %q", f, ok, nilL.Validity(), nilL.Key(), nilL.Token())
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
}

// A duration with a fraction of a millisecond is refused naming the option and the value
// (Node's wording), where it used to be cut to whole milliseconds without a word: a lease of
// 100.5ms was held for 100ms.
func TestAFractionOfAMillisecondIsRefused(t *testing.T) {
	ctx := context.Background()
	const whole = "must be a whole number of milliseconds"
	for _, c := range []struct {
		opt  ferrolock.Option
		want string
	}{
		{ferrolock.TTL(100500 * time.Microsecond), "ttl=100.5ms: " + whole},
		{ferrolock.Wait(1500 * time.Microsecond), "wait=1.5ms: " + whole},
		{ferrolock.RetryDelay(2500 * time.Microsecond), "retry_delay=2.5ms: " + whole},
		{ferrolock.NodeTimeout(200*time.Millisecond + time.Nanosecond), "node_timeout=200.000001ms: " + whole},
		{ferrolock.MaxHold(10*time.Second + time.Microsecond), "max_hold=10.000001s: " + whole},
		{ferrolock.RestartGuard(1500 * time.Microsecond), "restart_guard=1.5ms: " + whole},
		{ferrolock.Set("ttl", 2*time.Second+500*time.Microsecond), "ttl=2.0005s: " + whole},
	} {
		m, err := ferrolock.NewManager(c.opt)
		if err == nil {
			m.Close()
		}
		invalidNaming(t, "NewManager: "+c.want, err, c.want)
	}
	m := manager(t)
	_, err := m.Acquire(ctx, key("fraction"), ferrolock.TTL(100500*time.Microsecond))
	invalidNaming(t, "Acquire with TTL(100.5ms)", err, "ttl=100.5ms: "+whole)
	_, err = m.TryAcquire(ctx, key("fraction"), ferrolock.Wait(1500*time.Microsecond))
	invalidNaming(t, "TryAcquire with Wait(1.5ms)", err, "wait=1.5ms: "+whole)
	l, err := m.Acquire(ctx, key("fraction"), ferrolock.TTL(1500*time.Millisecond))
	if err != nil {
		t.Fatalf("a whole number of milliseconds: %v", err)
	}
	defer l.Release()
	// Extend's refusals name the lock, as the library's own refusals of a ttl do.
	for _, c := range []struct {
		ttl  time.Duration
		want string
	}{
		{2*time.Second + 500*time.Microsecond, "ttl=2.0005s: " + whole},
		{0, "ttl=0s: must be greater than zero"},
		{-time.Second, "ttl=-1s: must not be negative"},
		{10, "ttl=10ns: below one millisecond"},
	} {
		_, err = l.Extend(ctx, c.ttl)
		invalidNaming(t, fmt.Sprintf("Extend(ctx, %v)", c.ttl), err, fmt.Sprintf("lock %q: %s", l.Key(), c.want))
	}
	// Too long for the library, fraction or not: refused as too long.
	_, err = l.Extend(ctx, math.MaxInt64)
	invalidNaming(t, "Extend(ctx, math.MaxInt64)", err, "too long")
}

// ReleaseAll's and Shutdown's limits bound a wait: a fraction of a millisecond rounds up to a
// whole one (500µs used to become 0, no wait at all); a negative limit still waits not at all.
func TestALimitsFractionOfAMillisecondRoundsUp(t *testing.T) {
	for _, c := range []struct {
		limit time.Duration
		ms    uint64
	}{
		{-time.Second, 0}, {0, 0}, {500 * time.Microsecond, 1}, {time.Millisecond, 1},
		{1500 * time.Microsecond, 2}, {2 * time.Second, 2000},
		{time.Duration(math.MaxInt64), uint64(math.MaxInt64/int64(time.Millisecond)) + 1},
	} {
		if got := ferrolock.LimitMs(c.limit); got != c.ms {
			t.Errorf("limit %v: %d ms, want %d", c.limit, got, c.ms)
		}
	}
}

// A message about a nodes value never shows a password: Go names a NUL by its offset and a
// value of the wrong type by its type, and the library redacts what it shows (a byte that is
// not UTF-8). They used to show the whole value, password and all.
func TestANodesPasswordNeverShowsInAnError(t *testing.T) {
	const secret = "sekrit-pw"
	for _, c := range []struct {
		what string
		opt  ferrolock.Option
		want string
	}{
		{"a NUL", ferrolock.Nodes("redis://:" + secret + "@127.0.0.1:6379/0\x00"), "nodes: a NUL byte at offset 35"},
		{"not UTF-8", ferrolock.Nodes("redis://:" + secret + "@127.0.0.1:6379/0\xff"), `"redis://:***@127.0.0.1:6379/0`},
		{"a []string", ferrolock.Set("nodes", []string{"redis://:" + secret + "@h:1"}), "nodes: unsupported value type []string"},
		// A misspelt name carries the nodes value all the same.
		{"a []string, misspelt", ferrolock.Set("node", []string{"redis://:" + secret + "@h:1"}), "node: unsupported value type []string"},
		{"a NUL, misspelt", ferrolock.Set("Nodes", "redis://:"+secret+"@127.0.0.1:6379/0\x00"), "Nodes: a NUL byte at offset 35"},
		{"not UTF-8, misspelt", ferrolock.Set("Nodes", "redis://:"+secret+"@127.0.0.1:6379/0\xff"), `"redis://:***@127.0.0.1:6379/0`},
		// Given to another option, or as the name (name and value swapped).
		{"a string for ttl", ferrolock.Set("ttl", "redis://:"+secret+"@127.0.0.1:6379/0"), `ttl="redis://:***@127.0.0.1:6379/0"`},
		{"as the name", ferrolock.Set("redis://:"+secret+"@127.0.0.1:6379/0", "nodes"), `unknown option "redis://:***@127.0.0.1:6379/0"`},
	} {
		m, err := ferrolock.NewManager(c.opt)
		if err == nil {
			m.Close()
		}
		invalidNaming(t, c.what, err, c.want)
		if err != nil && strings.Contains(err.Error(), "sekrit") {
			t.Errorf("%s: the password shows: %v", c.what, err)
		}
	}
}
