package ferrolock_test

// Close against calls in flight on the manager, and what every method does after it.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	ferrolock "example.invalid/ferrolock/ffi/go"
)

// stopped says whether the process pid is stopped (SIGSTOP): the proof that a pause happened.
func stopped(t *testing.T, pid int) bool {
	t.Helper()
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// The state follows the command name's closing parenthesis.
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	return len(fields) > 0 && fields[0] == "T"
}

// pauseMajorityProved pauses a majority of the nodes and fails the test unless each is
// stopped; the nodes resume when the test ends.
func pauseMajorityProved(t *testing.T) {
	t.Helper()
	pauseMajority(true)
	t.Cleanup(func() { pauseMajority(false) })
	for _, pid := range pids[len(pids)-(len(pids)/2+1):] {
		if !settles(10*time.Second, func() bool { return stopped(t, pid) }) {
			t.Fatalf("node pid %d never stopped", pid)
		}
	}
}

// A node timeout long enough that a request to a paused node outlasts anything Close may
// wait for, and the ttl it fits (loss margin 2 × node timeout under ttl / 3).
const stuckNodeTimeout = 20 * time.Second

var stuckOpts = []ferrolock.Option{ferrolock.NodeTimeout(stuckNodeTimeout), ferrolock.TTL(10 * stuckNodeTimeout)}

// An Acquire whose first round of requests hangs on paused nodes (until the node timeout)
// is ended by Close with ErrNotAcquired naming the key and the close, well before its
// requests' own deadline, and Close does not wait that deadline out either. Nothing of it is
// left once the nodes answer again.
func TestCloseEndsAnAcquireStuckOnPausedNodes(t *testing.T) {
	m := manager(t, stuckOpts...)
	k := key("close-stuck")
	pauseMajorityProved(t)
	start := time.Now()
	ended := make(chan error, 1)
	go func() {
		l, err := m.Acquire(context.Background(), k)
		if err == nil {
			l.Release()
			err = errors.New("granted with a majority paused")
		}
		ended <- err
	}()
	select {
	case err := <-ended:
		t.Fatalf("the Acquire returned before Close, with a majority paused: %v", err)
	case <-time.After(500 * time.Millisecond):
	}
	closed := make(chan error, 1)
	go func() { closed <- m.Close() }()
	var closeErr, acquireErr error
	for got := 0; got < 2; got++ {
		select {
		case closeErr = <-closed:
			closed = nil
		case acquireErr = <-ended:
			ended = nil
		case <-time.After(time.Until(start.Add(stuckNodeTimeout))):
			t.Fatalf("Close (returned: %v) and the Acquire (returned: %v) waited out the node timeout "+
				"of the requests stuck on the paused nodes", closed == nil, ended == nil)
		}
	}
	if closeErr != nil {
		t.Fatalf("Close: %v", closeErr)
	}
	if !errors.Is(acquireErr, ferrolock.ErrNotAcquired) || !strings.Contains(acquireErr.Error(), "closed") ||
		!strings.Contains(acquireErr.Error(), k) {
		t.Fatalf("the Acquire ended with %v, not ErrNotAcquired naming %q and the close", acquireErr, k)
	}
	pauseMajority(false)
	for _, port := range ports {
		if !settles(stuckNodeTimeout, func() bool { return keysNamed(t, port, k) == 0 }) {
			t.Fatalf("port %d: %d keys of the closed acquire left once the nodes answered", port, keysNamed(t, port, k))
		}
	}
}
