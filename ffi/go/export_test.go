package ferrolock

// LiveHandles is the number of cgo handles the package holds (for the leak test).
func LiveHandles() int64 { return liveHandles.Load() }

// RestoreDefaultLogger undoes a test's SetLogger.
func RestoreDefaultLogger() { setDefaultLogger() }

// LibraryVersion is the linked C library's ferrolock_version().
func LibraryVersion() string { return libraryVersion() }
