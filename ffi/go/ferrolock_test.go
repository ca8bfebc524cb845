package ferrolock_test

// Against real redis-servers started by ../tests/with-redis.sh (FERROLOCK_TEST_PORTS,
// FERROLOCK_TEST_PIDS, FERROLOCK_NODES).

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	ferrolock "example.invalid/ferrolock/ffi/go"
)

var ports, pids []int

func ints(env string) []int {
	var out []int
	for _, f := range strings.Split(os.Getenv(env), ",") {
		if n, err := strconv.Atoi(strings.TrimSpace(f)); err == nil {
			out = append(out, n)
		}
	}
	return out
}

func TestMain(m *testing.M) {
	if key := os.Getenv("FERROLOCK_GO_HOLD"); key != "" {
		os.Exit(hold(key))
	}
	if part := os.Getenv("FERROLOCK_GO_SHUTDOWN"); part != "" {
		os.Exit(shutdownChild(part))
	}
	if part := os.Getenv("FERROLOCK_GO_CLOSE_EXIT"); part != "" {
		os.Exit(closeExitChild(part))
	}
	if k := os.Getenv("FERROLOCK_GO_EXIT_HOLDING"); k != "" {
		exitHolding(k)
	}
	if part := os.Getenv("FERROLOCK_GO_LOG_EXIT"); part != "" {
		os.Exit(logExitChild(part))
	}
	if part := os.Getenv("FERROLOCK_GO_LOG_SHUTDOWN"); part != "" {
		os.Exit(shutdownInHandlerChild(part))
	}
	if port := os.Getenv("FERROLOCK_GO_BURST"); port != "" {
		os.Exit(burstChild(port))
	}
	if os.Getenv("FERROLOCK_GO_TRY_BURST") != "" {
		os.Exit(tryBurstChild())
	}
	ports, pids = ints("FERROLOCK_TEST_PORTS"), ints("FERROLOCK_TEST_PIDS")
	if len(ports) == 0 {
		fmt.Fprintln(os.Stderr, "run through ffi/tests/with-redis.sh (FERROLOCK_TEST_PORTS is not set)")
		os.Exit(2)
	}
	os.Exit(m.Run())
}

// Servers started a moment ago: their votes count at once.
var base = []ferrolock.Option{ferrolock.RestartGuard(0)}

func manager(t *testing.T, opts ...ferrolock.Option) *ferrolock.Manager {
	t.Helper()
	m, err := ferrolock.NewManager(append(append([]ferrolock.Option(nil), base...), opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

var keyN atomic.Int64

func key(name string) string {
	return fmt.Sprintf("go-test:%d:%s:%d", os.Getpid(), name, keyN.Add(1))
}

// The contender process: holds key for 1.5 s, says "held" on stdout, releases.
func hold(key string) int {
	m, err := ferrolock.NewManager(base...)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	l, err := m.Acquire(context.Background(), key)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("held")
	time.Sleep(1500 * time.Millisecond)
	if err := l.Release(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

func keysNamed(t *testing.T, port int, part string) int {
	out, err := exec.Command("redis-cli", "-p", strconv.Itoa(port), "--scan", "--pattern", "*"+part+"*").Output()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, name := range strings.Fields(string(out)) {
		// A release leaves a request latch for its short PX (twice the node timeout), so that
		// a re-sent release answers as the first did: not a lock, queue or counter key.
		if !strings.HasPrefix(name, "ferrolock:latch:") {
			n++
		}
	}
	return n
}

func pauseMajority(on bool) {
	sig := syscall.SIGCONT
	if on {
		sig = syscall.SIGSTOP
	}
	for _, pid := range pids[len(pids)-(len(pids)/2+1):] {
		syscall.Kill(pid, sig)
	}
}

func TestAcquireRelease(t *testing.T) {
	m := manager(t, ferrolock.Fencing(true), ferrolock.TTL(5*time.Second))
	ctx := context.Background()
	k := key("basic")
	l, err := m.Acquire(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	if l.Key() != k || len(l.Token()) < 32 || l.Validity() <= 0 || l.Validity() > 5*time.Second {
		t.Fatalf("key %q token %q validity %v", l.Key(), l.Token(), l.Validity())
	}
	if f, ok := l.Fence(); !ok || f == 0 {
		t.Fatalf("fence %d %v", f, ok)
	}
	if err := l.Err(); err != nil {
		t.Fatal(err)
	}
	if v, err := l.Extend(ctx); err != nil || v <= 0 {
		t.Fatalf("extend: %v %v", v, err)
	}
	if _, err := m.TryAcquire(ctx, k); !errors.Is(err, ferrolock.ErrNotAcquired) {
		t.Fatalf("try-acquire of a held key: %v", err)
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(); !errors.Is(err, ferrolock.ErrNotHeld) {
		t.Fatalf("second release: %v", err)
	}
	if _, err := l.Extend(ctx); !errors.Is(err, ferrolock.ErrNotHeld) {
		t.Fatalf("extend after release: %v", err)
	}
}

func TestExclusionBetweenGoroutines(t *testing.T) {
	m := manager(t)
	k := key("goroutines")
	var inside, entries atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 3; i++ {
				err := m.WithLock(context.Background(), k, func(ctx context.Context, l *ferrolock.Lock) error {
					if inside.Add(1) != 1 {
						return errors.New("two goroutines inside at once")
					}
					entries.Add(1)
					time.Sleep(2 * time.Millisecond)
					inside.Add(-1)
					return nil
				})
				if err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if entries.Load() != 24 {
		t.Fatalf("%d entries", entries.Load())
	}
}

func TestExclusionBetweenProcesses(t *testing.T) {
	k := key("processes")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "FERROLOCK_GO_HOLD="+k)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(out).ReadString('\n')
	if strings.TrimSpace(line) != "held" {
		t.Fatalf("contender said %q", line)
	}
	m := manager(t)
	ctx := context.Background()
	if _, err := m.TryAcquire(ctx, k); !errors.Is(err, ferrolock.ErrNotAcquired) {
		t.Fatalf("try-acquire while another process holds it: %v", err)
	}
	l, err := m.Acquire(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("contender: %v", err)
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
}

func TestCtxCancelledOnLossBeforeValidityEnds(t *testing.T) {
	m := manager(t, ferrolock.TTL(1500*time.Millisecond))
	var deadline, noticed time.Time
	var bodyErr error
	err := m.WithLock(context.Background(), key("lost"), func(ctx context.Context, l *ferrolock.Lock) error {
		pauseMajority(true)
		defer pauseMajority(false)
		// Read after the pause: no renewal can move the deadline from here on.
		deadline = time.Now().Add(l.Validity())
		select {
		case <-ctx.Done():
			noticed = time.Now()
		case <-time.After(20 * time.Second):
			bodyErr = errors.New("the body's context was never cancelled")
			return nil
		}
		if !errors.Is(context.Cause(ctx), ferrolock.ErrLockLost) {
			bodyErr = fmt.Errorf("cause %v", context.Cause(ctx))
		}
		return nil
	})
	if bodyErr != nil {
		t.Fatal(bodyErr)
	}
	if !errors.Is(err, ferrolock.ErrLockLost) {
		t.Fatalf("WithLock returned %v, want the loss", err)
	}
	if !noticed.Before(deadline) {
		t.Fatalf("loss noticed %v after the validity ended", noticed.Sub(deadline))
	}
}

func TestCallerCtxCancelsWaitAndKeepsNothing(t *testing.T) {
	holder, m := manager(t), manager(t)
	k := key("cancel")
	ctx := context.Background()
	held, err := holder.Acquire(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	wait, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	ran := false
	err = m.WithLock(wait, k, func(context.Context, *ferrolock.Lock) error { ran = true; return nil })
	if !errors.Is(err, context.DeadlineExceeded) || ran {
		t.Fatalf("WithLock on a held key with a 300ms ctx: %v (ran %v)", err, ran)
	}
	if keysNamed(t, ports[0], k) < 1 {
		t.Fatal("the holder's key is not visible to the probe")
	}
	if err := held.Release(); err != nil {
		t.Fatal(err)
	}
	for i, port := range ports {
		left := -1
		for try := 0; try < 200 && left != 0; try++ {
			if left = keysNamed(t, port, k); left != 0 {
				time.Sleep(25 * time.Millisecond)
			}
		}
		if left != 0 {
			t.Fatalf("node %d: %d keys named after %s left", i, left, k)
		}
	}
}

func threads(t *testing.T) int {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if n, ok := strings.CutPrefix(line, "Threads:"); ok {
			v, _ := strconv.Atoi(strings.TrimSpace(n))
			return v
		}
	}
	t.Fatal("no Threads line")
	return 0
}

func TestThousandWaitersDoNotPinThreads(t *testing.T) {
	holder, m := manager(t), manager(t)
	k := key("thousand")
	held, err := holder.Acquire(context.Background(), k)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	results := make(chan error, 1000)
	for i := 0; i < 1000; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := m.Acquire(ctx, k)
			results <- err
		}()
	}
	time.Sleep(2 * time.Second) // all of them started and waiting
	n := threads(t)
	cancel()
	wg.Wait()
	close(results)
	for err := range results {
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("a waiter returned %v", err)
		}
	}
	if n >= 200 {
		t.Fatalf("%d OS threads with 1000 goroutines waiting", n)
	}
	t.Logf("%d OS threads while 1000 goroutines waited", n)
	if err := held.Release(); err != nil {
		t.Fatal(err)
	}
}

// Acquire's first try runs on the calling thread; when it finds a quorum unreachable, the
// wait still follows, with the core's own retries, instead of failing at once (1,000 waiters
// under -race once got QUORUM_UNREACHABLE from a try whose new connection timed out).
func TestAnUnreachableFirstTryStillWaits(t *testing.T) {
	prefix := fmt.Sprintf("go-unreachable-%d", os.Getpid())
	m := manager(t)
	pauseMajority(true)
	defer pauseMajority(false)
	_, err := m.Acquire(context.Background(), prefix+":job", ferrolock.Wait(30*time.Second))
	if !errors.Is(err, ferrolock.ErrQuorumUnreachable) {
		t.Fatalf("with the majority paused: %v", err)
	}
	pauseMajority(false)
	line := fmt.Sprintf("ferrolock_acquire_attempts_total{prefix=%q} ", prefix)
	attempts := 0
	for _, l := range strings.Split(ferrolock.MetricsText(), "\n") {
		if strings.HasPrefix(l, line) {
			attempts, _ = strconv.Atoi(strings.TrimPrefix(l, line))
		}
	}
	if attempts < 2 {
		t.Fatalf("%d attempt(s): the wait never followed the unreachable first try", attempts)
	}
	t.Logf("%d attempts before QUORUM_UNREACHABLE", attempts)
}

func TestBadInputs(t *testing.T) {
	ctx := context.Background()
	m := manager(t)
	cases := []struct {
		name string
		err  error
		want string
	}{}
	add := func(name string, err error, want string) {
		cases = append(cases, struct {
			name string
			err  error
			want string
		}{name, err, want})
	}
	_, err := m.Acquire(ctx, "")
	add("empty key", err, "empty")
	_, err = m.Acquire(ctx, key("zero-ttl"), ferrolock.TTL(0))
	add("zero ttl", err, "ttl")
	_, err = m.Acquire(ctx, key("neg"), ferrolock.TTL(-time.Second))
	add("negative ttl", err, "negative")
	_, err = ferrolock.NewManager(ferrolock.Set("no_such", 1))
	add("unknown option", err, `"no_such"`)
	_, err = ferrolock.NewManager(ferrolock.Nodes("http://127.0.0.1:6379"))
	add("malformed URL", err, "http://127.0.0.1:6379")
	_, err = ferrolock.NewManager(ferrolock.Nodes())
	add("empty node list", err, "no node URL")
	_, err = m.Acquire(ctx, key("bad-utf8"+string([]byte{0xff})))
	add("non-UTF-8 key", err, "UTF-8")
	_, err = m.Acquire(ctx, key("manager-option"), ferrolock.Nodes("redis://127.0.0.1:2"))
	add("manager option on an acquire", err, "belongs to the manager (NewManager)")
	// Said in Go's terms, not in the C library's (which setter passes it).
	_, err = m.Acquire(ctx, key("ttl-string"), ferrolock.Set("ttl", "10s"))
	add("ttl as a string", err, `ttl="10s": ttl takes a time.Duration, not a string`)
	_, err = m.Acquire(ctx, key("ttl-int"), ferrolock.Set("ttl", 10))
	add("ttl as an integer", err, "ttl takes a time.Duration, not an integer")
	_, err = m.Acquire(ctx, key("drift-duration"), ferrolock.Set("drift_factor", time.Millisecond))
	add("drift factor as a duration", err, "drift_factor takes a float64, not a time.Duration")
	// The longest time.Duration: refused as too long, never wrapped.
	_, err = m.Acquire(ctx, key("max-ttl"), ferrolock.TTL(time.Duration(math.MaxInt64)))
	add("the longest ttl", err, "too long")
	// A node timeout its ttl cannot renew with (loss margin 10 s, not under 1 s / 3): refused at
	// acquire, not reported lost with "validity 0s"; and a ttl too short to renew.
	_, err = m.Acquire(ctx, key("margin"), ferrolock.TTL(time.Second), ferrolock.NodeTimeout(5*time.Second))
	add("node timeout too long for the ttl", err, "node timeout 5s")
	_, err = m.Acquire(ctx, key("short-ttl"), ferrolock.TTL(10*time.Millisecond))
	add("ttl too short to renew", err, "ttl 10ms is too short")
	for _, c := range cases {
		var fe *ferrolock.Error
		if !errors.Is(c.err, ferrolock.ErrInvalidArgument) || !errors.As(c.err, &fe) || !strings.Contains(fe.Message, c.want) || strings.Contains(fe.Message, "ferrolock_") {
			t.Errorf("%s: %v (want INVALID_ARGUMENT mentioning %s)", c.name, c.err, c.want)
		}
	}
	down, err := ferrolock.NewManager(ferrolock.Nodes("redis://127.0.0.1:1"))
	if err != nil {
		t.Fatal(err)
	}
	defer down.Close()
	if _, err := down.Acquire(ctx, "k"); !errors.Is(err, ferrolock.ErrQuorumUnreachable) || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Errorf("unreachable node: %v", err)
	}
	closed, _ := ferrolock.NewManager()
	closed.Close()
	if _, err := closed.Acquire(ctx, "k"); !errors.Is(err, ferrolock.ErrInvalidArgument) || !strings.Contains(err.Error(), `lock "k": the manager is closed`) {
		t.Errorf("closed manager: %v", err)
	}
	if _, err := closed.AcquirePermits(ctx, "s", 2); !errors.Is(err, ferrolock.ErrInvalidArgument) || !strings.Contains(err.Error(), `semaphore "s": the manager is closed`) {
		t.Errorf("closed manager, a semaphore: %v", err)
	}
}

// The table's options without a constructor of their own before: each takes effect.
func TestDriftFactorMaxExtensionsAndTLSCA(t *testing.T) {
	ctx := context.Background()
	m := manager(t, ferrolock.MaxExtensions(1), ferrolock.DriftFactor(0.05))
	l, err := m.Acquire(ctx, key("max-extensions"), ferrolock.TTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	// drift = 10 s × 0.05 + 2 ms: the validity is at most 9.498 s.
	if v := l.Validity(); v > 9498*time.Millisecond || v <= 0 {
		t.Fatalf("validity %v with drift factor 0.05", v)
	}
	if _, err := l.Extend(ctx); err != nil {
		t.Fatalf("the first extend: %v", err)
	}
	if _, err := l.Extend(ctx); !errors.Is(err, ferrolock.ErrInvalidArgument) || !strings.Contains(err.Error(), "max_extensions=1") {
		t.Fatalf("the second extend: %v, want ErrInvalidArgument naming max_extensions=1", err)
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	if _, err := ferrolock.NewManager(ferrolock.DriftFactor(1.5)); !errors.Is(err, ferrolock.ErrInvalidArgument) || !strings.Contains(err.Error(), "drift_factor=1.5") {
		t.Fatalf("drift factor 1.5: %v", err)
	}
	tls, err := ferrolock.NewManager(ferrolock.Nodes("rediss://127.0.0.1:1"), ferrolock.TLSCA("/nonexistent/ca.pem"))
	if err == nil {
		tls.Close()
	}
	if !errors.Is(err, ferrolock.ErrInvalidArgument) || !strings.Contains(err.Error(), "/nonexistent/ca.pem") {
		t.Fatalf("an unreadable TLS CA: %v", err)
	}
}

func TestDefaultWithLock(t *testing.T) {
	// The default manager is on FERROLOCK_NODES: one node here, whose restart guard is off
	// (with three servers started a moment ago, their votes would not count yet).
	t.Setenv("FERROLOCK_NODES", fmt.Sprintf("redis://127.0.0.1:%d", ports[0]))
	err := ferrolock.WithLock(context.Background(), key("default"), func(ctx context.Context, l *ferrolock.Lock) error {
		if l.Validity() <= 0 {
			return errors.New("not held inside WithLock")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestMetricsTextCountsAScriptedSequence(t *testing.T) {
	prefix := fmt.Sprintf("go-metrics-%d", os.Getpid())
	k := prefix + ":job"
	m := manager(t, ferrolock.TTL(30*time.Second))
	ctx := context.Background()
	l, err := m.Acquire(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.TryAcquire(ctx, k); !errors.Is(err, ferrolock.ErrNotAcquired) {
		t.Fatalf("try-acquire of a held key: %v", err)
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	text := ferrolock.MetricsText()
	for _, want := range []string{
		fmt.Sprintf("ferrolock_grants_total{prefix=%q} 1\n", prefix),
		fmt.Sprintf("ferrolock_acquire_failures_total{prefix=%q,code=\"NOT_ACQUIRED\"} 1\n", prefix),
		fmt.Sprintf("ferrolock_acquire_attempts_total{prefix=%q} 2\n", prefix),
	} {
		if !strings.Contains(text, want) {
			t.Errorf("no line %q in the metrics text:\n%s", want, text)
		}
	}
}

// ReleaseAll under a running WithLock: the body's ctx is cancelled with ErrLockLost (as for
// any loss) and WithLock returns it, instead of the body going on unprotected.
func TestReleaseAllDuringWithLockCancelsTheBody(t *testing.T) {
	m := manager(t)
	entered := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- m.WithLock(context.Background(), key("release-all-body"), func(ctx context.Context, l *ferrolock.Lock) error {
			close(entered)
			select {
			case <-ctx.Done():
				return context.Cause(ctx)
			case <-time.After(60 * time.Second):
				return errors.New("the body was never told")
			}
		})
	}()
	<-entered
	if n, err := m.ReleaseAll(10 * time.Second); err != nil || n != 1 {
		t.Fatalf("ReleaseAll: %d, %v", n, err)
	}
	err := <-done
	if !errors.Is(err, ferrolock.ErrLockLost) || !strings.Contains(err.Error(), "its manager released it") {
		t.Fatalf("WithLock returned %v", err)
	}
	// fn returned the very loss it was told of: said once, not joined with itself.
	if n := strings.Count(err.Error(), "its manager released it"); n != 1 {
		t.Fatalf("WithLock returned the loss %d times: %v", n, err)
	}
}

// The end of WithLock's scope follows the rule every binding shares: a lock found gone at
// the release after fn succeeded is ErrLockLost (exclusion was broken: not a success); one fn
// released itself is nothing to report.
func TestWithLockEndsItsScopeByTheSharedRule(t *testing.T) {
	m := manager(t)
	k := key("scope-gone")
	err := m.WithLock(context.Background(), k, func(ctx context.Context, l *ferrolock.Lock) error {
		// Behind the lock's back, on every node: the release will find the token gone.
		for _, port := range ports {
			if out, err := exec.Command("redis-cli", "-p", strconv.Itoa(port), "DEL", k).CombinedOutput(); err != nil {
				t.Fatalf("DEL: %v %s", err, out)
			}
		}
		return nil
	})
	if !errors.Is(err, ferrolock.ErrLockLost) || !strings.Contains(err.Error(), "no longer held") {
		t.Fatalf("a lock gone at release: WithLock returned %v", err)
	}
	err = m.WithLock(context.Background(), key("scope-released"), func(ctx context.Context, l *ferrolock.Lock) error {
		return l.Release()
	})
	if err != nil {
		t.Fatalf("a lock fn released itself: WithLock returned %v", err)
	}
	// Lost while fn ran, then released by fn: still the loss.
	short := manager(t, ferrolock.TTL(1500*time.Millisecond))
	k = key("scope-lost-released")
	err = short.WithLock(context.Background(), k, func(ctx context.Context, l *ferrolock.Lock) error {
		for _, port := range ports {
			if out, err := exec.Command("redis-cli", "-p", strconv.Itoa(port), "DEL", k).CombinedOutput(); err != nil {
				t.Fatalf("DEL: %v %s", err, out)
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Second):
			t.Fatal("the loss was never signalled")
		}
		return l.Release()
	})
	if !errors.Is(err, ferrolock.ErrLockLost) {
		t.Fatalf("a lock lost, then released by fn: WithLock returned %v", err)
	}
}

// The peers' "failed extend that silently re-creates the lock": with the key deleted, or
// taken by another client, on every node, Extend returns ErrLockLost, the Lock reads lost,
// and the nodes are left as they were.
func TestAnExtendThatFindsTheKeyGoneOrTakenIsLostAndRecreatesNothing(t *testing.T) {
	m := manager(t, ferrolock.TTL(30*time.Second))
	ctx := context.Background()
	onEvery := func(args ...string) []string {
		var outs []string
		for _, port := range ports {
			out, err := exec.Command("redis-cli", append([]string{"-p", strconv.Itoa(port)}, args...)...).CombinedOutput()
			if err != nil {
				t.Fatalf("%v: %v %s", args, err, out)
			}
			outs = append(outs, strings.TrimSpace(string(out)))
		}
		return outs
	}
	for _, taken := range []bool{false, true} {
		k := key(fmt.Sprintf("extend-taken-%v", taken))
		l, err := m.Acquire(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		// Acquire returns on a quorum: the last node's write may still be on its way, and
		// would land after the DEL or SET below.
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if strings.Join(onEvery("EXISTS", k), "") == strings.Repeat("1", len(ports)) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("taken %v: the lock never reached every node", taken)
			}
		}
		if taken {
			onEvery("SET", k, "someone-else", "PX", "60000")
		} else {
			onEvery("DEL", k)
		}
		if _, err := l.Extend(ctx, time.Minute); !errors.Is(err, ferrolock.ErrLockLost) {
			t.Fatalf("taken %v: Extend returned %v, want ErrLockLost", taken, err)
		}
		select {
		case <-l.Lost():
		default:
			t.Fatalf("taken %v: the lock does not read lost", taken)
		}
		want := ""
		if taken {
			want = "someone-else"
		}
		for i, got := range onEvery("GET", k) {
			if got != want {
				t.Fatalf("taken %v: node %d holds %q, want %q", taken, i, got, want)
			}
		}
	}
}

func TestReleaseAllReleasesWhatIsStillHeld(t *testing.T) {
	m := manager(t)
	ctx := context.Background()
	part := key("release-all")
	var locks []*ferrolock.Lock
	for i := 0; i < 3; i++ {
		l, err := m.Acquire(ctx, fmt.Sprintf("%s:%d", part, i))
		if err != nil {
			t.Fatal(err)
		}
		locks = append(locks, l)
	}
	if err := locks[0].Release(); err != nil {
		t.Fatal(err)
	}
	for _, port := range ports {
		if n := keysNamed(t, port, part); n != 2 {
			t.Fatalf("port %d: %d keys before", port, n)
		}
	}
	n, err := m.ReleaseAll(10 * time.Second)
	if err != nil || n != 2 {
		t.Fatalf("ReleaseAll: %d, %v", n, err)
	}
	for _, port := range ports {
		if n := keysNamed(t, port, part); n != 0 {
			t.Fatalf("port %d: %d keys left", port, n)
		}
	}
	// Lost to its holder (released by its manager): its Release returns nil, as after any loss.
	if err := locks[1].Release(); err != nil {
		t.Fatalf("a lock its manager released, released by its holder: %v", err)
	}
	m.Close()
	if _, err := m.ReleaseAll(time.Second); err == nil {
		t.Fatal("ReleaseAll on a closed manager")
	}
}

// The child of TestShutdownReleasesEverythingAndRefusesLaterAcquires.
func shutdownChild(part string) int {
	m, err := ferrolock.NewManager(base...)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if code := acquireThenShutdown(m, part, 2); code != 0 {
		return code
	}
	if _, err := m.TryAcquire(context.Background(), part+":late"); !errors.Is(err, ferrolock.ErrNotAcquired) {
		fmt.Fprintln(os.Stderr, "an acquire after Shutdown:", err)
		return 3
	}
	return 0
}

func TestShutdownReleasesEverythingAndRefusesLaterAcquires(t *testing.T) {
	// In a process of its own: Shutdown stops every later acquire of its process.
	part := key("shutdown")
	inChild(t, "FERROLOCK_GO_SHUTDOWN", part)
	for _, port := range ports {
		if n := keysNamed(t, port, part); n != 0 {
			t.Fatalf("port %d: %d keys left", port, n)
		}
	}
}

// inChild runs this test binary as a child process in the mode env=value (see TestMain), for
// what must not happen in the tests' own process (Shutdown ends every later acquire), and
// returns its standard output; a child that fails fails the test.
func inChild(t *testing.T, env, value string) []byte {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env+"="+value)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("child (%s): %v", env, err)
	}
	return out
}

// goGoroutines counts the goroutines that run Go code. A library thread that called back into
// Go (a completion or a loss callback) shows as a goroutine of its own, "locked to thread" with
// only runtime.goexit on its stack, until that thread ends (the core's blocking pool keeps an
// idle thread 10 s): that is the C library's thread, not a goroutine this package started.
func goGoroutines() int {
	buf := make([]byte, 1<<20)
	n := 0
	for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
		header, body, _ := strings.Cut(g, "\n")
		frames := 0
		for _, line := range strings.Split(strings.TrimSpace(body), "\n") {
			if !strings.HasPrefix(line, "\t") {
				frames++
			}
		}
		foreign := strings.Contains(header, "locked to thread") && frames == 1 &&
			strings.HasPrefix(body, "runtime.goexit")
		if strings.HasPrefix(header, "goroutine ") && !foreign {
			n++
		}
	}
	return n
}

// settles polls f until it returns true or the failure bound passes, collecting garbage
// between polls (a Lock dropped unreleased lets go of its handle in its finalizer).
func settles(bound time.Duration, f func() bool) bool {
	for end := time.Now().Add(bound); ; {
		if f() {
			return true
		}
		if time.Now().After(end) {
			return false
		}
		runtime.GC()
		time.Sleep(20 * time.Millisecond)
	}
}

func TestCloseLeavesNoGoroutineOrCgoHandle(t *testing.T) {
	// Locks of earlier tests dropped unreleased let go of their handles when collected.
	if !settles(10*time.Second, func() bool { return ferrolock.LiveHandles() == 0 }) {
		t.Fatalf("earlier tests left %d cgo handles", ferrolock.LiveHandles())
	}
	goroutines, handles := goGoroutines(), ferrolock.LiveHandles()
	func() {
		holder, err := ferrolock.NewManager(base...)
		if err != nil {
			t.Fatal(err)
		}
		m, err := ferrolock.NewManager(base...)
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		k := key("leak")
		// Every path that takes a handle or starts a goroutine: a first try that wins,
		// WithLock (its loss watcher), a wait granted after a release, a wait cancelled by
		// its ctx, and a lock left unreleased when its manager closes.
		if err := m.WithLock(ctx, k, func(context.Context, *ferrolock.Lock) error { return nil }); err != nil {
			t.Fatal(err)
		}
		held, err := holder.Acquire(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		granted := make(chan error, 1)
		go func() {
			l, err := m.Acquire(ctx, k)
			if err == nil {
				err = l.Release()
			}
			granted <- err
		}()
		short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		if _, err := m.Acquire(short, k); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("a wait on a held key with a 200ms ctx: %v", err)
		}
		if ferrolock.LiveHandles() <= handles {
			t.Fatal("the waits and the held lock hold no handle: the count measures nothing")
		}
		if err := held.Release(); err != nil {
			t.Fatal(err)
		}
		if err := <-granted; err != nil {
			t.Fatalf("the waiter: %v", err)
		}
		if _, err := m.Acquire(ctx, key("leak-unreleased")); err != nil {
			t.Fatal(err)
		}
		holder.Close()
		m.Close()
	}()
	if !settles(10*time.Second, func() bool { return ferrolock.LiveHandles() == handles }) {
		t.Fatalf("cgo handles after Close: %d, before: %d", ferrolock.LiveHandles(), handles)
	}
	if !settles(10*time.Second, func() bool { return goGoroutines() <= goroutines }) {
		buf := make([]byte, 1<<20)
		t.Fatalf("goroutines after Close: %d, before: %d\n%s", goGoroutines(), goroutines, buf[:runtime.Stack(buf, true)])
	}
}

// The C library takes NUL-terminated strings: a key or option string with a NUL inside is
// refused before it reaches C, never cut short there ("job\x0042" held as "job" would let two
// holders of "job\x0042" in, one of them this process).
func TestANulInAKeyOrOptionStringIsRefused(t *testing.T) {
	ctx := context.Background()
	m, other := manager(t), manager(t)
	k := key("nul")
	refused := func(what string, err error, want string) {
		t.Helper()
		var fe *ferrolock.Error
		if !errors.Is(err, ferrolock.ErrInvalidArgument) || !errors.As(err, &fe) || !strings.Contains(fe.Message, want) {
			t.Errorf("%s: %v (want INVALID_ARGUMENT naming %s)", what, err, want)
		}
	}
	l, err := m.Acquire(ctx, k+"\x0042")
	if err == nil {
		t.Logf("granted %q", l.Key())
	}
	refused("a key with a NUL", err, strconv.Quote(k+"\x0042"))
	_, err = m.TryAcquire(ctx, k+"\x00")
	refused("a try on a key ending in NUL", err, strconv.Quote(k+"\x00"))
	// Go holds nothing: no key of that name on any node, and another manager gets it at once.
	for _, port := range ports {
		if n := keysNamed(t, port, k); n != 0 {
			t.Fatalf("port %d: %d keys named after %q", port, n, k)
		}
	}
	l, err = other.TryAcquire(ctx, k)
	if err != nil {
		t.Fatalf("another manager's try-acquire of %q: %v", k, err)
	}
	l.Release()
	url := fmt.Sprintf("redis://127.0.0.1:%d", ports[0])
	_, err = ferrolock.NewManager(ferrolock.Nodes(url + "\x00,redis://127.0.0.1:1"))
	refused("a node URL with a NUL", err, fmt.Sprintf("nodes: a NUL byte at offset %d", len(url)))
	_, err = ferrolock.NewManager(ferrolock.Set("ttl\x00junk", 5*time.Second))
	refused("an option name with a NUL", err, strconv.Quote("ttl\x00junk"))
	_, err = m.Acquire(ctx, k, ferrolock.Set("wait\x00", time.Second))
	refused("an acquire option name with a NUL", err, strconv.Quote("wait\x00"))
}

// A panic in fn (recovered further up, as net/http does for a handler) still releases the
// lock and cancels fn's ctx, and reaches the caller unchanged.
func TestWithLockReleasesAndCancelsWhenFnPanics(t *testing.T) {
	m, other := manager(t), manager(t)
	k := key("panic")
	var inner context.Context
	recovered := func() (r any) {
		defer func() { r = recover() }()
		m.WithLock(context.Background(), k, func(ctx context.Context, l *ferrolock.Lock) error {
			inner = ctx
			panic("boom in fn")
		})
		return nil
	}()
	if recovered != "boom in fn" {
		t.Fatalf("the caller recovered %v, want fn's panic", recovered)
	}
	if inner == nil || inner.Err() == nil {
		t.Error("fn's ctx was not cancelled by the panic")
	}
	l, err := other.TryAcquire(context.Background(), k)
	if err != nil {
		t.Fatalf("another manager's try-acquire after the panic: %v", err)
	}
	l.Release()
}

// The README's example: the Wait option bounds the wait only, so a job that runs past that
// bound goes on (its ctx is cancelled only by a loss), and a key held elsewhere for the whole
// bound gives ErrNotAcquired without running fn.
func TestWaitOptionBoundsOnlyTheWait(t *testing.T) {
	m, holder := manager(t), manager(t)
	k := key("bound-wait")
	const bound = 300 * time.Millisecond
	err := m.WithLock(context.Background(), k, func(ctx context.Context, l *ferrolock.Lock) error {
		time.Sleep(2 * bound) // a job longer than the wait's bound
		return ctx.Err()
	}, ferrolock.Wait(bound), ferrolock.TTL(10*time.Second))
	if err != nil {
		t.Fatalf("a job running past the wait's bound: %v", err)
	}
	held, err := holder.Acquire(context.Background(), k)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	ran := false
	err = m.WithLock(context.Background(), k, func(context.Context, *ferrolock.Lock) error { ran = true; return nil },
		ferrolock.Wait(bound), ferrolock.TTL(10*time.Second))
	if !errors.Is(err, ferrolock.ErrNotAcquired) || ran {
		t.Fatalf("a key held elsewhere past the wait's bound: %v (fn ran: %v)", err, ran)
	}
}

// Set takes an integer of any Go integer type, as it says, and the value reaches the core.
func TestSetTakesEveryIntegerType(t *testing.T) {
	type count uint8
	for _, v := range []any{int64(1), int32(1), uint(1), count(1), uint16(1)} {
		m := manager(t, ferrolock.Set("max_extensions", v))
		l, err := m.Acquire(context.Background(), key("int-types"))
		if err != nil {
			t.Fatalf("max_extensions=%v (%T): %v", v, v, err)
		}
		if _, err := l.Extend(context.Background()); err != nil {
			t.Fatalf("the one extend max_extensions=%v (%T) allows: %v", v, v, err)
		}
		if _, err := l.Extend(context.Background()); err == nil {
			t.Fatalf("max_extensions=%v (%T): a second extend was allowed", v, v)
		}
		l.Release()
	}
}

// A duration below a millisecond (TTL(10) is 10 ns, meant as 10 s) is refused naming the
// value as given, not rounded up to 1 ms and refused as "1ms".
func TestASubMillisecondDurationIsRefusedAsGiven(t *testing.T) {
	m := manager(t)
	for _, c := range []struct {
		opt  ferrolock.Option
		want string
	}{{ferrolock.TTL(10), "ttl=10ns"}, {ferrolock.Wait(500 * time.Microsecond), "wait=500µs"}} {
		_, err := m.Acquire(context.Background(), key("sub-ms"), c.opt)
		var fe *ferrolock.Error
		if !errors.Is(err, ferrolock.ErrInvalidArgument) || !errors.As(err, &fe) || !strings.Contains(fe.Message, c.want) {
			t.Errorf("%s: %v (want INVALID_ARGUMENT naming %s)", c.want, err, c.want)
		}
	}
	l, err := manager(t, ferrolock.TTL(5*time.Second)).Acquire(context.Background(), key("sub-ms"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Extend(context.Background(), 10); !errors.Is(err, ferrolock.ErrInvalidArgument) || !strings.Contains(err.Error(), "ttl=10ns") {
		t.Errorf("Extend(ctx, 10): %v (want INVALID_ARGUMENT naming ttl=10ns)", err)
	}
	// A second ttl is a mistake, not a value to drop.
	if _, err := l.Extend(context.Background(), time.Second, 2*time.Second); !errors.Is(err, ferrolock.ErrInvalidArgument) || !strings.Contains(err.Error(), "one ttl at most, got 2") {
		t.Errorf("Extend(ctx, 1s, 2s): %v (want INVALID_ARGUMENT: one ttl at most)", err)
	}
	l.Release()
}

// godoc shows Option without an unexported type in it.
func TestOptionGodocShowsNoUnexportedType(t *testing.T) {
	out, err := exec.Command("go", "doc", ".", "Option").CombinedOutput()
	if err != nil {
		t.Fatalf("go doc: %v\n%s", err, out)
	}
	decl := ""
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, "type Option ") {
			decl = line
		}
	}
	if decl != "type Option struct {" {
		t.Fatalf("go doc Option shows:\n%s", out)
	}
}

// captured keeps the records a slog handler was given, at min and above.
type captured struct {
	mu   sync.Mutex
	min  slog.Level
	recs []slog.Record
}

func (c *captured) Enabled(_ context.Context, l slog.Level) bool { return l >= c.min }
func (c *captured) Handle(_ context.Context, r slog.Record) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.recs = append(c.recs, r.Clone())
	return nil
}
func (c *captured) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *captured) WithGroup(string) slog.Handler      { return c }

// find returns a record whose message contains part (and whether there is one).
func (c *captured) find(part string) (slog.Record, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range c.recs {
		if strings.Contains(r.Message, part) {
			return r, true
		}
	}
	return slog.Record{}, false
}

func attr(r slog.Record, name string) string {
	v := ""
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == name {
			v = a.Value.String()
		}
		return true
	})
	return v
}

// The core's records reach a logger set with SetLogger, at the level its handler takes, and
// none reaches it once SetLogger(nil) has returned.
func TestSetLoggerReceivesTheCoresRecords(t *testing.T) {
	c := &captured{min: slog.LevelInfo}
	if err := ferrolock.SetLogger(slog.New(c)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ferrolock.RestoreDefaultLogger)
	m := manager(t)
	ctx := context.Background()
	k := key("log")
	l, err := m.Acquire(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	l.Release()
	var r slog.Record
	if !settles(10*time.Second, func() bool { var ok bool; r, ok = c.find(k); return ok }) {
		t.Fatalf("no record naming %s among %d", k, len(c.recs))
	}
	if r.Level != slog.LevelInfo || attr(r, "logger") != "ferrolock" {
		t.Fatalf("record %v %q logger=%q", r.Level, r.Message, attr(r, "logger"))
	}
	if err := ferrolock.SetLogger(nil); err != nil {
		t.Fatal(err)
	}
	k = key("log-off")
	if l, err = m.Acquire(ctx, k); err != nil {
		t.Fatal(err)
	}
	l.Release()
	if r, ok := c.find(k); ok {
		t.Fatalf("a record after SetLogger(nil): %q", r.Message)
	}
}

// A Lock the garbage collector finalizes while it is held is released, with a warning naming
// its key (README: the collection follows its last use); one still referenced is kept, and one
// released before it was dropped is not warned of.
func TestACollectedHeldLockIsReleasedWithAWarning(t *testing.T) {
	c := &captured{min: slog.LevelWarn}
	if err := ferrolock.SetLogger(slog.New(c)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ferrolock.RestoreDefaultLogger)
	m, other := manager(t), manager(t)
	ctx := context.Background()
	dropped, kept, released := key("gc-dropped"), key("gc-kept"), key("gc-released")
	warning := func(k string) string {
		return fmt.Sprintf("lock %q is released because its handle was garbage-collected while the lock was held", k)
	}
	func() {
		if _, err := m.Acquire(ctx, dropped); err != nil {
			t.Fatal(err)
		}
		l, err := m.Acquire(ctx, released)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(); err != nil {
			t.Fatal(err)
		}
	}()
	k, err := m.Acquire(ctx, kept)
	if err != nil {
		t.Fatal(err)
	}
	var taken *ferrolock.Lock
	if !settles(30*time.Second, func() bool {
		if taken == nil {
			taken, _ = other.TryAcquire(ctx, dropped)
		}
		_, warned := c.find(warning(dropped))
		return taken != nil && warned
	}) {
		_, warned := c.find(warning(dropped))
		t.Fatalf("dropped lock taken by another manager: %v, warned of: %v", taken != nil, warned)
	}
	if err := taken.Release(); err != nil {
		t.Fatal(err)
	}
	// More collections before the count: a warning wrongly given for the released lock
	// (dropped at the same time) would be here by now.
	for i := 0; i < 5; i++ {
		runtime.GC()
		time.Sleep(20 * time.Millisecond)
	}
	c.mu.Lock()
	for _, r := range c.recs {
		for _, quiet := range []string{kept, released} {
			if strings.Contains(r.Message, fmt.Sprintf("lock %q", quiet)) && strings.Contains(r.Message, "garbage-collected") {
				t.Errorf("warned of %s: %q", quiet, r.Message)
			}
		}
	}
	c.mu.Unlock()
	if _, err := other.TryAcquire(ctx, kept); !errors.Is(err, ferrolock.ErrNotAcquired) {
		t.Fatalf("the referenced lock was taken by another manager: %v", err)
	}
	if err := k.Release(); err != nil {
		t.Fatal(err)
	}
}

// Work that still watches a Lock's Lost() after the Lock's last use is told when the garbage
// collector finalizes the Lock while it is held: the lock is released, and the work is no
// longer guarded (the error says why).
func TestLostClosesWhenAHeldLockIsCollected(t *testing.T) {
	m, other := manager(t), manager(t)
	ctx := context.Background()
	k := key("gc-lost")
	lost := func() <-chan struct{} {
		l, err := m.Acquire(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		return l.Lost()
	}()
	var taken *ferrolock.Lock
	closed := func() bool {
		select {
		case <-lost:
			return true
		default:
			return false
		}
	}
	if !settles(30*time.Second, func() bool {
		if taken == nil {
			taken, _ = other.TryAcquire(ctx, k)
		}
		return taken != nil && closed()
	}) {
		t.Fatalf("collected lock taken by another manager: %v, its Lost() closed: %v", taken != nil, closed())
	}
	if err := taken.Release(); err != nil {
		t.Fatal(err)
	}
}

// Without SetLogger, the core's warnings go to slog.Default() (here: a restarted node's vote
// held back, with a restart guard longer than the test servers' uptime).
func TestWarningsGoToSlogDefault(t *testing.T) {
	c := &captured{min: slog.LevelInfo}
	old := slog.Default()
	slog.SetDefault(slog.New(c))
	defer slog.SetDefault(old)
	m := manager(t, ferrolock.RestartGuard(time.Hour))
	m.TryAcquire(context.Background(), key("log-default"))
	var r slog.Record
	if !settles(10*time.Second, func() bool { var ok bool; r, ok = c.find("restart guard"); return ok }) {
		t.Fatalf("no restart-guard warning in slog.Default() among %d records", len(c.recs))
	}
	if r.Level != slog.LevelWarn {
		t.Fatalf("record %v %q", r.Level, r.Message)
	}
	k := key("log-default-info")
	l, err := manager(t).Acquire(context.Background(), k)
	if err != nil {
		t.Fatal(err)
	}
	l.Release()
	if r, ok := c.find(k); ok {
		t.Fatalf("a record below warnings reached the default logger: %v %q", r.Level, r.Message)
	}
}

// A reentrant lock's owner in Go is the WithLock scope its ctx carries: a nested WithLock or
// Acquire with fn's ctx re-enters (goroutines given that ctx too: one owner), a ctx outside
// the scope is an owner of its own.
func TestReentrantWithLockReentersWithItsCtx(t *testing.T) {
	m, other := manager(t, ferrolock.Reentrant(true)), manager(t, ferrolock.Reentrant(true))
	k := key("reentrant")
	err := m.WithLock(context.Background(), k, func(ctx context.Context, outer *ferrolock.Lock) error {
		err := m.WithLock(ctx, k, func(context.Context, *ferrolock.Lock) error { return nil }, ferrolock.Wait(2*time.Second))
		if err != nil {
			return fmt.Errorf("a nested WithLock with fn's ctx: %w", err)
		}
		if _, err := other.TryAcquire(context.Background(), k); !errors.Is(err, ferrolock.ErrNotAcquired) {
			return fmt.Errorf("another manager after the inner release: %v", err)
		}
		if _, err := m.TryAcquire(context.Background(), k); !errors.Is(err, ferrolock.ErrNotAcquired) {
			return fmt.Errorf("a ctx outside the scope: %v", err)
		}
		child := make(chan error)
		go func() {
			l, err := m.TryAcquire(ctx, k)
			if err == nil {
				err = l.Release()
			}
			child <- err
		}()
		if err := <-child; err != nil {
			return fmt.Errorf("a goroutine given fn's ctx (one owner with it): %v", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	l, err := other.TryAcquire(context.Background(), k)
	if err != nil {
		t.Fatalf("another manager once the scope ended: %v", err)
	}
	l.Release()
}

// Goroutines given one WithLock's ctx that each take a plain lock of the same key (a fan-out
// inside a scope, serialized on a shared resource) wait for each other, as the WithLock doc
// promises ("use a plain lock, for that"): a sibling's hold is not one the ctx's own scopes
// hold, and waits for it end when the sibling's fn returns, not the scope's.
func TestSiblingPlainLocksInsideOneScopeWaitForEachOther(t *testing.T) {
	m := manager(t)
	outer, shared := key("siblings-outer"), key("siblings-shared")
	var inside, most atomic.Int32
	err := m.WithLock(context.Background(), outer, func(ctx context.Context, _ *ferrolock.Lock) error {
		c, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		var wg sync.WaitGroup
		errs := make(chan error, 3)
		for i := 0; i < 3; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs <- m.WithLock(c, shared, func(context.Context, *ferrolock.Lock) error {
					n := inside.Add(1)
					for {
						old := most.Load()
						if n <= old || most.CompareAndSwap(old, n) {
							break
						}
					}
					time.Sleep(50 * time.Millisecond)
					inside.Add(-1)
					return nil
				})
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Errorf("a sibling's WithLock of a key another sibling holds: %v, want it to wait", err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if most.Load() != 1 {
		t.Fatalf("%d siblings held the plain lock at once", most.Load())
	}
}

// A ctx that outlives its WithLock (a detached task's context.WithoutCancel) carries a scope
// that owns nothing: two tasks started with it exclude each other.
func TestAnEndedReentrantScopeOwnsNothing(t *testing.T) {
	m := manager(t, ferrolock.Reentrant(true))
	k := key("reentrant-ended")
	var detached context.Context
	err := m.WithLock(context.Background(), k, func(ctx context.Context, _ *ferrolock.Lock) error {
		detached = context.WithoutCancel(ctx)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	err = m.WithLock(detached, k, func(context.Context, *ferrolock.Lock) error {
		if _, err := m.TryAcquire(detached, k); !errors.Is(err, ferrolock.ErrNotAcquired) {
			return fmt.Errorf("a second task of the ended scope entered with the first: %v", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// slowText writes each record's level and message to stdout, slowly (a handler behind a
// network, say).
type slowText struct{ mu sync.Mutex }

func (h *slowText) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelInfo }
func (h *slowText) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	time.Sleep(50 * time.Millisecond)
	_, err := fmt.Printf("%v %s\n", r.Level, r.Message)
	return err
}
func (h *slowText) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *slowText) WithGroup(string) slog.Handler      { return h }

// The child of TestShutdownHandsQueuedRecordsToTheLogger: main returns right after Shutdown.
func logExitChild(part string) int {
	if err := ferrolock.SetLogger(slog.New(&slowText{})); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	m, err := ferrolock.NewManager(base...)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return acquireThenShutdown(m, part, 3)
}

// acquireThenShutdown acquires part:0 … part:n-1 on m, then checks that Shutdown releases all
// n. Returns a child's exit code: 0, 1 (an acquire failed) or 2 (Shutdown released another
// number).
func acquireThenShutdown(m *ferrolock.Manager, part string, n int) int {
	// Kept referenced until Shutdown returns: a lock the garbage collector finalizes is
	// released in the background, and would not be Shutdown's to count.
	held := make([]*ferrolock.Lock, 0, n)
	for i := 0; i < n; i++ {
		l, err := m.Acquire(context.Background(), fmt.Sprintf("%s:%d", part, i))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		held = append(held, l)
	}
	if got := ferrolock.Shutdown(10 * time.Second); got != n {
		fmt.Fprintln(os.Stderr, "Shutdown released", got)
		return 2
	}
	runtime.KeepAlive(held)
	return 0
}

// Records of the exit protocol still queued for a slow logger reach it before Shutdown
// returns, so a main that returns right after loses none.
func TestShutdownHandsQueuedRecordsToTheLogger(t *testing.T) {
	part := key("log-exit")
	out := inChild(t, "FERROLOCK_GO_LOG_EXIT", part)
	for i := 0; i < 3; i++ {
		k := fmt.Sprintf("%s:%d", part, i)
		found := false
		for _, line := range strings.Split(string(out), "\n") {
			found = found || (strings.HasPrefix(line, "INFO ") && strings.Contains(line, k) && strings.Contains(line, "released"))
		}
		if !found {
			t.Errorf("no record of %s's release in the child's log:\n%s", k, out)
		}
	}
}

// onFirstRecord is a slog handler that calls f with the first record it is given.
type onFirstRecord struct {
	once sync.Once
	f    func()
}

func (h *onFirstRecord) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (h *onFirstRecord) Handle(context.Context, slog.Record) error {
	h.once.Do(h.f)
	return nil
}
func (h *onFirstRecord) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *onFirstRecord) WithGroup(string) slog.Handler      { return h }

// The child of TestShutdownFromTheLoggersHandlerDoesNotWaitForItself: the handler calls
// Shutdown(30 s) on its first record (a loss), with part:held held, and the child prints how
// long that took in ms and how many locks it released.
func shutdownInHandlerChild(part string) int {
	m, err := ferrolock.NewManager(base...)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	report := make(chan string, 1)
	handler := &onFirstRecord{f: func() {
		start := time.Now()
		n := ferrolock.Shutdown(30 * time.Second)
		report <- fmt.Sprintf("%d %d", time.Since(start).Milliseconds(), n)
	}}
	held, err := m.Acquire(context.Background(), part+":held")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// Once held: the handler's Shutdown must find something to release.
	if err := ferrolock.SetLogger(slog.New(handler)); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// The first record: MaxHold ends this hold, and the loss is logged as a warning. Another
	// warning first (a slow node, say) runs Shutdown as well, which refuses this acquire.
	lost, err := m.Acquire(context.Background(), part+":lost", ferrolock.MaxHold(200*time.Millisecond))
	if err != nil {
		fmt.Fprintln(os.Stderr, "the acquire meant to be lost:", err)
	}
	select {
	case r := <-report:
		fmt.Println(r)
	case <-time.After(2 * time.Minute):
		fmt.Fprintln(os.Stderr, "the handler never reported")
		return 2
	}
	runtime.KeepAlive(held)
	runtime.KeepAlive(lost)
	return 0
}

// Shutdown called by the logger's handler returns once the locks are released: it used to
// wait out its whole limit for the records queued behind the one the handler was given,
// which only that handler's return lets through.
func TestShutdownFromTheLoggersHandlerDoesNotWaitForItself(t *testing.T) {
	part := key("log-shutdown")
	out := inChild(t, "FERROLOCK_GO_LOG_SHUTDOWN", part)
	var ms, n int
	if _, err := fmt.Sscanf(string(out), "%d %d", &ms, &n); err != nil {
		t.Fatalf("child said %q: %v", out, err)
	}
	// Shutdown(30 s) waiting for itself takes the 30 s; releasing takes a round trip.
	if ms >= 15000 || n < 1 {
		t.Fatalf("Shutdown(30s) in the handler took %d ms, released %d", ms, n)
	}
	for _, port := range ports {
		if k := keysNamed(t, port, part+":held"); k != 0 {
			t.Fatalf("port %d: %d keys left", port, k)
		}
	}
}

// The caller's ctx cancelled while fn runs (the README: ctx is the parent of fn's ctx): fn's
// ctx is cancelled, the lock stays held until fn returns, then it is released, and WithLock
// returns fn's error.
func TestCallerCtxCancelledWhileFnRunsReleasesAfterFn(t *testing.T) {
	m := manager(t, ferrolock.TTL(10*time.Second))
	k := key("caller-cancel")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	err := m.WithLock(ctx, k, func(inner context.Context, l *ferrolock.Lock) error {
		cancel()
		select {
		case <-inner.Done():
		case <-time.After(30 * time.Second):
			return errors.New("fn's ctx was not cancelled with the caller's")
		}
		if err := l.Err(); err != nil {
			return fmt.Errorf("no longer held once the caller's ctx was cancelled: %w", err)
		}
		holding := 0
		for _, port := range ports {
			holding += keysNamed(t, port, k)
		}
		if holding < len(ports)/2+1 {
			return fmt.Errorf("%d of %d nodes hold the key while fn runs", holding, len(ports))
		}
		return inner.Err()
	})
	if !errors.Is(err, context.Canceled) || errors.Is(err, ferrolock.ErrLockLost) {
		t.Fatalf("WithLock returned %v, want fn's context.Canceled only", err)
	}
	if !settles(10*time.Second, func() bool {
		left := 0
		for _, port := range ports {
			left += keysNamed(t, port, k)
		}
		return left == 0
	}) {
		t.Fatalf("%s is still held after WithLock returned", k)
	}
}

// Once Err says ErrLockLost, Lost() is closed and a WithLock's ctx cancelled with that loss, as
// after an Extend that says so: Err used to read the core's status while the loss callback
// was still on its way, so fn saw the loss from Err with its ctx not yet cancelled (in most
// rounds).
func TestErrSayingLostMeansLostIsClosed(t *testing.T) {
	m := manager(t, ferrolock.TTL(300*time.Millisecond), ferrolock.NodeTimeout(20*time.Millisecond))
	inconsistent := errors.New("inconsistent")
	for round := 0; round < 30; round++ {
		k := key("err-lost")
		err := m.WithLock(context.Background(), k, func(ctx context.Context, l *ferrolock.Lock) error {
			for _, port := range ports {
				if out, err := exec.Command("redis-cli", "-p", strconv.Itoa(port), "DEL", k).CombinedOutput(); err != nil {
					return fmt.Errorf("%w: DEL: %v %s", inconsistent, err, out)
				}
			}
			for end := time.Now().Add(30 * time.Second); time.Now().Before(end); {
				err := l.Err()
				if err == nil {
					continue
				}
				if !errors.Is(err, ferrolock.ErrLockLost) {
					return fmt.Errorf("%w: Err: %v, want nil or ErrLockLost", inconsistent, err)
				}
				select {
				case <-l.Lost():
				default:
					return fmt.Errorf("%w: Err says %v, but Lost() is not closed", inconsistent, err)
				}
				if cause := context.Cause(ctx); !errors.Is(cause, ferrolock.ErrLockLost) {
					return fmt.Errorf("%w: Err says %v, but fn's ctx is not cancelled with the loss (cause %v)", inconsistent, err, cause)
				}
				return nil
			}
			return fmt.Errorf("%w: the deleted key was never seen lost", inconsistent)
		})
		if errors.Is(err, inconsistent) || !errors.Is(err, ferrolock.ErrLockLost) {
			t.Fatalf("round %d: %v", round, err)
		}
	}
}

// From the goroutine that saw Lost() fire (the key deleted under it), the lock's and its
// manager's calls return, and leave no key: Extend says lost, Release gives back what is
// left, an acquire of another key is granted, Close closes.
func TestCallsAfterLostReturn(t *testing.T) {
	m := manager(t, ferrolock.TTL(1500*time.Millisecond))
	ctx := context.Background()
	k, other := key("after-loss"), key("after-loss-other")
	l, err := m.Acquire(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	for _, port := range ports {
		if out, err := exec.Command("redis-cli", "-p", strconv.Itoa(port), "DEL", k).CombinedOutput(); err != nil {
			t.Fatalf("DEL: %v %s", err, out)
		}
	}
	done := make(chan error, 1)
	go func() {
		<-l.Lost()
		done <- func() error {
			if _, err := l.Extend(ctx); !errors.Is(err, ferrolock.ErrLockLost) {
				return fmt.Errorf("Extend after the loss: %v, want ErrLockLost", err)
			}
			if err := l.Release(); err != nil {
				return fmt.Errorf("Release after the loss: %v", err)
			}
			o, err := m.Acquire(ctx, other)
			if err != nil {
				return fmt.Errorf("Acquire of another key after the loss: %v", err)
			}
			if err := o.Release(); err != nil {
				return err
			}
			return m.Close()
		}()
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no loss seen, or a call after it hung")
	}
	for _, port := range ports {
		if n := keysNamed(t, port, k) + keysNamed(t, port, other); n != 0 {
			t.Fatalf("port %d: %d keys left", port, n)
		}
	}
}

// An Acquire whose ctx is cancelled just as the holder's release wakes it (its grant on its
// way): once Acquire has returned, whatever it took (a grant, a queue entry) is given back on
// every node, so another manager's TryAcquire takes the key at once. Returning first and
// undoing after failed such a try in most rounds.
func TestCancelledAcquireAsItIsGrantedLeavesTheKeyFree(t *testing.T) {
	holder, m, other := manager(t), manager(t), manager(t)
	bg := context.Background()
	cancelled := 0
	for round := 0; round < 20; round++ {
		k := key("cancel-granted")
		held, err := holder.Acquire(bg, k)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(bg)
		type result struct {
			l   *ferrolock.Lock
			err error
		}
		out := make(chan result, 1)
		go func() {
			l, err := m.Acquire(ctx, k)
			out <- result{l, err}
		}()
		// Queued on every node (the key and its queue keys are there): the release wakes it.
		for i, port := range ports {
			if !settles(20*time.Second, func() bool { return keysNamed(t, port, k) >= 2 }) {
				t.Fatalf("round %d: the waiter never queued on node %d", round, i)
			}
		}
		if err := held.Release(); err != nil {
			t.Fatal(err)
		}
		cancel()
		r := <-out
		switch {
		case r.err == nil:
			if err := r.l.Release(); err != nil {
				t.Fatal(err)
			}
		case errors.Is(r.err, context.Canceled):
			cancelled++
		default:
			t.Fatalf("round %d: %v", round, r.err)
		}
		l, err := other.TryAcquire(bg, k)
		if err != nil {
			t.Fatalf("round %d: another manager's try right after the cancelled Acquire returned: %v", round, err)
		}
		if err := l.Release(); err != nil {
			t.Fatal(err)
		}
	}
	if cancelled == 0 {
		t.Fatal("no round was cancelled: the race never happened")
	}
}

// queueKeys counts key's queue keys on the node at port (ferrolock:queue:{key}, -lease,
// -since; DESIGN.md, "Waiter queue").
func queueKeys(t *testing.T, port int, key string) int {
	out, err := exec.Command("redis-cli", "-p", strconv.Itoa(port), "--scan", "--pattern", "ferrolock:queue*:{"+key+"}").Output()
	if err != nil {
		t.Fatal(err)
	}
	return len(strings.Fields(string(out)))
}

// Close ends an Acquire waiting on the manager with ErrNotAcquired naming the close, and
// leaves no queue entry of it on any node; the holder's key stays its own (issue 29 item 4).
func TestCloseEndsWaitsAndLeavesNoQueueEntry(t *testing.T) {
	holder := manager(t, ferrolock.TTL(60*time.Second))
	m := manager(t)
	ctx := context.Background()
	k := key("close-ends-waits")
	held, err := holder.Acquire(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	ended := make(chan error, 1)
	go func() {
		l, err := m.Acquire(ctx, k)
		if err == nil {
			l.Release()
			err = errors.New("granted")
		}
		ended <- err
	}()
	// The fault: the waiter sits in the key's queue on every node.
	for _, port := range ports {
		if !settles(30*time.Second, func() bool { return queueKeys(t, port, k) > 0 }) {
			t.Fatalf("port %d: the waiter never queued", port)
		}
	}
	m.Close()
	select {
	case err := <-ended:
		if !errors.Is(err, ferrolock.ErrNotAcquired) || !strings.Contains(err.Error(), "closed") {
			t.Fatalf("the wait ended with %v, not ErrNotAcquired naming the close", err)
		}
	case <-time.After(30 * time.Second):
		held.Release() // lets the waiter go, so that the test ends
		t.Fatal("the Acquire went on waiting after Close")
	}
	for _, port := range ports {
		if n := queueKeys(t, port, k); n != 0 {
			t.Fatalf("port %d: %d queue keys left", port, n)
		}
	}
	if err := held.Err(); err != nil {
		t.Fatalf("the holder's lock: %v", err)
	}
	if _, err := manager(t).TryAcquire(ctx, k); !errors.Is(err, ferrolock.ErrNotAcquired) {
		t.Fatalf("another manager's TryAcquire: %v, want ErrNotAcquired", err)
	}
}

// The child of TestCloseThenShutdownReleasesWhatIsStillHeld: Close with two locks held (the
// usual defer order runs Close before Shutdown), one used after the Close, then Shutdown.
func closeExitChild(part string) int {
	m, err := ferrolock.NewManager(base...)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx := context.Background()
	var locks [2]*ferrolock.Lock
	for i := range locks {
		if locks[i], err = m.Acquire(ctx, fmt.Sprintf("%s:%d", part, i)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	m.Close()
	// The godoc's promise: a closed manager's locks stay usable until released.
	if v, err := locks[0].Extend(ctx); err != nil || v <= 0 {
		fmt.Fprintln(os.Stderr, "Extend after Close:", v, err)
		return 2
	}
	if err := locks[0].Release(); err != nil {
		fmt.Fprintln(os.Stderr, "Release after Close:", err)
		return 3
	}
	if err := locks[1].Err(); err != nil {
		fmt.Fprintln(os.Stderr, "the other lock after Close:", err)
		return 4
	}
	if n := ferrolock.Shutdown(10 * time.Second); n != 1 {
		fmt.Fprintln(os.Stderr, "Shutdown released", n)
		return 5
	}
	return 0
}

// Close, then the end of main (Shutdown) with a lock still held: the lock is released
// (issue 30 item 6 (b)); the lock used after Close worked.
func TestCloseThenShutdownReleasesWhatIsStillHeld(t *testing.T) {
	part := key("close-exit")
	inChild(t, "FERROLOCK_GO_CLOSE_EXIT", part)
	for _, port := range ports {
		if n := keysNamed(t, port, part); n != 0 {
			t.Fatalf("port %d: %d keys left", port, n)
		}
	}
}

// A burst of waiters and concurrent acquire/release, then Close: the Redis clients and OS
// threads it took go back to about what the process had before (Release and Extend take a
// bounded number of threads, as the first try does; a thread's own connections close once it
// is idle for FERROLOCK_IDLE_CONNECTION_MS, shortened here). In a child process, so that its
// thread count is its own.
func TestBurstLeavesNeitherConnectionsNorThreads(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "FERROLOCK_GO_BURST="+strconv.Itoa(ports[0]), "FERROLOCK_IDLE_CONNECTION_MS=300")
	out, err := cmd.CombinedOutput()
	t.Log(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatalf("burst child: %v", err)
	}
}

// A burst of TryAcquire pins no more OS threads than a burst of Acquire: at most 4 per CPU are
// in a blocking first try (each with its own connection per node), the others try once
// through the completion-based path. TryAcquire used to make its blocking try whatever the
// bound, so 400 goroutines trying while a node was slow made 400 threads.
func TestABurstOfTryAcquirePinsFewThreads(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "FERROLOCK_GO_TRY_BURST=1")
	out, err := cmd.CombinedOutput()
	t.Log(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatalf("try burst child: %v", err)
	}
}

// tryBurstChild runs 400 TryAcquires at once while the first node is paused (each try waits
// for it), counts the threads that are not the library's meanwhile, then resumes the node.
func tryBurstChild() int {
	ports, pids := ints("FERROLOCK_TEST_PORTS"), ints("FERROLOCK_TEST_PIDS")
	m, err := ferrolock.NewManager(ferrolock.RestartGuard(0), ferrolock.Nodes(fmt.Sprintf("redis://127.0.0.1:%d", ports[0])),
		ferrolock.NodeTimeout(5*time.Second), ferrolock.TTL(time.Minute))
	if err != nil {
		fmt.Println(err)
		return 1
	}
	defer m.Close()
	goThreads := func() int { return osThreads() - libraryThreads() }
	before := goThreads()
	syscall.Kill(pids[0], syscall.SIGSTOP)
	resumed := false
	resume := func() {
		if !resumed {
			syscall.Kill(pids[0], syscall.SIGCONT)
			resumed = true
		}
	}
	defer resume()
	const n = 400
	var wg sync.WaitGroup
	var bad atomic.Int64
	var finished atomic.Int64
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			defer finished.Add(1)
			l, err := m.TryAcquire(context.Background(), fmt.Sprintf("go-try-burst:%d", i))
			switch {
			case err == nil:
				err = l.Release()
			case errors.Is(err, ferrolock.ErrQuorumUnreachable):
				err = nil
			}
			if err != nil {
				bad.Add(1)
				fmt.Println(err)
			}
		}(i)
	}
	// While the node is paused (the tries wait up to their node timeout of 5 s), for 3 s.
	peak := 0
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end) && finished.Load() == 0; {
		peak = max(peak, goThreads())
		time.Sleep(10 * time.Millisecond)
	}
	resume()
	wg.Wait()
	limit := before + 4*runtime.NumCPU() + 32
	fmt.Printf("threads (not the library's): %d before, %d at most while %d TryAcquires waited on a paused node (limit %d)\n", before, peak, n, limit)
	if bad.Load() > 0 || peak > limit {
		return 1
	}
	return 0
}

// A Manager dropped without Close is closed when collected, as Python's and Node's managers
// are: its connections to the nodes close (a Manager made per request and never closed used
// to keep them, and its library state, for the life of the process).
func TestADroppedManagerClosesItsConnectionsWhenCollected(t *testing.T) {
	port := ports[0]
	before := clientsOn(port)
	func() {
		m, err := ferrolock.NewManager(ferrolock.Nodes(fmt.Sprintf("redis://127.0.0.1:%d", port)))
		if err != nil {
			t.Fatal(err)
		}
		l, err := m.Acquire(context.Background(), key("dropped-manager"))
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(); err != nil {
			t.Fatal(err)
		}
	}()
	if n := clientsOn(port); n <= before {
		t.Fatalf("%d clients while the manager is in use, %d before: the test sees no connection of its own", n, before)
	}
	deadline := time.Now().Add(60 * time.Second)
	for clientsOn(port) > before {
		if time.Now().After(deadline) {
			t.Fatalf("%d clients a minute after the manager was dropped, %d before", clientsOn(port), before)
		}
		runtime.GC()
		time.Sleep(50 * time.Millisecond)
	}
}

func clientsOn(port int) int {
	out, err := exec.Command("redis-cli", "-p", strconv.Itoa(port), "info", "clients").Output()
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "connected_clients:"); ok {
			n, _ := strconv.Atoi(v)
			return n - 1 // not redis-cli's own
		}
	}
	return -1
}

// How many of this process's threads bear each name ("ferrolock" for the library's runtime,
// the test binary's name for Go's own), for a failure's message.
func threadNames() string {
	tasks, _ := os.ReadDir("/proc/self/task")
	count := map[string]int{}
	for _, t := range tasks {
		comm, _ := os.ReadFile("/proc/self/task/" + t.Name() + "/comm")
		count[strings.TrimSpace(string(comm))]++
	}
	return fmt.Sprint(count)
}

// This process's threads that the library started (see threadNames).
func libraryThreads() int {
	tasks, _ := os.ReadDir("/proc/self/task")
	n := 0
	for _, t := range tasks {
		comm, _ := os.ReadFile("/proc/self/task/" + t.Name() + "/comm")
		if name := strings.TrimSpace(string(comm)); name == "ferrolock" || name == "ferrolock-idle" {
			n++
		}
	}
	return n
}

func osThreads() int {
	tasks, _ := os.ReadDir("/proc/self/task")
	return len(tasks)
}

func burstChild(portText string) int {
	port, _ := strconv.Atoi(portText)
	fail := func(format string, args ...any) int {
		fmt.Printf(format+"\n", args...)
		return 1
	}
	clients0, threads0 := clientsOn(port), osThreads()
	m, err := ferrolock.NewManager(ferrolock.RestartGuard(0), ferrolock.Nodes(fmt.Sprintf("redis://127.0.0.1:%d", port)))
	if err != nil {
		return fail("%v", err)
	}
	ctx := context.Background()
	held, err := m.Acquire(ctx, "go-burst:shared")
	if err != nil {
		return fail("%v", err)
	}
	var wg sync.WaitGroup
	var errs atomic.Int64
	run := func(key string) {
		defer wg.Done()
		l, err := m.Acquire(ctx, key, ferrolock.Wait(time.Minute))
		if err == nil {
			if _, err = l.Extend(ctx); err == nil {
				err = l.Release()
			}
		}
		if err != nil {
			errs.Add(1)
		}
	}
	for i := 0; i < 100; i++ { // waiters
		wg.Add(1)
		go run("go-burst:shared")
	}
	time.Sleep(100 * time.Millisecond) // some of them queued (not needed for the counts)
	if err := held.Release(); err != nil {
		return fail("%v", err)
	}
	for i := 0; i < 600; i++ { // concurrent acquire/extend/release
		wg.Add(1)
		go run(fmt.Sprintf("go-burst:%d", i))
	}
	wg.Wait()
	peakThreads, peakClients := osThreads(), clientsOn(port)
	m.Close()
	if n := errs.Load(); n > 0 {
		return fail("%d of the burst's calls failed", n)
	}
	// The library's threads (named "ferrolock": the runtime's worker and its blocking pool,
	// which a burst of completions grows to a hundred or more; "ferrolock-idle": the reaper)
	// must come back to the worker and the reaper once the pool's keep-alive (10 s) ends. Go's
	// own threads are not counted: Go keeps every thread it made, and how many a burst makes
	// depends on how loaded the machine is (a bound on every thread failed on a loaded 2-CPU
	// machine: 39 threads in all 90 s after Close, against at most 23).
	const maxLibrary = 2
	deadline := time.Now().Add(90 * time.Second)
	for {
		clients, library := clientsOn(port), libraryThreads()
		if clients == clients0 && library <= maxLibrary {
			fmt.Printf("before: %d clients, %d threads; after the burst: %d clients, %d threads; after Close and the idle limit: %d clients, %d of the library's threads (at most %d), %d in all\n",
				clients0, threads0, peakClients, peakThreads, clients, library, maxLibrary, osThreads())
			return 0
		}
		if time.Now().After(deadline) {
			return fail("after Close: %d clients (before: %d), %d of the library's threads (at most %d; by name: %s); after the burst: %d clients, %d threads",
				clients, clients0, library, maxLibrary, threadNames(), peakClients, peakThreads)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A contended Acquire that is granted counts one grant and no failure: its first try on the
// caller's thread, refused while the key was held elsewhere, used to count as a NOT_ACQUIRED
// failure of its own beside the wait's grant (and a ctx that ended the wait, as NOT_ACQUIRED
// and CANCELLED both). A TryAcquire refused still counts its failure.
func TestAContendedAcquireCountsOneGrantAndNoFailure(t *testing.T) {
	prefix := fmt.Sprintf("go-metrics-contended-%d", os.Getpid())
	ctx := context.Background()
	m, other := manager(t), manager(t)
	for i, k := range []string{prefix + ":lock", prefix + ":rw"} {
		acquire, hold := m.Acquire, other.Acquire
		if i == 1 {
			acquire, hold = m.AcquireWrite, other.AcquireRead
		}
		held, err := hold(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan error, 1)
		go func() {
			l, err := acquire(ctx, k)
			if err == nil {
				err = l.Release()
			}
			got <- err
		}()
		// Queued on every node: the first try was refused, the wait goes on.
		for j, port := range ports {
			if !settles(20*time.Second, func() bool { return queueKeys(t, port, k) > 0 }) {
				t.Fatalf("%s: the waiter never queued on node %d", k, j)
			}
		}
		if err := held.Release(); err != nil {
			t.Fatal(err)
		}
		if err := <-got; err != nil {
			t.Fatal(err)
		}
	}
	if _, err := m.TryAcquire(ctx, prefix+":try"); err != nil {
		t.Fatal(err) // not held: a grant (released when collected)
	}
	text := ferrolock.MetricsText()
	for _, want := range []string{
		fmt.Sprintf("ferrolock_grants_total{prefix=%q} 3\n", prefix),
		fmt.Sprintf("ferrolock_grants_total{prefix=%q,kind=\"read\"} 1\n", prefix),
		fmt.Sprintf("ferrolock_grants_total{prefix=%q,kind=\"write\"} 1\n", prefix),
	} {
		if !strings.Contains(text, want) {
			t.Errorf("no line %q in the metrics text:\n%s", want, text)
		}
	}
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "ferrolock_acquire_failures_total{") && strings.Contains(line, strconv.Quote(prefix)) {
			t.Errorf("a failure counted: %s", line)
		}
	}
}

// An Extend whose ctx is done while another call on the same Lock (an Extend stuck on paused
// nodes until its node timeout) has the handle returns ctx.Err() then, not once that call
// has ended.
func TestExtendWaitingForAnotherCallOnTheLockHonoursCtx(t *testing.T) {
	m := manager(t, ferrolock.TTL(30*time.Second), ferrolock.NodeTimeout(3*time.Second))
	l, err := m.Acquire(context.Background(), key("extend-behind-extend"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	pauseMajority(true)
	defer pauseMajority(false)
	first := make(chan error, 1)
	go func() {
		_, err := l.Extend(context.Background())
		first <- err
	}()
	for !ferrolock.LockBusy(l) {
		select {
		case err := <-first:
			t.Fatalf("the first Extend returned before the second could wait behind it: %v", err)
		default:
			runtime.Gosched()
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	second := make(chan error, 1)
	go func() {
		_, err := l.Extend(ctx)
		second <- err
	}()
	// Long enough for the second Extend to be waiting; the outcome does not depend on it.
	time.Sleep(50 * time.Millisecond)
	cancel()
	var secondErr error
	select {
	case secondErr = <-second:
	case err := <-first:
		t.Fatalf("the first Extend (on paused nodes) ended (%v) before the cancelled second one returned", err)
	}
	if !errors.Is(secondErr, context.Canceled) {
		t.Fatalf("the cancelled Extend: %v, want context.Canceled", secondErr)
	}
	select {
	case err := <-first:
		t.Fatalf("the first Extend had already ended (%v): the nodes were not paused", err)
	default:
	}
	if err := <-first; !errors.Is(err, ferrolock.ErrQuorumUnreachable) {
		t.Fatalf("the first Extend, on paused nodes: %v, want ErrQuorumUnreachable", err)
	}
}

// An Extend given fn's ctx after the lock's loss cancelled it says the lock was lost, naming
// it, as any Extend of a lost lock does, not a bare "context canceled".
func TestExtendWithTheScopesCtxAfterTheLossSaysLost(t *testing.T) {
	m := manager(t)
	k := key("extend-lost-ctx")
	var extendErr error
	err := m.WithLock(context.Background(), k, func(ctx context.Context, l *ferrolock.Lock) error {
		for _, port := range ports {
			if out, err := exec.Command("redis-cli", "-p", strconv.Itoa(port), "DEL", k).CombinedOutput(); err != nil {
				return fmt.Errorf("DEL: %v %s", err, out)
			}
		}
		// The watchdog's next renewal (at a third of the ttl) finds the key gone.
		select {
		case <-ctx.Done():
		case <-time.After(time.Minute):
			return errors.New("the deleted key was never seen lost")
		}
		_, extendErr = l.Extend(ctx)
		return nil
	})
	if !errors.Is(err, ferrolock.ErrLockLost) {
		t.Fatalf("WithLock: %v, want ErrLockLost (the key was deleted)", err)
	}
	if !errors.Is(extendErr, ferrolock.ErrLockLost) || !strings.Contains(extendErr.Error(), fmt.Sprintf("lock %q", k)) {
		t.Fatalf("Extend(ctx) after the loss cancelled ctx: %v, want ErrLockLost naming the lock", extendErr)
	}
}

// Validity, Fence, Err and a nested acquire's scope check read what the process knows of the
// Lock: a call on the same Lock stuck on paused nodes (an Extend, until its node timeout) does
// not hold them up, as none of them has a ctx to leave by.
func TestGettersDoNotWaitForACallStuckOnTheNodes(t *testing.T) {
	m := manager(t, ferrolock.TTL(30*time.Second), ferrolock.NodeTimeout(3*time.Second), ferrolock.Fencing(true))
	k := key("getters-beside-extend")
	err := m.WithLock(context.Background(), k, func(ctx context.Context, l *ferrolock.Lock) error {
		pauseMajority(true)
		defer pauseMajority(false)
		stuck := make(chan error, 1)
		go func() {
			_, err := l.Extend(context.Background())
			stuck <- err
		}()
		for !ferrolock.LockBusy(l) {
			select {
			case err := <-stuck:
				return fmt.Errorf("the Extend returned before the getters could run beside it: %v", err)
			default:
				runtime.Gosched()
			}
		}
		type got struct {
			validity time.Duration
			fence    bool
			err      error
			nested   error
		}
		gets := make(chan got, 1)
		go func() {
			var g got
			g.validity = l.Validity()
			_, g.fence = l.Fence()
			g.err = l.Err()
			_, g.nested = m.Acquire(ctx, k)
			gets <- g
		}()
		var g got
		select {
		case g = <-gets:
		case err := <-stuck:
			<-gets
			return fmt.Errorf("the Extend on paused nodes ended (%v) before Validity, Fence, Err "+
				"and a nested Acquire of its key returned: they waited for it", err)
		}
		select {
		case err := <-stuck:
			return fmt.Errorf("the Extend had already ended (%v): the nodes were not paused", err)
		default:
		}
		if g.validity <= 0 || !g.fence || g.err != nil {
			return fmt.Errorf("beside the stuck Extend: Validity %v, Fence %v, Err %v; want a "+
				"positive validity, a fence, nil", g.validity, g.fence, g.err)
		}
		if !errors.Is(g.nested, ferrolock.ErrNotAcquired) || !strings.Contains(g.nested.Error(), "waiting would deadlock") {
			return fmt.Errorf("a nested Acquire of the scope's key: %v, want it refused as waiting for itself", g.nested)
		}
		if err := <-stuck; !errors.Is(err, ferrolock.ErrQuorumUnreachable) {
			return fmt.Errorf("the Extend, on paused nodes: %v, want ErrQuorumUnreachable", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Redis takes keys up to 512 MB: the package's own messages show a key over 128 bytes by its
// start and its length, as the library's do, not the whole megabyte.
func TestLongKeyMessages(t *testing.T) {
	ctx := context.Background()
	key := strings.Repeat("k", 1<<20)
	shown := `"` + strings.Repeat("k", 64) + `…" (1048576 bytes)`
	var errs []error
	// A request carrying the megabyte takes most of the 200 ms default node timeout here
	// (170 to 220 ms for a release, unloaded): a loaded machine missed it.
	m := manager(t, ferrolock.NodeTimeout(time.Second))
	l, err := m.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	_, err = l.Extend(ctx, time.Nanosecond)
	errs = append(errs, err)
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	errs = append(errs, l.Release(), l.Err())
	errs = append(errs, m.WithLock(ctx, key, func(ctx context.Context, _ *ferrolock.Lock) error {
		return m.WithLock(ctx, key, func(context.Context, *ferrolock.Lock) error { return nil })
	}))
	closed, _ := ferrolock.NewManager()
	closed.Close()
	_, err = closed.Acquire(ctx, key)
	errs = append(errs, err)
	// One that is not UTF-8 (the library quotes it with U+FFFD for its bad byte, so its
	// length is that of the text shown).
	_, err = closed.Acquire(ctx, key[:len(key)-1]+"\xff")
	errs = append(errs, err)
	for i, err := range errs {
		if i == len(errs)-1 {
			shown = `"` + strings.Repeat("k", 64) + `…" (1048578 bytes)`
		}
		if err == nil || len(err.Error()) > 1000 || !strings.Contains(err.Error(), shown) {
			msg := fmt.Sprint(err)
			t.Errorf("message %d, %d bytes: %.200s", i, len(msg), msg)
		}
	}
}
