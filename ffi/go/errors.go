package ferrolock

import "fmt"

// Error is every error ferrolock returns, except a cancelled wait, which returns ctx.Err()
// (an Extend of a lost lock returns its ErrLockLost error, though: its WithLock ctx is
// cancelled by that loss).
// Compare with errors.Is against the sentinels (ErrNotAcquired, ErrLockLost, ...).
type Error struct {
	// Code is the core's stable error code: "NOT_ACQUIRED", "LOCK_LOST", ...
	Code string
	// Status is the C library's status number (FERROLOCK_ERR_*).
	Status int
	// Message names the key, the node (password redacted) and the offending value.
	Message string
}

func (e *Error) Error() string {
	if e.Message == "" {
		return "ferrolock: " + e.Code
	}
	return fmt.Sprintf("ferrolock: %s: %s", e.Code, e.Message)
}

// Is matches a sentinel of the same kind.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Message == "" && t.Status == e.Status
}

// The kinds of the core's error table (status numbers as in ferrolock.h).
var (
	ErrInvalidArgument   = &Error{Code: "INVALID_ARGUMENT", Status: 1}
	ErrNotAcquired       = &Error{Code: "NOT_ACQUIRED", Status: 2}
	ErrNotHeld           = &Error{Code: "NOT_HELD", Status: 3}
	ErrLockLost          = &Error{Code: "LOCK_LOST", Status: 4}
	ErrQuorumUnreachable = &Error{Code: "QUORUM_UNREACHABLE", Status: 5}
	ErrRedis             = &Error{Code: "REDIS_ERROR", Status: 6}
	// ErrCancelled is what the library reports for a cancelled call; Go callers see ctx.Err().
	ErrCancelled = &Error{Code: "CANCELLED", Status: 7}
	ErrPanic     = &Error{Code: "PANIC", Status: 8}
)

var sentinels = []*Error{ErrInvalidArgument, ErrNotAcquired, ErrNotHeld, ErrLockLost,
	ErrQuorumUnreachable, ErrRedis, ErrCancelled, ErrPanic}

func errorFrom(status int, message string) *Error {
	code := "UNKNOWN"
	for _, s := range sentinels {
		if s.Status == status {
			code = s.Code
		}
	}
	return &Error{Code: code, Status: status, Message: message}
}
