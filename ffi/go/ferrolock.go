// Package ferrolock is the Go binding of ferrolock, distributed locks over Redis (one node,
// reentrant, Redlock over N nodes, with a watchdog and fencing tokens), through its C library.
//
// Build or install the C library first (`make ffi-lib`, or `make install PREFIX=...`) and
// point PKG_CONFIG_PATH at its ferrolock.pc: `go get` cannot build Rust. The library is
// linked statically.
//
// A waiting Acquire holds no OS thread: it starts a completion-based acquire in the library
// and waits on a channel the library's callback sends on.
package ferrolock

/*
#cgo pkg-config: ferrolock
#include <stdint.h>
#include <stdlib.h>
#include "ferrolock.h"

extern void ferrolockGoDone(uintptr_t);
extern void ferrolockGoLost(uintptr_t, ferrolock_error *);

static void go_done(void *userdata) { ferrolockGoDone((uintptr_t)userdata); }
static void go_lost(void *userdata, const ferrolock_error *reason) {
	ferrolockGoLost((uintptr_t)userdata, (ferrolock_error *)reason);
}
// side 0: the lock; FERROLOCK_RW_READ / FERROLOCK_RW_WRITE: a side of the read-write lock;
// GO_SIDE_PERMITS: `count` permits of the semaphore `key`, a pool of `permits`.
#define GO_SIDE_PERMITS (-1)
static int go_acquire_start(const ferrolock_manager *m, const char *key, int side, uint32_t permits,
		uint32_t count, const ferrolock_options *o, uint64_t owner, uintptr_t handle,
		ferrolock_acquisition **out, ferrolock_error **err) {
	if (side == 0) return ferrolock_manager_acquire_start(m, key, o, owner, go_done, (void *)handle, out, err);
	if (side == GO_SIDE_PERMITS)
		return ferrolock_manager_semaphore_acquire_start(m, key, permits, count, o, go_done, (void *)handle, out, err);
	return ferrolock_manager_rw_acquire_start(m, key, side, o, owner, go_done, (void *)handle, out, err);
}
// first: a try ahead of the wait (Acquire's), whose refusal the metrics do not count as a
// failed acquire (the wait is the acquire); else the caller's one try (TryAcquire's).
static int go_try_acquire(const ferrolock_manager *m, const char *key, int side, uint32_t permits,
		uint32_t count, const ferrolock_options *o, int first, ferrolock_lock **out, ferrolock_error **err) {
	if (first)
		return ferrolock_manager_first_try(m, key, side == GO_SIDE_PERMITS ? FERROLOCK_SEMAPHORE : side,
			permits, count, o, out, err);
	if (side == 0) return ferrolock_manager_try_acquire(m, key, o, out, err);
	if (side == GO_SIDE_PERMITS) return ferrolock_manager_semaphore_try_acquire(m, key, permits, count, o, out, err);
	return ferrolock_manager_rw_try_acquire(m, key, side, o, out, err);
}
static int go_on_lost(const ferrolock_lock *l, uintptr_t handle, ferrolock_error **err) {
	return ferrolock_lock_on_lost(l, go_lost, (void *)handle, err);
}
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"runtime/cgo"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

const statusPending = -1

// take turns a status and its C error into a Go error, freeing the C error.
func take(status C.int, cerr *C.ferrolock_error) error {
	if status == 0 {
		return nil
	}
	msg := ""
	if cerr != nil {
		msg = C.GoString(cerr.message)
		C.ferrolock_error_free(cerr)
	}
	return errorFrom(int(status), inGoTerms.Replace(msg))
}

// inGoTerms rewords what the C library tells its own callers (which setter passes an option,
// which call takes a manager's options) in this package's terms.
var inGoTerms = func() *strings.Replacer {
	var pairs []string
	for _, t := range [][2]string{
		{"ms", "a time.Duration"}, {"bool", "a bool"}, {"count", "an integer"},
		{"number", "a float64"}, {"str", "a string"}, {"none", "nil"},
	} {
		pairs = append(pairs,
			" is set with ferrolock_options_set_"+t[0], " takes "+t[1],
			"not ferrolock_options_set_"+t[0], "not "+t[1])
	}
	return strings.NewReplacer(append(pairs, "(ferrolock_manager_new)", "(NewManager)")...)
}()

// Manager holds the nodes and the default options of its locks. Safe for concurrent use.
// Its methods refuse a nil *Manager (a NewManager whose error went unchecked) and a nil ctx
// with ErrInvalidArgument naming them ("Acquire: nil *Manager", "Acquire: ctx is nil").
type Manager struct {
	// mu guards p and calls. Each call on p is counted (use, done), and the free waits for
	// none of them: the last to end after Close frees p. Held across a call, a lock would
	// keep Close, and every call after it, waiting for a call stuck on its nodes (a first
	// try, a ReleaseAll) for up to its node timeout or limit.
	mu    sync.Mutex
	p     *C.ferrolock_manager
	calls int
	// closed is set when Close begins: an acquire begun before then that finds the manager
	// closed was ended by the Close (ErrNotAcquired), one begun after is refused.
	closed atomic.Bool
	// reentrant is the manager's default for the reentrant option.
	reentrant bool
}

// NewManager checks the URLs and each option's value (the lease as a whole, a TTL its
// NodeTimeout fits, is checked at each acquire, which may set its own TTL); it opens no
// connection until the first acquire.
func NewManager(opts ...Option) (*Manager, error) {
	o, err := options(opts)
	if err != nil {
		return nil, err
	}
	if o == nil {
		o = C.ferrolock_options_new()
	}
	defer C.ferrolock_options_free(o)
	var p *C.ferrolock_manager
	var cerr *C.ferrolock_error
	if err := take(C.ferrolock_manager_new(o, &p, &cerr), cerr); err != nil {
		return nil, err
	}
	m := &Manager{p: p, reentrant: reentrant(opts, false)}
	// A Manager dropped without Close would otherwise keep its connections and library
	// state for the life of the process.
	runtime.SetFinalizer(m, (*Manager).Close)
	return m, nil
}

// Close frees the manager. An Acquire under way on it (waiting, or in its first try on nodes
// that do not answer) ends at once with ErrNotAcquired naming its key ("its manager was closed
// while it waited"), having given back what it had taken and left the key's queue on every node
// that answers before Close returns (Close waits at most 5 s; the rest goes on in the
// background; but a first try whose only node is silent, on a one-node Manager, undoes its
// request before it returns, up to the node timeout). Later calls on the manager fail at once
// with ErrInvalidArgument. A ReleaseAll under way goes on, within its limit, and Close does not
// wait for it (the manager's connections go once it ends). Close does not release the locks it
// handed out: they stay usable (renewed, releasable, their loss reported) until released, and
// Shutdown still releases those held; a WithLock whose fn is running keeps its lock (fn's ctx
// is not cancelled) and releases it when fn returns. Call ReleaseAll first to release them.
// Idempotent, and safe to call at once from several goroutines. A nil *Manager's Close returns
// ErrInvalidArgument, as do its other methods, instead of panicking. A Manager dropped without
// Close is closed when the garbage collector takes it (an Acquire still waiting on it keeps
// it).
func (m *Manager) Close() error {
	if err := refused("Close", m); err != nil {
		return err
	}
	m.closed.Store(true)
	// Closed beside the calls under way, which it ends (an acquire's first try stuck on its
	// nodes included), or which go on without it (a ReleaseAll); then freed by the last.
	m.mu.Lock()
	p := m.p
	if p != nil {
		m.calls++
	}
	m.mu.Unlock()
	if p != nil {
		C.ferrolock_manager_close(p, nil)
		m.done()
	}
	runtime.SetFinalizer(m, nil)
	return nil
}

// use is the C manager for a call, counted until its done; nil once Close has begun.
func (m *Manager) use() *C.ferrolock_manager {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.p == nil || m.closed.Load() {
		return nil
	}
	m.calls++
	return m.p
}

// done ends a call of use (or Close's own): the last to end once closed frees the manager,
// which the close has left nothing to wait for.
func (m *Manager) done() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.calls--; m.calls == 0 && m.closed.Load() && m.p != nil {
		C.ferrolock_manager_free(m.p)
		m.p = nil
	}
}

var errClosed = invalid("the manager is closed")

// closedFor is errClosed naming what was asked for, as the other bindings' errors do; for an
// acquire begun before the Close (began), the Close ended it: ErrNotAcquired, in the words
// the library uses for a wait the close ends.
func closedFor(key string, k kind, began bool) error {
	if began {
		return errorFrom(int(C.FERROLOCK_ERR_NOT_ACQUIRED), fmt.Sprintf(
			"%s %s not acquired: its manager was closed while it waited (nothing was left behind)",
			k.noun(), quoted(key)))
	}
	return invalid("%s %s: the manager is closed", k.noun(), quoted(key))
}

// refused is op's error for an argument that would otherwise panic deep inside it, naming
// it: a nil *Manager or *Lock receiver (the result of a constructor whose error went
// unchecked), a nil ctx, a nil fn (which WithLock would call only once the key is held).
// Each op passes its receiver and the arguments it takes; a nil ctx arrives as the only
// untyped nil, the others being typed.
func refused(op string, args ...any) error {
	for _, a := range args {
		switch v := a.(type) {
		case nil:
			return invalid("%s: ctx is nil", op)
		case *Manager:
			if v == nil {
				return invalid("%s: nil *Manager", op)
			}
		case *Lock:
			if v == nil {
				return invalid("%s: nil *Lock", op)
			}
		case func(context.Context, *Lock) error:
			if v == nil {
				return invalid("%s: fn is nil", op)
			}
		}
	}
	return nil
}

// ReleaseAll releases every lock this manager handed out and that was not released (held,
// or lost but perhaps still standing on some node), waiting at most limit (the rest goes on
// in the background; a negative limit waits not at all, and a fraction of a millisecond
// counts as a whole one). It returns how many were still held on a quorum. The Locks stay valid. A Lock still
// held is declared lost first: a WithLock body still running on it has its ctx cancelled
// with ErrLockLost, and its Release returns nil, as after any loss. For a
// worker's shutdown, or before Close.
func (m *Manager) ReleaseAll(limit time.Duration) (int, error) {
	if err := refused("ReleaseAll", m); err != nil {
		return 0, err
	}
	p := m.use()
	if p == nil {
		return 0, errClosed
	}
	defer m.done()
	var n C.size_t
	var cerr *C.ferrolock_error
	if err := take(C.ferrolock_manager_release_all(p, limitMs(limit), &n, &cerr), cerr); err != nil {
		return 0, err
	}
	return int(n), nil
}

// Shutdown runs the process-exit protocol, for the end of main: acquires still waiting give
// up (ErrNotAcquired), and every lock of every manager not yet released is released, waiting
// at most limit in all (what is not released by then expires with its ttl; limit as
// ReleaseAll's). Acquires started afterwards fail at once. Within the same limit, the log
// records queued by then reach the logger (see SetLogger). It returns how many locks were
// released in time. Being the end, it tells no holder: a WithLock body still running when
// it is called is not cancelled (call it once they have returned, or call each manager's
// ReleaseAll first, which tells them).
func Shutdown(limit time.Duration) int {
	start := time.Now()
	n := int(C.ferrolock_shutdown(limitMs(limit)))
	flushLog(limit - time.Since(start))
	return n
}

// limitMs is a time limit in whole milliseconds (a negative one is none at all). A fraction
// of a millisecond rounds up, where a lease's is refused: a limit only bounds a wait, and
// rounding down would make 500µs no wait at all.
func limitMs(d time.Duration) C.uint64_t {
	if d < 0 {
		return 0
	}
	ms := d / time.Millisecond
	if d%time.Millisecond != 0 {
		ms++
	}
	return C.uint64_t(ms)
}

// Acquire waits for key until it is granted, the Wait option runs out (ErrNotAcquired), a
// quorum of nodes is unreachable on three attempts in a row (ErrQuorumUnreachable, with or
// without Wait: a node down is an error to see, not a wait), or ctx is done: ctx.Err(), returned only once nothing of the acquire (a grant, a queue entry)
// is left on any node that answered, so another client may take the key at once (a node that
// does not answer within the node timeout is undone in the background when it does; Shutdown
// waits for that). The waiting goroutine holds no OS thread. A key (or an option string)
// containing NUL is refused with ErrInvalidArgument naming it: the C library takes
// NUL-terminated strings and would hold the key cut short at the NUL.
func (m *Manager) Acquire(ctx context.Context, key string, opts ...Option) (*Lock, error) {
	return m.acquire(ctx, "Acquire", key, lockKind, opts)
}

// TryAcquire tries key once: ErrNotAcquired if it is held elsewhere.
func (m *Manager) TryAcquire(ctx context.Context, key string, opts ...Option) (*Lock, error) {
	return m.acquire(ctx, "TryAcquire", key, lockKind, append(append([]Option(nil), opts...), Wait(0)))
}

// AcquireRead takes the read side of the read-write lock key (Redisson's RReadWriteLock
// layout), waiting as Acquire does: any number of readers share key, no writer holds it
// meanwhile. The Lock is the same as Acquire's (Lost, Extend, Release, renewal). A TTL above
// 30 s is refused with ErrInvalidArgument (Redisson's read renewal lease), as is Fencing
// (fence tokens go to writers only). With a ctx of a WithLock, WithReadLock or WithWriteLock
// scope, with or without the Reentrant option, the scope's owner re-enters either side and
// may read under its own write lock (a downgrade).
func (m *Manager) AcquireRead(ctx context.Context, key string, opts ...Option) (*Lock, error) {
	return m.acquire(ctx, "AcquireRead", key, readKind, opts)
}

// AcquireWrite takes the write side of the read-write lock key, waiting as Acquire does: it
// is granted with no reader and no other writer on key. An owner holding only the read side
// is refused (a read-to-write upgrade: two upgraders would wait for each other forever).
func (m *Manager) AcquireWrite(ctx context.Context, key string, opts ...Option) (*Lock, error) {
	return m.acquire(ctx, "AcquireWrite", key, writeKind, opts)
}

// TryAcquireRead tries the read side of key once: ErrNotAcquired if a writer holds it.
func (m *Manager) TryAcquireRead(ctx context.Context, key string, opts ...Option) (*Lock, error) {
	return m.acquire(ctx, "TryAcquireRead", key, readKind, append(append([]Option(nil), opts...), Wait(0)))
}

// TryAcquireWrite tries the write side of key once: ErrNotAcquired if anyone else holds it.
func (m *Manager) TryAcquireWrite(ctx context.Context, key string, opts ...Option) (*Lock, error) {
	return m.acquire(ctx, "TryAcquireWrite", key, writeKind, append(append([]Option(nil), opts...), Wait(0)))
}

// kind is what acquire takes: the lock, a side of the read-write lock, or permits.
type kind struct {
	side           C.int
	permits, count C.uint32_t
}

var (
	lockKind  = kind{side: 0}
	readKind  = kind{side: C.FERROLOCK_RW_READ}
	writeKind = kind{side: C.FERROLOCK_RW_WRITE}
)

// noun is what messages call a key of kind k, as the library's do.
func (k kind) noun() string {
	if k.side == C.GO_SIDE_PERMITS {
		return "semaphore"
	}
	return "lock"
}

// permitsKind is count permits of a pool of permits (both checked to fit a uint32 by the
// caller; the library refuses the rest, naming them).
func permitsKind(permits, count uint32) kind {
	return kind{side: C.GO_SIDE_PERMITS, permits: C.uint32_t(permits), count: C.uint32_t(count)}
}

func (m *Manager) acquire(ctx context.Context, op, key string, k kind, opts []Option) (*Lock, error) {
	if err := refused(op, m, ctx); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	began := !m.closed.Load()
	ckey, err := cstring("key", key)
	if err != nil {
		return nil, err
	}
	o, err := options(opts)
	if err != nil {
		C.free(unsafe.Pointer(ckey))
		return nil, err
	}
	// The uncontended fast path: one try on this goroutine's thread (a round trip per node,
	// bounded by the node timeout, like a syscall) before the completion-based wait, whose
	// hand-over through a library thread and a channel costs more than the round trip itself
	// (bench/results/go.md). Only a key held elsewhere goes on to wait.
	// At most a few such tries at once: a burst of goroutines would otherwise each pin an OS
	// thread for the round trip; the others go straight to the wait.
	var tried *C.ferrolock_lock
	var tryErr *C.ferrolock_error
	try := func() C.int {
		p := m.use()
		if p == nil {
			return -2
		}
		defer m.done()
		first := C.int(0)
		if !triesOnce(opts) {
			first = 1
		}
		return C.go_try_acquire(p, ckey, k.side, k.permits, k.count, o, first, &tried, &tryErr)
	}
	// An owned acquire (a reentrant lock in a WithLock scope) has no such try, which takes
	// no owner: it starts the owned wait at once (with Wait(0) a single try there too).
	if err := m.waitsForItself(ctx, key, k, opts); err != nil {
		C.free(unsafe.Pointer(ckey))
		if o != nil {
			C.ferrolock_options_free(o)
		}
		return nil, err
	}
	owner := m.owner(ctx, k, opts)
	triedHere := false
	tryStatus := C.int(C.FERROLOCK_ERR_NOT_ACQUIRED)
	if owner == C.FERROLOCK_NO_OWNER {
		// Without a free slot even a TryAcquire does not make its blocking try here: its one
		// try (Wait(0)) goes through the completion-based path below, holding no OS thread.
		select {
		case blockingCalls <- struct{}{}:
			tryStatus, triedHere = try(), true
			<-blockingCalls
		default:
		}
	}
	// A try that found a quorum unreachable (a connection that timed out while this thread
	// opened its own, under load) goes on to wait as well: the core's wait retries it and
	// gives up after its own streak of unreachable attempts, as every other binding does.
	waits := tryStatus == C.FERROLOCK_ERR_NOT_ACQUIRED || tryStatus == C.FERROLOCK_ERR_QUORUM_UNREACHABLE
	if triedHere && (!waits || triesOnce(opts)) {
		C.free(unsafe.Pointer(ckey))
		if o != nil {
			C.ferrolock_options_free(o)
		}
		if tryStatus == -2 || m.refusedAsClosed(began, tryStatus) {
			C.ferrolock_error_free(tryErr)
			return nil, closedFor(key, k, began)
		}
		if err := take(tryStatus, tryErr); err != nil {
			return nil, err
		}
		return newLock(tried, k)
	}
	C.ferrolock_error_free(tryErr)
	done := make(chan struct{}, 1)
	handle := newHandle(done)
	var acq *C.ferrolock_acquisition
	var cerr *C.ferrolock_error
	status := C.int(-2)
	if p := m.use(); p != nil {
		status = C.go_acquire_start(p, ckey, k.side, k.permits, k.count, o, owner, C.uintptr_t(handle), &acq, &cerr)
		m.done()
	}
	C.free(unsafe.Pointer(ckey))
	if o != nil {
		C.ferrolock_options_free(o)
	}
	if status == -2 || m.refusedAsClosed(began, status) {
		C.ferrolock_error_free(cerr)
		deleteHandle(handle)
		return nil, closedFor(key, k, began)
	}
	if err := take(status, cerr); err != nil {
		deleteHandle(handle)
		return nil, err
	}
	select {
	case <-done:
	case <-ctx.Done():
		C.ferrolock_acquisition_cancel(acq)
		<-done
	}
	// A waiting acquire keeps its Manager from being collected, and closed, under it.
	runtime.KeepAlive(m)
	var p *C.ferrolock_lock
	status = C.ferrolock_acquisition_result(acq, &p, &cerr)
	// The done callback is never called once this has returned: the handle can go.
	C.ferrolock_acquisition_free(acq)
	deleteHandle(handle)
	if status == statusPending {
		return nil, &Error{Code: "PANIC", Status: 8, Message: "acquisition done but still pending"}
	}
	if m.refusedAsClosed(began, status) {
		C.ferrolock_error_free(cerr)
		return nil, closedFor(key, k, began)
	}
	if err := take(status, cerr); err != nil {
		if errors.Is(err, ErrCancelled) && ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	return newLock(p, k)
}

// refusedAsClosed says whether a call of an acquire begun before Close (began) failed because
// of it: a call that reaches the library once the close is done is refused as an invalid
// argument, which this acquire was not (one with a bad option that a Close overtook is
// reported as ended by the Close, which it was too).
func (m *Manager) refusedAsClosed(began bool, status C.int) bool {
	return status == C.FERROLOCK_ERR_INVALID_ARGUMENT && began && m.closed.Load()
}

// scope is the owner of the reentrant locks (and of the read-write sides) acquired with a
// WithLock's ctx (and any ctx derived from it), for as long as that WithLock runs: Go has no
// goroutine identity to use.
type scope struct {
	owner C.uint64_t
	ended atomic.Bool
}

// scopeHold is what a WithLock (WithReadLock, WithWriteLock, WithPermit) holds, which fn's ctx
// carries, pointing to the hold of the scope it is nested in. Only the scopes a ctx is inside
// are on its chain: goroutines started beside each other in one scope do not see each other's
// holds (which end when the sibling's fn returns, not the scope's), and wait for them.
type scopeHold struct {
	parent    *scopeHold
	m         *Manager
	key       string
	k         kind
	reentrant bool
	lock      *Lock
}

type scopeHoldKey struct{}

// enclosingHold is the innermost hold of the scopes ctx is inside (nil: none).
func enclosingHold(ctx context.Context) *scopeHold {
	h, _ := ctx.Value(scopeHoldKey{}).(*scopeHold)
	return h
}

// holding is the innermost hold of key through m that ctx's enclosing scopes still have (not
// released by fn, nor lost): one to wait for would be waiting for itself.
func holding(ctx context.Context, m *Manager, key string) (*scopeHold, bool) {
	for h := enclosingHold(ctx); h != nil; h = h.parent {
		if h.m == m && h.key == key && h.lock.held() {
			return h, true
		}
	}
	return nil, false
}

// held says whether l is neither released nor lost.
func (l *Lock) held() bool {
	l.pmu.RLock()
	released := l.p == nil
	l.pmu.RUnlock()
	select {
	case <-l.Lost():
		return false
	default:
		return !released
	}
}

func isSide(k kind) bool { return k.side == readKind.side || k.side == writeKind.side }

var scopeNames = map[C.int]string{
	lockKind.side:  "WithLock",
	readKind.side:  "WithReadLock",
	writeKind.side: "WithWriteLock",
}

// waitsForItself refuses, as Python's and Node's do, an acquire of a key that the scopes ctx
// is inside hold through m, where waiting would deadlock: a scope ends only when its fn
// returns. The owner re-enters instead where it may: a reentrant lock asked reentrant, and
// either side of the read-write lock (the core re-enters, downgrades, or refuses an upgrade
// naming it). A semaphore's permits never re-enter: beside permits they may be granted, and
// beside a read-write hold the core refuses them at once, but a lock of their name is one
// they wait for.
func (m *Manager) waitsForItself(ctx context.Context, key string, k kind, opts []Option) error {
	if k.side == C.GO_SIDE_PERMITS {
		// Beside what the enclosing WithPermit scopes hold, too few permits are left: waiting
		// would be for those scopes, which end only after this wait. Only the scopes ctx is
		// inside count: goroutines started beside each other in one still wait for each other.
		stuck, permits, count := uint64(0), uint64(k.permits), uint64(k.count)
		for h := enclosingHold(ctx); h != nil; h = h.parent {
			if h.m == m && h.key == key && h.k.side == k.side && h.k.permits == k.permits && h.lock.held() {
				stuck += uint64(h.k.count)
			}
		}
		if stuck > 0 && count+stuck > permits {
			return errorFrom(int(C.FERROLOCK_ERR_NOT_ACQUIRED), fmt.Sprintf(
				"semaphore %s not acquired: this ctx's enclosing WithPermit scopes hold %d of its %d "+
					"permits (on the same Manager), and this asks for %d: they go back only when "+
					"those scopes end, so waiting would deadlock", quoted(key), stuck, permits, count))
		}
	}
	h, ok := holding(ctx, m, key)
	if !ok || h.k.side == C.GO_SIDE_PERMITS || (isSide(h.k) && isSide(k)) {
		return nil
	}
	if k.side == C.GO_SIDE_PERMITS {
		if h.k != lockKind {
			return nil
		}
		return errorFrom(int(C.FERROLOCK_ERR_NOT_ACQUIRED), fmt.Sprintf(
			"semaphore %s not acquired: this ctx is inside a WithLock scope that holds it as a "+
				"lock (on the same Manager), which a semaphore waits for, so waiting would deadlock", quoted(key)))
	}
	if h.k == lockKind && k == lockKind && h.reentrant && reentrant(opts, m.reentrant) {
		return nil
	}
	hint := ""
	if h.k == k {
		hint = "; pass Reentrant(true) to both to re-enter"
	}
	return errorFrom(int(C.FERROLOCK_ERR_NOT_ACQUIRED), fmt.Sprintf(
		"lock %s not acquired: this ctx is inside a %s scope that holds it (on the same "+
			"Manager), so waiting would deadlock%s", quoted(key), scopeNames[h.k.side], hint))
}

type scopeKey struct{}

// owners numbers the scopes of the process (the core maps each to a hash field of its own).
var owners atomic.Uint64

// owner is the owner an acquire with ctx and opts passes: the live scope ctx carries for a
// reentrant lock or a side of the read-write lock (whose owner may re-enter and downgrade,
// and is refused an upgrade, as in every binding), else none (a grant that nothing
// re-enters).
func (m *Manager) owner(ctx context.Context, k kind, opts []Option) C.uint64_t {
	if !isSide(k) && !reentrant(opts, m.reentrant) {
		return C.FERROLOCK_NO_OWNER
	}
	if s, ok := ctx.Value(scopeKey{}).(*scope); ok && !s.ended.Load() {
		return s.owner
	}
	return C.FERROLOCK_NO_OWNER
}

// reentrant is the reentrant option opts set last (a bool), else def.
func reentrant(opts []Option, def bool) bool {
	if v, ok := named(opts, "reentrant"); ok {
		if rv := reflect.ValueOf(v); rv.Kind() == reflect.Bool {
			return rv.Bool()
		}
	}
	return def
}

// blockingCalls bounds the blocking cgo calls running at once (first tries, Release,
// Extend): each pins its goroutine's OS thread, which Go keeps once made, with the thread's
// own connections to the nodes. Unbounded, a burst of 2,000 goroutines left 125 threads.
var blockingCalls = make(chan struct{}, 4*runtime.NumCPU())

// lossState is what the library's loss callback reaches (through a cgo handle).
type lossState struct {
	mu   sync.Mutex
	lost bool
	ch   chan struct{}
	err  error
	// notify is WithLock's context cancel while its fn runs: called by signal itself, so
	// that no goroutine per WithLock waits on ch.
	notify func(error)
}

func (s *lossState) signal(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lost {
		// Returns once the first signal is done: whoever sees the loss then sees all of it.
		return
	}
	s.lost, s.err = true, err
	// WithLock's ctx is cancelled before Lost() closes (a context's cancel runs no caller
	// code: its AfterFuncs start goroutines), so that fn never sees Lost() closed, or Err
	// saying lost, with its ctx not yet cancelled.
	if s.notify != nil {
		s.notify(err)
	}
	close(s.ch)
}

// lostErr is the loss once signalled, else nil. Under s.mu: a WithLock's ctx is cancelled
// with the loss inside signal, so whoever saw that ctx done finds the loss here.
func (s *lossState) lostErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.lost {
		return nil
	}
	return s.err
}

// onLoss makes a later loss call f (at once if the lock is already lost); nil stops that. A
// loss signalled while f is being replaced may still call the old f once.
func (s *lossState) onLoss(f func(error)) {
	s.mu.Lock()
	s.notify = f
	lost, err := s.lost, s.err
	s.mu.Unlock()
	if lost && f != nil {
		f(err)
	}
}

// Lock is a held lock. Release it (WithLock does); a Lock dropped unreleased is released in
// the background when collected, with a warning naming its key. Collection follows the last
// use of the Lock, not the end of the work it guards: keep using it (call Release at the end)
// for as long as you mean to hold the lock.
//
// A nil *Lock (what a failed Acquire returns) holds nothing, and says so without a panic:
// Release, Extend and Err return ErrInvalidArgument ("Release: nil *Lock"), Lost is closed,
// Validity is 0, Fence has none, Key and Token are empty.
type Lock struct {
	// mu is held by the calls that go to the nodes (Extend, Release, the end of a scope) and
	// by the free: the core runs a lock's extend and release one at a time anyway.
	mu callMu
	// pmu guards p only against the free (p changes under both mu and pmu): the library's
	// lock is thread-safe, and Validity, Fence, Err and a scope's check have no ctx to leave
	// by, so they read it beside a call stuck on the nodes rather than wait up to its node
	// timeout.
	pmu    sync.RWMutex
	p      *C.ferrolock_lock
	key    string
	noun   string // "lock", or "semaphore" for permits
	token  string
	loss   *lossState
	handle cgo.Handle
}

// callMu is the Lock's mutex over its C handle, as a channel: an Extend waiting for another
// call on the Lock (an Extend or Release on slow nodes, up to their node timeout) leaves when
// its ctx is done. The zero value is unlocked.
type callMu struct {
	once sync.Once
	ch   chan struct{}
}

func (m *callMu) slot() chan struct{} {
	m.once.Do(func() { m.ch = make(chan struct{}, 1) })
	return m.ch
}

func (m *callMu) Lock()   { m.slot() <- struct{}{} }
func (m *callMu) Unlock() { <-m.slot() }

// lockUnless locks, unless stop is closed first (false: not locked).
func (m *callMu) lockUnless(stop <-chan struct{}) bool {
	select {
	case m.slot() <- struct{}{}:
		return true
	case <-stop:
		return false
	}
}

// TryLock locks if no one holds it.
func (m *callMu) TryLock() bool {
	select {
	case m.slot() <- struct{}{}:
		return true
	default:
		return false
	}
}

func newLock(p *C.ferrolock_lock, k kind) (*Lock, error) {
	l := &Lock{
		p:     p,
		noun:  k.noun(),
		key:   C.GoString(C.ferrolock_lock_key(p)),
		token: C.GoString(C.ferrolock_lock_token(p)),
		loss:  &lossState{ch: make(chan struct{})},
	}
	l.handle = newHandle(l.loss)
	var cerr *C.ferrolock_error
	if err := take(C.go_on_lost(p, C.uintptr_t(l.handle), &cerr), cerr); err != nil {
		C.ferrolock_lock_free(p)
		deleteHandle(l.handle)
		return nil, err
	}
	runtime.SetFinalizer(l, (*Lock).collected)
	return l, nil
}

// free lets go of the C handle (releasing in the background if still held); the loss
// callback is never called once ferrolock_lock_free has returned, so the cgo handle can go.
func (l *Lock) free() { l.freeWith(func(p *C.ferrolock_lock) { C.ferrolock_lock_free(p) }) }

// collected is free for the finalizer: a lock still held is released with a warning naming
// its key (the collection follows the Lock's last use, which may be before its work ended).
func (l *Lock) collected() {
	l.freeWith(func(p *C.ferrolock_lock) { C.ferrolock_lock_free_collected(p) })
}

func (l *Lock) freeWith(free func(*C.ferrolock_lock)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.p == nil {
		return
	}
	// Freed outside pmu: ferrolock_lock_free_collected calls the loss callback on this thread.
	l.pmu.Lock()
	p := l.p
	l.p = nil
	l.pmu.Unlock()
	free(p)
	deleteHandle(l.handle)
}

// Key is the locked key.
func (l *Lock) Key() string {
	if l == nil {
		return ""
	}
	return l.key
}

// Token is a plain lock's value stored at the key, unique to this acquisition; a reentrant
// or read-write lock's hash field ("<client uuid>:<owner id>"), shared by one owner's
// re-entries; a semaphore's permit id.
func (l *Lock) Token() string {
	if l == nil {
		return ""
	}
	return l.token
}

// Fence is the grant's fence token (with the Fencing option), else false.
func (l *Lock) Fence() (uint64, bool) {
	if l == nil {
		return 0, false
	}
	l.pmu.RLock()
	defer l.pmu.RUnlock()
	if l.p == nil {
		return 0, false
	}
	var f C.uint64_t
	if C.ferrolock_lock_fence(l.p, &f, nil) != 0 {
		return 0, false
	}
	return uint64(f), true
}

// Validity is the time left before the lock may be someone else's (0 once released or lost).
func (l *Lock) Validity() time.Duration {
	if l == nil {
		return 0
	}
	l.pmu.RLock()
	defer l.pmu.RUnlock()
	if l.p == nil {
		return 0
	}
	return time.Duration(C.ferrolock_lock_validity_ms(l.p)) * time.Millisecond
}

// Lost is closed when the lock is lost (before its validity ends, while the process runs),
// at the latest when an Extend or Err returns ErrLockLost. A nil Lock's is closed: a goroutine
// guarding its work with it stops rather than waits forever on a lock never held.
func (l *Lock) Lost() <-chan struct{} {
	if l == nil {
		return closedChan
	}
	return l.loss.ch
}

var closedChan = func() chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}()

// Err is nil while held, the ErrLockLost error once lost, ErrNotHeld once released.
func (l *Lock) Err() error {
	if err := refused("Err", l); err != nil {
		return err
	}
	select {
	case <-l.loss.ch:
		return l.loss.err
	default:
	}
	l.pmu.RLock()
	defer l.pmu.RUnlock()
	if l.p == nil {
		return &Error{Code: "NOT_HELD", Status: 3, Message: fmt.Sprintf("%s %s was released", l.noun, quoted(l.key))}
	}
	var cerr *C.ferrolock_error
	err := take(C.ferrolock_lock_check(l.p, &cerr), cerr)
	if errors.Is(err, ErrLockLost) {
		// As after Extend: Lost() and a WithLock's ctx say so once Err does, not only once
		// the core's loss callback reaches this package a moment later.
		l.loss.signal(err)
	}
	return err
}

// Extend renews the lock on a quorum for its lease (or ttl, if given, the new lease) and
// returns the new validity. No node's expiry is shortened: a shorter ttl takes effect there as
// the longer one runs down. On failure the validity is unchanged. ctx cancels the extend, and
// its wait for another call on the Lock (an Extend, a Release) to end: ctx.Err() then, or
// the ErrLockLost error if the lock is lost (which cancels a WithLock's ctx).
func (l *Lock) Extend(ctx context.Context, ttl ...time.Duration) (time.Duration, error) {
	if err := refused("Extend", l, ctx); err != nil {
		return 0, err
	}
	if ctx.Err() != nil {
		return 0, l.ctxErr(ctx)
	}
	var ms uint64
	if len(ttl) > 1 {
		return 0, invalid("Extend takes one ttl at most, got %d: %v", len(ttl), ttl)
	}
	if len(ttl) > 0 {
		var err error
		if ms, err = millis("ttl", ttl[0]); err == nil && ms <= maxMillis {
			// One the library refuses as too long is refused as that, fraction or not.
			err = wholeMillis("ttl", ttl[0])
		}
		if err == nil && ms == 0 {
			err = invalid("ttl=0s: must be greater than zero")
		}
		if err != nil {
			// Named as the library's own refusals of a ttl are (too short, too long).
			e := err.(*Error)
			e.Message = fmt.Sprintf("%s %s: %s", l.noun, quoted(l.key), e.Message)
			return 0, e
		}
	}
	cancel := C.ferrolock_cancel_new()
	defer C.ferrolock_cancel_free(cancel)
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		C.ferrolock_cancel_trigger(cancel)
		close(fired)
	})
	// Runs before the token's free (deferred later): a trigger under way is done with it first.
	defer func() {
		if !stop() {
			<-fired
		}
	}()
	if !l.mu.lockUnless(fired) {
		return 0, l.ctxErr(ctx)
	}
	defer l.mu.Unlock()
	if l.p == nil {
		return 0, &Error{Code: "NOT_HELD", Status: 3, Message: fmt.Sprintf("%s %s was released", l.noun, quoted(l.key))}
	}
	select {
	case blockingCalls <- struct{}{}:
	case <-fired:
		return 0, l.ctxErr(ctx)
	}
	var v C.uint64_t
	var cerr *C.ferrolock_error
	status := C.ferrolock_lock_extend(l.p, C.uint64_t(ms), cancel, &v, &cerr)
	<-blockingCalls
	if err := take(status, cerr); err != nil {
		if errors.Is(err, ErrCancelled) && ctx.Err() != nil {
			return 0, l.ctxErr(ctx)
		}
		if errors.Is(err, ErrLockLost) {
			// Lost() and a WithLock's ctx say so when Extend does, not only once the core's
			// loss callback reaches this package a moment later.
			l.loss.signal(err)
		}
		return 0, err
	}
	return time.Duration(v) * time.Millisecond, nil
}

// ctxErr is what an Extend whose ctx is done returns: the lock's loss if it is lost (fn's ctx
// in WithLock is cancelled by it; "context canceled" would hide which lock, and why), else
// ctx.Err().
func (l *Lock) ctxErr(ctx context.Context) error {
	if err := l.loss.lostErr(); err != nil {
		return err
	}
	return ctx.Err()
}

// Release releases the lock (compare-and-delete: never someone else's) and frees it. After a
// loss it still gives back what is left and returns nil, unless no quorum of nodes answered
// (ErrQuorumUnreachable: those nodes keep what they hold until its ttl); a second Release is
// ErrNotHeld.
func (l *Lock) Release() error {
	if err := refused("Release", l); err != nil {
		return err
	}
	l.mu.Lock()
	if l.p == nil {
		l.mu.Unlock()
		return &Error{Code: "NOT_HELD", Status: 3, Message: fmt.Sprintf("%s %s was already released", l.noun, quoted(l.key))}
	}
	var cerr *C.ferrolock_error
	blockingCalls <- struct{}{}
	err := take(C.ferrolock_lock_release(l.p, nil, &cerr), cerr)
	<-blockingCalls
	l.mu.Unlock()
	l.free()
	runtime.SetFinalizer(l, nil)
	return err
}

// WithLock runs fn while holding key, then releases it. fn's context is cancelled (cause:
// the ErrLockLost error) if the lock is lost; WithLock then returns that error, joined with
// fn's own (fn's alone if it wraps that very error, as context.Cause(ctx) returned is). A ctx done while waiting returns ctx.Err() and keeps nothing. ctx bounds the wait
// and is the parent of fn's context; the Wait option bounds the wait only. If fn panics (or
// calls runtime.Goexit), the lock is released and fn's context cancelled before the panic
// goes on to the caller. A nil fn is refused (ErrInvalidArgument, "WithLock: fn is nil")
// before anything is acquired.
//
// With a reentrant lock (the Reentrant option), the owner is this WithLock's scope: Go has no
// goroutine identity, so fn's ctx carries it, as does every ctx derived from it. A nested
// WithLock, Acquire or TryAcquire with such a ctx re-enters a key the scope holds (each
// handle is released on its own; the key is freed at the outermost release). Goroutines
// given that ctx are the same owner: concurrent children enter together and do not exclude
// one another (give each a ctx not derived from fn's, or use a plain lock, for that). Once
// WithLock returns its scope owns nothing: a ctx that outlives it (context.WithoutCancel)
// acquires as a new owner. Outside any scope each acquire is an owner of its own.
func (m *Manager) WithLock(ctx context.Context, key string, fn func(context.Context, *Lock) error, opts ...Option) (err error) {
	return m.with(ctx, "WithLock", key, lockKind, fn, opts)
}

// WithReadLock runs fn holding the read side of the read-write lock key (see AcquireRead),
// with WithLock's rules: fn's ctx is cancelled when the hold is lost, the hold is released
// when fn returns or panics, and the ctx carries the scope's owner.
func (m *Manager) WithReadLock(ctx context.Context, key string, fn func(context.Context, *Lock) error, opts ...Option) error {
	return m.with(ctx, "WithReadLock", key, readKind, fn, opts)
}

// WithWriteLock runs fn holding the write side of the read-write lock key (see AcquireWrite),
// with WithLock's rules.
func (m *Manager) WithWriteLock(ctx context.Context, key string, fn func(context.Context, *Lock) error, opts ...Option) error {
	return m.with(ctx, "WithWriteLock", key, writeKind, fn, opts)
}

func (m *Manager) with(ctx context.Context, op, key string, k kind, fn func(context.Context, *Lock) error, opts []Option) (err error) {
	// Before the acquire: a nil fn would otherwise panic only once the key is held.
	if err := refused(op, m, ctx, fn); err != nil {
		return err
	}
	// A ctx without a live scope gets one: this WithLock's, ended when it returns, so that a
	// ctx that outlives it (a detached goroutine's) owns nothing.
	s, ok := ctx.Value(scopeKey{}).(*scope)
	if !ok || s.ended.Load() {
		s = &scope{owner: C.uint64_t(owners.Add(1))}
		defer s.ended.Store(true)
		ctx = context.WithValue(ctx, scopeKey{}, s)
	}
	l, err := m.acquire(ctx, op, key, k, opts)
	if err != nil {
		return err
	}
	// fn's ctx carries the hold: a nested acquire of key that would wait for it is refused.
	ctx = context.WithValue(ctx, scopeHoldKey{}, &scopeHold{
		parent: enclosingHold(ctx), m: m, key: key, k: k, reentrant: reentrant(opts, m.reentrant), lock: l,
	})
	inner, cancel := context.WithCancelCause(ctx)
	l.loss.onLoss(cancel)
	var fnErr error
	returned := false
	// Deferred: a panicking fn (recovered further up, as net/http does) must not leave the
	// lock held and renewed until a collection runs the finalizer.
	defer func() {
		l.loss.onLoss(nil)
		cancel(nil)
		var lostErr error
		select {
		case <-l.Lost():
			lostErr = l.loss.err
		default:
		}
		// The rule every binding shares (C's ferrolock_lock_end_scope): a lock lost, or
		// found gone at the release after fn succeeded, is ErrLockLost; one fn released
		// itself is nothing; after fn failed (or panicked), a release problem is logged.
		withFn, endErr := l.endScope(fnErr != nil || !returned)
		if lostErr != nil && (endErr == nil || errors.Is(endErr, ErrLockLost)) {
			// Lost while fn ran, released by fn or not: the very error fn's ctx was
			// cancelled with, joined with fn's own error if it failed.
			endErr, withFn = lostErr, fnErr != nil
		}
		switch {
		case endErr == nil:
			err = fnErr
		case withFn && errors.Is(fnErr, endErr):
			// fn returned the very loss its ctx was cancelled with (context.Cause(ctx)), or
			// wrapped it: joined with itself, it would be said twice.
			err = fnErr
		case withFn:
			err = errors.Join(fnErr, endErr)
		default:
			err = endErr
		}
	}()
	fnErr = fn(inner, l)
	returned = true
	return nil
}

// endScope releases the lock at the end of WithLock's scope, unless fn released it, applies
// the shared end-of-scope rule (C's ferrolock_lock_end_scope) and frees the lock. err is what
// to report instead of fn's outcome (nil: fn's stands); withFn: joined with fn's error.
func (l *Lock) endScope(fnFailed bool) (withFn bool, err error) {
	l.mu.Lock()
	if l.p == nil {
		l.mu.Unlock()
		return false, nil // released (and freed) by fn
	}
	var cerr *C.ferrolock_error
	var caused C.bool
	blockingCalls <- struct{}{}
	err = take(C.ferrolock_lock_end_scope(l.p, C.bool(fnFailed), &caused, &cerr), cerr)
	<-blockingCalls
	l.mu.Unlock()
	l.free()
	runtime.SetFinalizer(l, nil)
	return bool(caused), err
}

var (
	defaultOnce    sync.Once
	defaultManager *Manager
	defaultErr     error
)

// Default is the shared manager on FERROLOCK_NODES (or redis://127.0.0.1:6379), made on
// first use.
func Default() (*Manager, error) {
	defaultOnce.Do(func() { defaultManager, defaultErr = NewManager() })
	return defaultManager, defaultErr
}

// WithLock runs fn while holding key on the default manager (see Manager.WithLock); opts are
// lock options.
func WithLock(ctx context.Context, key string, fn func(context.Context, *Lock) error, opts ...Option) error {
	m, err := Default()
	if err != nil {
		return err
	}
	return m.WithLock(ctx, key, fn, opts...)
}

// WithReadLock runs fn holding the read side of key on the default manager (see
// Manager.WithReadLock).
func WithReadLock(ctx context.Context, key string, fn func(context.Context, *Lock) error, opts ...Option) error {
	m, err := Default()
	if err != nil {
		return err
	}
	return m.WithReadLock(ctx, key, fn, opts...)
}

// WithWriteLock runs fn holding the write side of key on the default manager (see
// Manager.WithWriteLock).
func WithWriteLock(ctx context.Context, key string, fn func(context.Context, *Lock) error, opts ...Option) error {
	m, err := Default()
	if err != nil {
		return err
	}
	return m.WithWriteLock(ctx, key, fn, opts...)
}
