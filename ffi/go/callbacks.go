package ferrolock

// The functions the C library calls back on its own threads. A file of its own: a cgo
// preamble next to //export may hold declarations only.

/*
#include <stdint.h>
#include "ferrolock.h"
*/
import "C"

import "runtime/cgo"

//export ferrolockGoDone
func ferrolockGoDone(handle C.uintptr_t) {
	done := cgo.Handle(handle).Value().(chan struct{})
	select {
	case done <- struct{}{}:
	default:
	}
}

//export ferrolockGoLost
func ferrolockGoLost(handle C.uintptr_t, reason *C.ferrolock_error) {
	loss := cgo.Handle(handle).Value().(*lossState)
	loss.signal(errorFrom(int(reason.code), C.GoString(reason.message)))
}
