package ferrolock_test

import (
	"testing"

	ferrolock "example.invalid/ferrolock/ffi/go"
)

// The package and the C library it links are the same release.
func TestVersionIsTheLinkedLibrarys(t *testing.T) {
	if got := ferrolock.LibraryVersion(); got != ferrolock.Version {
		t.Fatalf("ferrolock.Version is %q, the linked library's ferrolock_version() %q", ferrolock.Version, got)
	}
}
