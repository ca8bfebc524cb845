package ferrolock_test

// Close against calls in flight on the manager, and what every method does after it.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	ferrolock "example.invalid/ferrolock/ffi/go"
)

// stopped says whether the process pid is stopped (SIGSTOP): the proof that a pause happened.
func stopped(t *testing.T, pid int) bool {
	t.Helper()
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// The state follows the command name's closing parenthesis.
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	return len(fields) > 0 && fields[0] == "T"
}

// pauseMajorityProved pauses a majority of the nodes and fails the test unless each is
// stopped; the nodes resume when the test ends.
func pauseMajorityProved(t *testing.T) {
	t.Helper()
	pauseMajority(true)
	t.Cleanup(func() { pauseMajority(false) })
	for _, pid := range pids[len(pids)-(len(pids)/2+1):] {
		if !settles(10*time.Second, func() bool { return stopped(t, pid) }) {
			t.Fatalf("node pid %d never stopped", pid)
		}
	}
}

// A node timeout long enough that a request to a paused node outlasts anything Close may
// wait for, and the ttl it fits (loss margin 2 × node timeout under ttl / 3).
const stuckNodeTimeout = 20 * time.Second

var stuckOpts = []ferrolock.Option{ferrolock.NodeTimeout(stuckNodeTimeout), ferrolock.TTL(10 * stuckNodeTimeout)}

// An Acquire whose first round of requests hangs on paused nodes (until the node timeout)
// is ended by Close with ErrNotAcquired naming the key and the close, well before its
// requests' own deadline, and Close does not wait that deadline out either. Nothing of it is
// left once the nodes answer again.
func TestCloseEndsAnAcquireStuckOnPausedNodes(t *testing.T) {
	m := manager(t, stuckOpts...)
	k := key("close-stuck")
	pauseMajorityProved(t)
	start := time.Now()
	ended := make(chan error, 1)
	go func() {
		l, err := m.Acquire(context.Background(), k)
		if err == nil {
			l.Release()
			err = errors.New("granted with a majority paused")
		}
		ended <- err
	}()
	select {
	case err := <-ended:
		t.Fatalf("the Acquire returned before Close, with a majority paused: %v", err)
	case <-time.After(500 * time.Millisecond):
	}
	closed := make(chan error, 1)
	go func() { closed <- m.Close() }()
	var closeErr, acquireErr error
	for got := 0; got < 2; got++ {
		select {
		case closeErr = <-closed:
			closed = nil
		case acquireErr = <-ended:
			ended = nil
		case <-time.After(time.Until(start.Add(stuckNodeTimeout))):
			t.Fatalf("Close (returned: %v) and the Acquire (returned: %v) waited out the node timeout "+
				"of the requests stuck on the paused nodes", closed == nil, ended == nil)
		}
	}
	if closeErr != nil {
		t.Fatalf("Close: %v", closeErr)
	}
	if !errors.Is(acquireErr, ferrolock.ErrNotAcquired) || !strings.Contains(acquireErr.Error(), "closed") ||
		!strings.Contains(acquireErr.Error(), k) {
		t.Fatalf("the Acquire ended with %v, not ErrNotAcquired naming %q and the close", acquireErr, k)
	}
	pauseMajority(false)
	for _, port := range ports {
		if !settles(stuckNodeTimeout, func() bool { return keysNamed(t, port, k) == 0 }) {
			t.Fatalf("port %d: %d keys of the closed acquire left once the nodes answered", port, keysNamed(t, port, k))
		}
	}
}

// Every method of a closed Manager returns an error naming what it was asked (never a panic,
// never a wait), a second Close and Closes at once return nil, and the Locks it handed out
// stay usable (the godoc's promise).
func TestEveryMethodAfterCloseSaysClosed(t *testing.T) {
	m := manager(t)
	ctx := context.Background()
	held, err := m.Acquire(ctx, key("closed-held"))
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 4)
	for i := 0; i < cap(errs); i++ {
		go func() { errs <- m.Close() }()
	}
	for i := 0; i < cap(errs); i++ {
		if err := <-errs; err != nil {
			t.Fatalf("Close at once with others: %v", err)
		}
	}
	if err := m.Close(); err != nil {
		t.Fatalf("a second Close: %v", err)
	}
	fn := func(context.Context, *ferrolock.Lock) error { t.Error("fn ran on a closed Manager"); return nil }
	k := key("closed")
	calls := map[string]func() error{
		"Acquire":           func() error { _, err := m.Acquire(ctx, k); return err },
		"TryAcquire":        func() error { _, err := m.TryAcquire(ctx, k); return err },
		"AcquireRead":       func() error { _, err := m.AcquireRead(ctx, k); return err },
		"AcquireWrite":      func() error { _, err := m.AcquireWrite(ctx, k); return err },
		"TryAcquireRead":    func() error { _, err := m.TryAcquireRead(ctx, k); return err },
		"TryAcquireWrite":   func() error { _, err := m.TryAcquireWrite(ctx, k); return err },
		"AcquirePermits":    func() error { _, err := m.AcquirePermits(ctx, k, 2); return err },
		"TryAcquirePermits": func() error { _, err := m.TryAcquirePermits(ctx, k, 2); return err },
		"WithLock":          func() error { return m.WithLock(ctx, k, fn) },
		"WithReadLock":      func() error { return m.WithReadLock(ctx, k, fn) },
		"WithWriteLock":     func() error { return m.WithWriteLock(ctx, k, fn) },
		"WithPermit":        func() error { return m.WithPermit(ctx, k, 2, fn) },
		"ReleaseAll":        func() error { _, err := m.ReleaseAll(time.Second); return err },
	}
	for name, call := range calls {
		err := call()
		if !errors.Is(err, ferrolock.ErrInvalidArgument) || !strings.Contains(err.Error(), "closed") ||
			(name != "ReleaseAll" && !strings.Contains(err.Error(), k)) {
			t.Errorf("%s on a closed Manager: %v (want ErrInvalidArgument naming %q and the close)", name, err, k)
		}
	}
	if v, err := held.Extend(ctx); err != nil || v <= 0 {
		t.Fatalf("Extend of a Lock of the closed Manager: %v %v", v, err)
	}
	if err := held.Release(); err != nil {
		t.Fatalf("Release of a Lock of the closed Manager: %v", err)
	}
}

// A Close while a WithLock's fn runs does as the godoc says of Close: the Lock stays held (fn's
// ctx is not cancelled, Err is nil) and WithLock releases it when fn returns, with fn's result.
func TestCloseDuringWithLockLeavesTheBodyItsLock(t *testing.T) {
	m := manager(t)
	ctx := context.Background()
	k := key("close-in-body")
	var inBody, afterClose error
	err := m.WithLock(ctx, k, func(ctx context.Context, l *ferrolock.Lock) error {
		closed := make(chan error, 1)
		// From another goroutine, as a shutdown path would.
		go func() { closed <- m.Close() }()
		if err := <-closed; err != nil {
			return fmt.Errorf("Close: %w", err)
		}
		if ctx.Err() != nil {
			inBody = fmt.Errorf("fn's ctx was cancelled by Close: %v", context.Cause(ctx))
		} else if err := l.Err(); err != nil {
			inBody = fmt.Errorf("the Lock after Close: %v", err)
		}
		visible := 0
		for _, port := range ports {
			visible += keysNamed(t, port, k)
		}
		if visible == 0 {
			afterClose = errors.New("the key is gone from every node after Close, fn still running")
		}
		return nil
	})
	if err != nil {
		t.Fatalf("WithLock: %v", err)
	}
	if inBody != nil {
		t.Fatal(inBody)
	}
	if afterClose != nil {
		t.Fatal(afterClose)
	}
	for _, port := range ports {
		if n := keysNamed(t, port, k); n != 0 {
			t.Fatalf("port %d: %d keys left after WithLock returned", port, n)
		}
	}
}

// exitHoldingTTL is the lease of the lock exitHolding leaves held.
const exitHoldingTTL = 3 * time.Second

// The child of TestOsExitWhileHoldingLeavesTheKeyForAtMostItsTTL: holds k, says "held", and
// exits with os.Exit, which runs nothing of the package (no Release, no Shutdown).
func exitHolding(k string) {
	m, err := ferrolock.NewManager(append(append([]ferrolock.Option(nil), base...), ferrolock.TTL(exitHoldingTTL))...)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	l, err := m.Acquire(context.Background(), k)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println("held", l.Key())
	os.Exit(0)
}

// A process that exits with os.Exit while holding leaves its lock held for at most its TTL
// (the README's promise): each node's key expires within the TTL, then the key is free.
func TestOsExitWhileHoldingLeavesTheKeyForAtMostItsTTL(t *testing.T) {
	k := key("exit-holding")
	out := inChild(t, "FERROLOCK_GO_EXIT_HOLDING", k)
	if !strings.HasPrefix(string(out), "held ") {
		t.Fatalf("child: %q", out)
	}
	exited := time.Now()
	held := 0
	for _, port := range ports {
		ms, err := exec.Command("redis-cli", "-p", strconv.Itoa(port), "PTTL", k).Output()
		if err != nil {
			t.Fatal(err)
		}
		pttl, _ := strconv.Atoi(strings.TrimSpace(string(ms)))
		if pttl == -1 || time.Duration(pttl)*time.Millisecond > exitHoldingTTL {
			t.Fatalf("port %d: the exited holder's key has PTTL %d, not within its ttl %v", port, pttl, exitHoldingTTL)
		}
		if pttl > 0 {
			held++
		}
	}
	if held < len(ports)/2+1 {
		t.Fatalf("the key is on %d nodes right after the holder exited: no lock was left to bound", held)
	}
	if _, err := manager(t).TryAcquire(context.Background(), k); !errors.Is(err, ferrolock.ErrNotAcquired) {
		t.Fatalf("a TryAcquire right after the holder exited: %v, want ErrNotAcquired", err)
	}
	// Each node's key goes at its PTTL, read above as at most the TTL; waited for twice that,
	// a margin for a loaded machine.
	l, err := manager(t).Acquire(context.Background(), k, ferrolock.Wait(2*exitHoldingTTL))
	if err != nil {
		t.Fatalf("an Acquire waiting %v after the holder exited: %v", 2*exitHoldingTTL, err)
	}
	t.Logf("granted %v after the holder exited", time.Since(exited).Round(time.Millisecond))
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
}

// A Close while a ReleaseAll waits on paused nodes (its release stuck until the node timeout)
// returns without waiting for it, and an Acquire after the Close is refused at once, not
// held up behind it either.
func TestCloseDoesNotWaitForAReleaseAllStuckOnPausedNodes(t *testing.T) {
	m := manager(t, stuckOpts...)
	ctx := context.Background()
	if _, err := m.Acquire(ctx, key("close-release-all")); err != nil {
		t.Fatal(err)
	}
	pauseMajorityProved(t)
	start := time.Now()
	deadline := start.Add(stuckNodeTimeout)
	releasing := make(chan error, 1)
	go func() {
		_, err := m.ReleaseAll(2 * stuckNodeTimeout)
		releasing <- err
	}()
	select {
	case err := <-releasing:
		t.Fatalf("ReleaseAll returned before Close, with a majority paused: %v", err)
	case <-time.After(500 * time.Millisecond):
	}
	closed := make(chan error, 1)
	go func() { closed <- m.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
	case <-releasing:
		t.Fatal("Close returned only after the ReleaseAll it ran beside, stuck until its node timeout")
	case <-time.After(time.Until(deadline)):
		t.Fatal("Close waited out the node timeout of the ReleaseAll it ran beside")
	}
	k := key("close-release-all-later")
	refused := make(chan error, 1)
	go func() { _, err := m.Acquire(ctx, k); refused <- err }()
	select {
	case err := <-refused:
		if !errors.Is(err, ferrolock.ErrInvalidArgument) || !strings.Contains(err.Error(), "closed") {
			t.Fatalf("an Acquire after Close: %v, want ErrInvalidArgument naming the close", err)
		}
	case <-time.After(time.Until(deadline)):
		t.Fatal("an Acquire after Close waited for the ReleaseAll stuck on the paused nodes")
	}
	pauseMajority(false)
	if err := <-releasing; err != nil {
		t.Fatalf("ReleaseAll: %v", err)
	}
}
