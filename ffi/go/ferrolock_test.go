package ferrolock_test

// Against real redis-servers started by ../tests/with-redis.sh (FERROLOCK_TEST_PORTS,
// FERROLOCK_TEST_PIDS, FERROLOCK_NODES).

import (
	"bufio"
	"context"
	"errors"
	"fmt"
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
	return len(strings.Fields(string(out)))
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
	add("manager option on an acquire", err, "manager")
	// A node timeout its ttl cannot renew with (loss margin 10 s, not under 1 s / 3): refused at
	// acquire, not reported lost with "validity 0s"; and a ttl too short to renew.
	_, err = m.Acquire(ctx, key("margin"), ferrolock.TTL(time.Second), ferrolock.NodeTimeout(5*time.Second))
	add("node timeout too long for the ttl", err, "node timeout 5s")
	_, err = m.Acquire(ctx, key("short-ttl"), ferrolock.TTL(10*time.Millisecond))
	add("ttl too short to renew", err, "ttl 10ms is too short")
	for _, c := range cases {
		var fe *ferrolock.Error
		if !errors.Is(c.err, ferrolock.ErrInvalidArgument) || !errors.As(c.err, &fe) || !strings.Contains(fe.Message, c.want) {
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
	if _, err := closed.Acquire(ctx, "k"); !errors.Is(err, ferrolock.ErrInvalidArgument) {
		t.Errorf("closed manager: %v", err)
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
	if err := locks[1].Release(); !errors.Is(err, ferrolock.ErrNotHeld) {
		t.Fatalf("a released lock released again: %v", err)
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
	for i := 0; i < 2; i++ {
		if _, err := m.Acquire(context.Background(), fmt.Sprintf("%s:%d", part, i)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	if n := ferrolock.Shutdown(10 * time.Second); n != 2 {
		fmt.Fprintln(os.Stderr, "Shutdown released", n)
		return 2
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
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "FERROLOCK_GO_SHUTDOWN="+part)
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("child: %v", err)
	}
	for _, port := range ports {
		if n := keysNamed(t, port, part); n != 0 {
			t.Fatalf("port %d: %d keys left", port, n)
		}
	}
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
