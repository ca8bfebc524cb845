package ferrolock

// #include "ferrolock.h"
import "C"

// Version is this package's version, the C library's it is released with (the workspace
// version; scripts/check-version.sh keeps them equal).
const Version = "0.1.0"

// libraryVersion is the version of the C library linked in (ferrolock_version()).
func libraryVersion() string { return C.GoString(C.ferrolock_version()) }
