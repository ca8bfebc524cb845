package ferrolock

/*
#include <stdlib.h>
#include "ferrolock.h"
*/
import "C"

import (
	"fmt"
	"reflect"
	"strings"
	"time"
	"unsafe"
)

// Option sets one option of the core's options table (the README's configuration table).
// Make one with Set or with the named constructors below (TTL, Wait, Nodes, ...).
type Option struct {
	name  string
	value any
}

// Set sets the option `name` (snake_case, as in the README's configuration table) to value:
// a time.Duration, a bool, an integer of any Go integer type, a float, a string, or nil for
// "none". A string (the name included) must not contain NUL: the C library takes
// NUL-terminated strings, so one would be cut short there; it is refused instead.
func Set(name string, value any) Option { return Option{name, value} }

// Nodes are the Redis URLs: one node, or N for Redlock. Default: FERROLOCK_NODES, else
// redis://127.0.0.1:6379.
func Nodes(urls ...string) Option { return Set("nodes", strings.Join(urls, ",")) }

// TTL is the lease on each node (at least 100ms); the watchdog renews it every TTL/3. A
// duration, as every option below that takes one: TTL(10) is 10 ns, refused, not 10 s; a
// fraction of a millisecond (100500*time.Microsecond) is refused too, not cut to 100ms.
func TTL(d time.Duration) Option { return Set("ttl", d) }

// Wait bounds how long Acquire waits; 0 tries once. Default: until ctx is done (or a quorum
// is unreachable on three attempts in a row: ErrQuorumUnreachable).
func Wait(d time.Duration) Option { return Set("wait", d) }

// RetryDelay is the mean pause between attempts.
func RetryDelay(d time.Duration) Option { return Set("retry_delay", d) }

// NodeTimeout bounds each request to each node. An acquire whose loss margin
// (2 × NodeTimeout) is not under TTL/3 is refused; the default always fits.
func NodeTimeout(d time.Duration) Option { return Set("node_timeout", d) }

// MaxHold stops the watchdog (and signals loss) after d.
func MaxHold(d time.Duration) Option { return Set("max_hold", d) }

// Watchdog turns renewal while held on or off (default on).
func Watchdog(on bool) Option { return Set("watchdog", on) }

// Reentrant selects the Redisson-compatible hash lock. Its owner is the WithLock scope the
// acquire's ctx carries (see Manager.WithLock): with a ctx of the scope that holds the key, an
// acquire re-enters; outside any scope each acquire is an owner of its own.
func Reentrant(on bool) Option { return Set("reentrant", on) }

// Fencing gives every grant a fence token.
func Fencing(on bool) Option { return Set("fencing", on) }

// DriftFactor is the share of the TTL allowed for clock drift between nodes, in [0, 1)
// (default 0.01; the drift is TTL × DriftFactor + 2 ms).
func DriftFactor(f float64) Option { return Set("drift_factor", f) }

// MaxExtensions caps the number of Extend calls on one lock (the watchdog's renewals do not
// count). Default: none.
func MaxExtensions(n int) Option { return Set("max_extensions", n) }

// TLSCA is a PEM file of the CA that signs the rediss:// nodes' certificates (default: the
// system's roots, or FERROLOCK_TLS_CA). A manager option.
func TLSCA(path string) Option { return Set("tls_ca", path) }

// RestartGuard is the window after a node's (re)start in which its vote does not count; 0 is
// off. Default with 3 nodes or more: the longest ttl the manager has been asked for (its own,
// or a longer one given to an acquire, Extend or WithLock); set it when other processes use
// longer ttls on the same keys.
func RestartGuard(d time.Duration) Option { return Set("restart_guard", d) }

// ShardedPubsub selects, on a Redis Cluster 7.0+, wake-ups over sharded pub/sub (true, the
// default) or classic pub/sub (false, for Redisson clients with shardedSubscriptionMode OFF).
func ShardedPubsub(on bool) Option { return Set("sharded_pubsub", on) }

func invalid(format string, args ...any) *Error {
	return &Error{Code: "INVALID_ARGUMENT", Status: 1, Message: fmt.Sprintf(format, args...)}
}

// cstring copies s for C (the caller frees it), refusing a NUL inside, which C would take for
// the end of the string: `what` names the value in the error.
// quoted is key as the library's messages show it, for this package's own: as %q does while
// the library shows it whole, by its start and its length once it is long (Redis takes keys up
// to 512 MB, and a message repeating a 1 MiB key is a megabyte long).
func quoted(key string) string {
	if strings.IndexByte(key, 0) < 0 {
		// The library takes text: bad bytes as U+FFFD, as its own refusal of such a key shows
		// them.
		ckey := C.CString(strings.ToValidUTF8(key, "\uFFFD"))
		defer C.free(unsafe.Pointer(ckey))
		if p := C.ferrolock_quoted_key(ckey); p != nil {
			defer C.ferrolock_string_free(p)
			// The library ends a key it shows whole with its quote, a long one with its length.
			if s := C.GoString(p); !strings.HasSuffix(s, `"`) {
				return s
			}
		}
	}
	return fmt.Sprintf("%q", key)
}

func cstring(what, s string) (*C.char, error) {
	if at := strings.IndexByte(s, 0); at >= 0 {
		return nil, invalid("%s %q: contains a NUL byte (the C library would cut it short there)", what, s)
	}
	return C.CString(s), nil
}

// cvalue is cstring for the value of the option name, which the error does not show: a nodes
// value's URLs may carry passwords, under a misspelt name too (the library names what else
// is wrong with one, redacted).
func cvalue(name, s string) (*C.char, error) {
	if at := strings.IndexByte(s, 0); at >= 0 {
		return nil, invalid("%s: a NUL byte at offset %d (the C library would cut it short there)", name, at)
	}
	return C.CString(s), nil
}

// millis is d in whole milliseconds, as the library counts time. Below a millisecond (other
// than 0) is refused rather than rounded: TTL(10) is 10 ns, almost surely meant as seconds.
// A fraction above it is for wholeMillis to refuse.
func millis(name string, d time.Duration) (uint64, error) {
	if d < 0 {
		return 0, invalid("%s=%v: must not be negative", name, d)
	}
	if d > 0 && d < time.Millisecond {
		return 0, invalid("%s=%v: below one millisecond, the library's unit (a time.Duration: write 10*time.Second, not 10)", name, d)
	}
	return uint64(d / time.Millisecond), nil
}

// maxMillis is the library's longest duration in milliseconds; it refuses a longer one as
// "too long", naming the maximum.
const maxMillis = 1<<31 - 1

// wholeMillis refuses a fraction of a millisecond (in Node's words), which millis would drop
// without a word: a lease of 100.5ms is not one of 100ms. Checked once the library has taken
// the whole milliseconds, so that a duration it refuses anyway (too long) is refused as that.
func wholeMillis(name string, d time.Duration) error {
	if d%time.Millisecond != 0 {
		return invalid("%s=%v: must be a whole number of milliseconds", name, d)
	}
	return nil
}

// options builds a C options object from Go options (nil when there are none).
func options(opts []Option) (*C.ferrolock_options, error) {
	if len(opts) == 0 {
		return nil, nil
	}
	o := C.ferrolock_options_new()
	for _, opt := range opts {
		if err := set(o, opt); err != nil {
			C.ferrolock_options_free(o)
			return nil, err
		}
	}
	return o, nil
}

// set applies one option to o.
func set(o *C.ferrolock_options, opt Option) error {
	if opt.name == countOption {
		// The permit calls take Count out before they get here.
		return invalid("count=%v: Count is an option of AcquirePermits, TryAcquirePermits and WithPermit only", opt.value)
	}
	name, err := cstring("option name", opt.name)
	if err != nil {
		return err
	}
	defer C.free(unsafe.Pointer(name))
	var status C.int
	var cerr *C.ferrolock_error
	switch v := opt.value.(type) {
	case nil:
		status = C.ferrolock_options_set_none(o, name, &cerr)
	case time.Duration:
		ms, err := millis(opt.name, v)
		if err != nil {
			return err
		}
		status = C.ferrolock_options_set_ms(o, name, C.uint64_t(ms), &cerr)
		if status == 0 {
			return wholeMillis(opt.name, v)
		}
	default:
		// By kind, so that every integer, float and string type is taken (int64, uint8, a
		// named type over int, ...), as Set promises.
		switch rv := reflect.ValueOf(v); rv.Kind() {
		case reflect.Bool:
			status = C.ferrolock_options_set_bool(o, name, C.bool(rv.Bool()), &cerr)
		case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
			if rv.Int() < 0 {
				return invalid("%s=%d: must not be negative", opt.name, rv.Int())
			}
			status = C.ferrolock_options_set_count(o, name, C.uint64_t(rv.Int()), &cerr)
		case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
			status = C.ferrolock_options_set_count(o, name, C.uint64_t(rv.Uint()), &cerr)
		case reflect.Float32, reflect.Float64:
			status = C.ferrolock_options_set_number(o, name, C.double(rv.Float()), &cerr)
		case reflect.String:
			value, err := cvalue(opt.name, rv.String())
			if err != nil {
				return err
			}
			status = C.ferrolock_options_set_str(o, name, value, &cerr)
			C.free(unsafe.Pointer(value))
		default:
			// By its type only: under a misspelt name, a nodes value is shown all the same.
			if opt.name == "nodes" {
				return invalid("nodes: unsupported value type %T (Nodes takes the URLs)", v)
			}
			return invalid("%s: unsupported value type %T", opt.name, v)
		}
	}
	return take(status, cerr)
}

// named returns the value of the last option called name in opts, and whether there is one.
func named(opts []Option, name string) (any, bool) {
	var value any
	found := false
	for _, opt := range opts {
		if opt.name == name {
			value, found = opt.value, true
		}
	}
	return value, found
}

// triesOnce says whether opts ask for a single attempt (Wait(0), as TryAcquire sets).
func triesOnce(opts []Option) bool {
	v, ok := named(opts, "wait")
	if !ok || v == nil {
		return false
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return rv.IsZero()
	}
	return false
}
