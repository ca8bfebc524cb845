package ferrolock

import "time"

// LiveHandles is the number of cgo handles the package holds (for the leak test).
func LiveHandles() int64 { return liveHandles.Load() }

// RestoreDefaultLogger undoes a test's SetLogger.
func RestoreDefaultLogger() { setDefaultLogger() }

// LibraryVersion is the linked C library's ferrolock_version().
func LibraryVersion() string { return libraryVersion() }

// LimitMs is the milliseconds a ReleaseAll or Shutdown limit passes to the library.
func LimitMs(d time.Duration) uint64 { return uint64(limitMs(d)) }

// LockBusy says whether a call on l (Extend, Release) holds its handle now.
func LockBusy(l *Lock) bool {
	if l.mu.TryLock() {
		l.mu.Unlock()
		return false
	}
	return true
}
