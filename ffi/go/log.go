package ferrolock

/*
#include <stdint.h>
#include "ferrolock.h"

extern void ferrolockGoLog(int, char *);

static void go_log(void *userdata, int level, const char *message) {
	ferrolockGoLog(level, (char *)message);
}
// level 0 turns logging off.
static int go_set_log(int level, ferrolock_error **err) {
	return ferrolock_set_log_callback(level > 0 ? go_log : NULL, NULL, level > 0 ? level : 1, err);
}
*/
import "C"

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// LevelTrace is the level of the core's trace records, below slog.LevelDebug: a logger whose
// handler is enabled for it gets them.
const LevelTrace = slog.LevelDebug - 4

// The core's levels (FERROLOCK_LOG_ERROR = 1 to FERROLOCK_LOG_TRACE = 5) as slog's.
var logLevels = [...]slog.Level{slog.LevelError, slog.LevelWarn, slog.LevelInfo, slog.LevelDebug, LevelTrace}

// SetLogger sends the core's log records (a lock lost, a release finished in the background,
// a restarted node's vote held back, ...) to logger, at the most verbose level its handler is
// enabled for when SetLogger is called (call it again after changing that level); each record
// carries the attribute logger=ferrolock. nil silences the library. Until SetLogger is
// called, warnings and errors go to slog.Default() (as it is when each is logged).
//
// The library's threads only queue a record; a goroutine of the package hands it to the
// logger, so a slow handler delays no renewal (records that find the queue full are dropped
// and counted in a warning); Shutdown waits for the records queued before it returns (unless
// the handler itself calls it: those records wait for the handler). The handler may call
// ferrolock functions, SetLogger excepted. Once SetLogger has returned, the
// previous logger gets no more records. One logger per process.
func SetLogger(logger *slog.Logger) error {
	if logger == nil {
		return setLogSink(nil, 0)
	}
	for i := len(logLevels) - 1; i >= 0; i-- {
		if logger.Handler().Enabled(context.Background(), logLevels[i]) {
			return setLogSink(newLogSink(logger), C.int(i+1))
		}
	}
	return setLogSink(nil, 0)
}

// logItem is a record, or a flush mark (flushed is closed once the records before it are
// handled).
type logItem struct {
	r       slog.Record
	flushed chan struct{}
}

// logSink is a logger and the queue that feeds it.
type logSink struct {
	logger  *slog.Logger // nil: slog.Default() when each record is handled
	queue   chan logItem
	dropped atomic.Int64
	done    chan struct{}
	// The goroutine that hands records to the logger (see flushLog).
	drainer atomic.Uint64
}

var (
	logMu sync.Mutex // one replacement at a time
	sink  atomic.Pointer[logSink]
)

func init() { setDefaultLogger() }

// setDefaultLogger sends warnings and errors to slog.Default().
func setDefaultLogger() { setLogSink(newLogSink(nil), C.FERROLOCK_LOG_WARN) }

func newLogSink(logger *slog.Logger) *logSink {
	s := &logSink{logger: logger, queue: make(chan logItem, 1024), done: make(chan struct{})}
	go s.drain()
	return s
}

// setLogSink makes s (nil: none) the sink at level (0: off) and stops the previous one once
// the library can no longer queue into it.
func setLogSink(s *logSink, level C.int) error {
	logMu.Lock()
	defer logMu.Unlock()
	old := sink.Swap(s)
	var cerr *C.ferrolock_error
	if err := take(C.go_set_log(level, &cerr), cerr); err != nil {
		return err
	}
	// The library waited for the callbacks already running: none queues into old any more,
	// and what old holds reaches its logger before this returns.
	if old != nil {
		close(old.queue)
		<-old.done
	}
	return nil
}

// record is a record of the library's, stamped now.
func record(level slog.Level, message string) slog.Record {
	r := slog.NewRecord(time.Now(), level, message, 0)
	r.AddAttrs(slog.String("logger", "ferrolock"))
	return r
}

// enqueue runs on the logging thread: it must not block (see SetLogger).
func (s *logSink) enqueue(level int, message string) {
	l := slog.LevelError
	if level >= 1 && level <= len(logLevels) {
		l = logLevels[level-1]
	}
	select {
	case s.queue <- logItem{r: record(l, message)}:
	default:
		s.dropped.Add(1)
	}
}

func (s *logSink) drain() {
	defer close(s.done)
	s.drainer.Store(goroutineID())
	for item := range s.queue {
		if item.flushed != nil {
			close(item.flushed)
			continue
		}
		s.handle(item.r)
		if n := s.dropped.Swap(0); n > 0 {
			s.handle(record(slog.LevelWarn, fmt.Sprintf("%d log records dropped: the logger fell behind", n)))
		}
	}
}

func (s *logSink) handle(r slog.Record) {
	logger := s.logger
	if logger == nil {
		logger = slog.Default()
	}
	if h := logger.Handler(); h.Enabled(context.Background(), r.Level) {
		_ = h.Handle(context.Background(), r)
	}
}

// flushLog waits, at most limit, until the records queued so far have reached the logger:
// Shutdown's own records would otherwise be lost when main returns right after it.
func flushLog(limit time.Duration) {
	logMu.Lock() // the sink's queue stays open meanwhile
	defer logMu.Unlock()
	s := sink.Load()
	if s == nil || limit <= 0 {
		return
	}
	if id := goroutineID(); id != 0 && id == s.drainer.Load() {
		// Called from the logger's handler (Shutdown at the end of a record): the records
		// queued behind the one it handles wait for it to return, so waiting here would
		// only run out the limit.
		return
	}
	timer := time.NewTimer(limit)
	defer timer.Stop()
	flushed := make(chan struct{})
	select {
	case s.queue <- logItem{flushed: flushed}:
	case <-timer.C:
		return
	}
	select {
	case <-flushed:
	case <-timer.C:
	}
}

// goroutineID is the calling goroutine's number as a stack trace shows it ("goroutine 7
// [running]:"), 0 if it cannot be read. Go gives no other way to tell that a call comes from
// the handler that the package's own goroutine is running.
func goroutineID() uint64 {
	var buf [32]byte
	trace := strings.TrimPrefix(string(buf[:runtime.Stack(buf[:], false)]), "goroutine ")
	digits, _, _ := strings.Cut(trace, " ")
	id, err := strconv.ParseUint(digits, 10, 64)
	if err != nil {
		return 0
	}
	return id
}
