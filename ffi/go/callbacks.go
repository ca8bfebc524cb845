package ferrolock

// The functions the C library calls back on its own threads. A file of its own: a cgo
// preamble next to //export may hold declarations only.

/*
#include <stdint.h>
#include "ferrolock.h"
*/
import "C"

import (
	"runtime/cgo"
	"sync/atomic"
)

// liveHandles counts the cgo handles this package holds (an acquisition's done channel while
// it waits, a lock's loss state until it is freed): every one is deleted once the C library
// can no longer call back with it, which the tests check after Close.
var liveHandles atomic.Int64

func newHandle(v any) cgo.Handle {
	liveHandles.Add(1)
	return cgo.NewHandle(v)
}

func deleteHandle(h cgo.Handle) {
	h.Delete()
	liveHandles.Add(-1)
}

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

//export ferrolockGoLog
func ferrolockGoLog(level C.int, message *C.char) {
	if s := sink.Load(); s != nil {
		s.enqueue(int(level), C.GoString(message))
	}
}
