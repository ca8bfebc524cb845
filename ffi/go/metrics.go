package ferrolock

/*
#include <stdlib.h>
#include "ferrolock.h"
*/
import "C"

// MetricsText returns the library's metrics as Prometheus text exposition: one registry per
// process (every Manager's acquire attempts, grants, failures by error code, wait and hold
// times, renewals, losses by reason and hand-offs, labelled by key prefix: the part before
// the last ':'). Serve it from a scrape handler as is:
//
//	http.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) {
//		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
//		io.WriteString(w, ferrolock.MetricsText())
//	})
func MetricsText() string {
	p := C.ferrolock_metrics_text()
	if p == nil {
		return ""
	}
	defer C.ferrolock_string_free(p)
	return C.GoString(p)
}
