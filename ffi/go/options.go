package ferrolock

import (
	"fmt"
	"strings"
	"time"
)

// Option sets one option of the core's options table, by its snake_case name.
type Option func() setting

type setting struct {
	name  string
	value any // time.Duration, bool, uint64, float64, string, nil (none), or an error
}

// Set sets the option `name` (as in the README's configuration table) to value: a
// time.Duration, bool, an integer, a float64, a string, or nil for "none".
func Set(name string, value any) Option {
	return func() setting { return setting{name, value} }
}

// Nodes are the Redis URLs: one node, or N for Redlock. Default: FERROLOCK_NODES.
func Nodes(urls ...string) Option { return Set("nodes", strings.Join(urls, ",")) }

// TTL is the lease on each node (at least 100ms); the watchdog renews it every TTL/3.
func TTL(d time.Duration) Option { return Set("ttl", d) }

// Wait bounds how long Acquire waits; 0 tries once. Default: until ctx is done.
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

// Reentrant selects the Redisson-compatible hash lock.
func Reentrant(on bool) Option { return Set("reentrant", on) }

// Fencing gives every grant a fence token.
func Fencing(on bool) Option { return Set("fencing", on) }

// RestartGuard is the window after a node's (re)start in which its vote does not count.
func RestartGuard(d time.Duration) Option { return Set("restart_guard", d) }

// ShardedPubsub selects, on a Redis Cluster 7.0+, wake-ups over sharded pub/sub (true, the
// default) or classic pub/sub (false, for Redisson clients with shardedSubscriptionMode OFF).
func ShardedPubsub(on bool) Option { return Set("sharded_pubsub", on) }

func millis(name string, d time.Duration) (uint64, error) {
	if d < 0 {
		return 0, &Error{Code: "INVALID_ARGUMENT", Status: 1,
			Message: fmt.Sprintf("%s=%v: must not be negative", name, d)}
	}
	ms := uint64(d / time.Millisecond)
	if ms == 0 && d > 0 {
		ms = 1 // Redis expires in whole milliseconds
	}
	return ms, nil
}
