package main

// A diagnostic row, not a contender: acquire + release as one blocking cgo call into the C
// library (the calling goroutine's OS thread blocks in it). The Go package instead starts a
// completion-based acquire and waits on a channel, so that a waiting goroutine holds no OS
// thread; the gap between the two rows is what that costs an uncontended caller.

/*
#cgo pkg-config: ferrolock
#include <stdlib.h>
#include "ferrolock.h"

static int bench_manager(const char *nodes, ferrolock_manager **out) {
	ferrolock_options *o = ferrolock_options_new();
	int s = ferrolock_options_set_str(o, "nodes", nodes, NULL);
	if (!s) s = ferrolock_options_set_ms(o, "ttl", 10000, NULL);
	if (!s) s = ferrolock_options_set_ms(o, "restart_guard", 0, NULL);
	if (!s) s = ferrolock_manager_new(o, out, NULL);
	ferrolock_options_free(o);
	return s;
}

static int bench_acquire_release(const ferrolock_manager *m, const char *key) {
	ferrolock_lock *l = NULL;
	int s = ferrolock_manager_acquire(m, key, NULL, NULL, &l, NULL);
	if (s) return s;
	s = ferrolock_lock_release(l, NULL, NULL);
	ferrolock_lock_free(l);
	return s;
}
*/
import "C"

import (
	"context"
	"fmt"
	"strings"
	"unsafe"
)

const cgoFloor = "diagnostic: one blocking cgo call"

func cgoBlockingLib(nodes []string) (lib, func(), error) {
	cnodes := C.CString(strings.Join(nodes, ","))
	defer C.free(unsafe.Pointer(cnodes))
	var m *C.ferrolock_manager
	if s := C.bench_manager(cnodes, &m); s != 0 {
		return lib{}, nil, fmt.Errorf("cgo floor: manager: %s", C.GoString(C.ferrolock_status_name(s)))
	}
	key := C.CString("bench:cgo")
	op := func(context.Context) error {
		if s := C.bench_acquire_release(m, key); s != 0 {
			return fmt.Errorf("cgo floor: %s", C.GoString(C.ferrolock_status_name(s)))
		}
		return nil
	}
	return lib{cgoFloor, op}, func() {
		C.ferrolock_manager_free(m)
		C.free(unsafe.Pointer(key))
	}, nil
}
