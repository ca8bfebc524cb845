package ferrolock

import (
	"context"
	"math"
	"reflect"
)

// countOption is Count's name: AcquirePermits and its kin take it out of the options (it is
// not a library option); anywhere else `set` refuses it, saying where it belongs.
const countOption = "count"

// Count is how many permits AcquirePermits, TryAcquirePermits and WithPermit take (default
// 1, at most the pool's permits); Release gives back exactly that many.
func Count(k int) Option { return Option{countOption, k} }

// AcquirePermits takes permits of the semaphore name, a pool of permits (Redisson's
// RPermitExpirableSemaphore layout), waiting as Acquire does; Count says how many (default
// 1). The pool size is set by the first acquire of name; a different permits later is
// ErrInvalidArgument naming both. The Lock is the same as Acquire's: the permits are leased
// for the TTL and renewed while held, Lost is closed if the lease is lost, and Release gives
// them back once. A holder that dies returns them when its lease ends. ErrInvalidArgument,
// naming the value: permits or count below 1 or above 2^32-1, count above permits or 1000, a
// '{' or '}' in name, a manager with more than one node (K permits on each of N nodes do not
// bound the holders to K), Fencing on. A semaphore does not re-enter: each acquire is a holder.
// With a ctx of a WithLock scope that holds name as a lock (through m), or of WithPermit
// scopes of name (through m) that leave fewer permits than Count, it returns ErrNotAcquired
// at once: it would wait for those scopes, which end only when their fn returns.
func (m *Manager) AcquirePermits(ctx context.Context, name string, permits int, opts ...Option) (*Lock, error) {
	return m.acquirePermits(ctx, "AcquirePermits", name, permits, opts)
}

// TryAcquirePermits tries AcquirePermits once: ErrNotAcquired if fewer than the count are
// free.
func (m *Manager) TryAcquirePermits(ctx context.Context, name string, permits int, opts ...Option) (*Lock, error) {
	return m.acquirePermits(ctx, "TryAcquirePermits", name, permits, append(append([]Option(nil), opts...), Wait(0)))
}

func (m *Manager) acquirePermits(ctx context.Context, op, name string, permits int, opts []Option) (*Lock, error) {
	k, rest, err := permitKind(name, permits, opts)
	if err != nil {
		return nil, err
	}
	return m.acquire(ctx, op, name, k, rest)
}

// WithPermit runs fn holding permits of the semaphore name (see AcquirePermits), with
// WithLock's rules: fn's ctx is cancelled when the permits are lost, they are released when
// fn returns or panics, and a ctx done while waiting returns ctx.Err() with nothing taken.
func (m *Manager) WithPermit(ctx context.Context, name string, permits int, fn func(context.Context, *Lock) error, opts ...Option) error {
	k, rest, err := permitKind(name, permits, opts)
	if err != nil {
		return err
	}
	return m.with(ctx, "WithPermit", name, k, fn, rest)
}

// WithPermit runs fn holding permits of name on the default manager (see
// Manager.WithPermit).
func WithPermit(ctx context.Context, name string, permits int, fn func(context.Context, *Lock) error, opts ...Option) error {
	m, err := Default()
	if err != nil {
		return err
	}
	return m.WithPermit(ctx, name, permits, fn, opts...)
}

// permitKind is the acquire kind for permits and the Count in opts, and opts without Count.
func permitKind(name string, permits int, opts []Option) (kind, []Option, error) {
	count := int64(1)
	var shown any = count
	rest := make([]Option, 0, len(opts))
	for _, o := range opts {
		if o.name != countOption {
			rest = append(rest, o)
			continue
		}
		switch rv := reflect.ValueOf(o.value); rv.Kind() {
		case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
			count = rv.Int()
			shown = count
		case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
			// Set promises every integer type. Capped where it is out of range anyway (past
			// int64 it would turn negative), and named as given.
			shown = rv.Uint()
			count = int64(min(rv.Uint(), math.MaxUint32+1))
		default:
			return kind{}, nil, invalid("semaphore %s: count = %v: want an integer (Count(k))", quoted(name), o.value)
		}
	}
	if permits < 0 || int64(permits) > math.MaxUint32 {
		return kind{}, nil, invalid("semaphore %s: permits %d: must be 1 to %d", quoted(name), permits, uint32(math.MaxUint32))
	}
	if count < 0 || count > math.MaxUint32 {
		return kind{}, nil, invalid("semaphore %s: count %v: must be 1 to %d", quoted(name), shown, uint32(math.MaxUint32))
	}
	return permitsKind(uint32(permits), uint32(count)), rest, nil
}
