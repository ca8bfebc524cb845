package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"

	"github.com/go-redsync/redsync/v4"
	redsyncredis "github.com/go-redsync/redsync/v4/redis"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sys/unix"
)

// Contended: `procs` processes loop on one key: acquire (blocking until granted) -> GET + SET
// of a counter on a separate redis-server -> release, for
//   - ferrolock: Manager.Acquire(ctx, key) with its defaults (wait until granted, as a queued
//     waiter woken by pub/sub; watchdog on) and Release;
//   - redsync: its default retry delay (random 50-250 ms) with tries = MaxInt32, i.e. until
//     granted (its default of 32 tries gives up after a few seconds: not a blocking acquire).
//
// Exclusion: the counter ends equal to the number of sections, and no two [granted, release
// called] intervals overlap (CLOCK_MONOTONIC, shared by every process of the machine).
var contendedLibs = []string{"ferrolock", "redsync"}

func monoUs() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(err)
	}
	return ts.Nano() / 1000
}

type workerResult struct {
	Start     int64      `json:"start"`
	End       int64      `json:"end"`
	Waits     []float64  `json:"waits"` // ms
	Intervals [][2]int64 `json:"intervals"`
	Errors    int        `json:"errors"`
}

type locker struct {
	acquire func(ctx context.Context) (release func() error, err error)
	close   func()
}

func makeLocker(name string, nodes []string) (*locker, error) {
	switch name {
	case "ferrolock":
		m, err := ferrolockManager(nodes)
		if err != nil {
			return nil, err
		}
		return &locker{
			acquire: func(ctx context.Context) (func() error, error) {
				l, err := m.Acquire(ctx, contendedKey)
				if err != nil {
					return nil, err
				}
				return l.Release, nil
			},
			close: func() { m.Close() },
		}, nil
	case "redsync":
		var pools []redsyncredis.Pool
		var cs []*redis.Client
		for _, u := range nodes {
			c := redis.NewClient(&redis.Options{Addr: strings.TrimPrefix(u, "redis://"), DisableIdentity: true})
			cs = append(cs, c)
			pools = append(pools, goredis.NewPool(c))
		}
		rs := redsync.New(pools...)
		return &locker{
			acquire: func(ctx context.Context) (func() error, error) {
				mu := rs.NewMutex(contendedKey, redsync.WithExpiry(ttl), redsync.WithTries(math.MaxInt32))
				if err := mu.LockContext(ctx); err != nil {
					return nil, err
				}
				return func() error { _, err := mu.UnlockContext(ctx); return err }, nil
			},
			close: func() {
				for _, c := range cs {
					c.Close()
				}
			},
		}, nil
	}
	return nil, fmt.Errorf("unknown library %q", name)
}

// contendedKey is per library (each runs on its own key, one after the other).
var contendedKey string

// contendedWorker: warms up, prints "ready", waits for a line on stdin, loops for the
// duration, prints one JSON line.
func contendedWorker(a *args) error {
	ctx := context.Background()
	counter := redis.NewClient(&redis.Options{Addr: a.counter, DisableIdentity: true})
	defer counter.Close()
	if err := counter.Ping(ctx).Err(); err != nil {
		return err
	}
	contendedKey = fmt.Sprintf("%s:warm:%d", a.key, os.Getpid())
	lk, err := makeLocker(a.worker, a.urls)
	if err != nil {
		return err
	}
	defer lk.close()
	// Warm the connections on a key of this process's own before the start line.
	release, err := lk.acquire(ctx)
	if err != nil {
		return err
	}
	if err := release(); err != nil {
		return err
	}
	contendedKey = a.key
	fmt.Println("ready")
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		return err
	}
	start := monoUs()
	end := start + a.duration.Microseconds()
	counterKey := a.key + ":counter"
	res := workerResult{Start: start, End: end}
	for monoUs() < end {
		called := monoUs()
		release, err := lk.acquire(ctx)
		if err != nil {
			res.Errors++
			if res.Errors > 1000 {
				return err
			}
			continue
		}
		granted := monoUs()
		// Capped by the window: a process that gets in only after the others stopped.
		res.Waits = append(res.Waits, float64(min(granted, end)-called)/1000)
		v, _ := counter.Get(ctx, counterKey).Int()
		if err := counter.Set(ctx, counterKey, v+1, 0).Err(); err != nil {
			return err
		}
		res.Intervals = append(res.Intervals, [2]int64{granted, monoUs()})
		if err := release(); err != nil {
			return err
		}
	}
	return json.NewEncoder(os.Stdout).Encode(res)
}

type contendedRow struct {
	Name      string
	Sections  int
	PerSecond float64
	PerProc   [2]float64
	P50       float64
	P99       float64
	Max       float64
	Counter   int
	Overlaps  int
	Errors    int
	Held      bool
}

type worker struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
}

func runContendedOne(a *args, lib string, nodes []string, counter *server, key string) (contendedRow, error) {
	var ws []worker
	defer func() {
		for _, w := range ws {
			if w.cmd.ProcessState == nil {
				_ = w.cmd.Process.Kill()
				_ = w.cmd.Wait()
			}
		}
	}()
	self, err := os.Executable()
	if err != nil {
		return contendedRow{}, err
	}
	for i := 0; i < a.procs; i++ {
		cmd := exec.Command(self, "-worker", lib, "-urls", strings.Join(nodes, ","), "-counter", counter.Addr,
			"-key", key, "-duration", a.contendedDuration.String())
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			return contendedRow{}, err
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return contendedRow{}, err
		}
		if err := cmd.Start(); err != nil {
			return contendedRow{}, err
		}
		ws = append(ws, worker{cmd, stdin, bufio.NewReader(stdout)})
	}
	for _, w := range ws {
		line, err := w.out.ReadString('\n')
		if err != nil || strings.TrimSpace(line) != "ready" {
			return contendedRow{}, fmt.Errorf("contended worker (%s) not ready: %q %v", lib, line, err)
		}
	}
	for _, w := range ws {
		if _, err := io.WriteString(w.stdin, "go\n"); err != nil {
			return contendedRow{}, err
		}
	}
	var results []workerResult
	for _, w := range ws {
		line, err := w.out.ReadString('\n')
		if err != nil {
			return contendedRow{}, fmt.Errorf("contended worker (%s): %v", lib, err)
		}
		var r workerResult
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			return contendedRow{}, err
		}
		if err := w.cmd.Wait(); err != nil {
			return contendedRow{}, fmt.Errorf("contended worker (%s): %v", lib, err)
		}
		results = append(results, r)
	}
	start, end := results[0].Start, results[0].End
	type iv struct{ a, b int64 }
	var all []iv
	var waits []float64
	inWindow := make([]float64, len(results))
	row := contendedRow{Name: lib}
	for i, r := range results {
		start, end = min(start, r.Start), max(end, r.End)
		for _, x := range r.Intervals {
			all = append(all, iv{x[0], x[1]})
			if x[0] < r.End {
				inWindow[i]++
			}
		}
		waits = append(waits, r.Waits...)
		row.Errors += r.Errors
	}
	sort.Slice(all, func(i, j int) bool { return all[i].a < all[j].a })
	for i := 1; i < len(all); i++ {
		if all[i].a < all[i-1].b {
			row.Overlaps++
		}
	}
	sort.Float64s(waits)
	seconds := float64(end-start) / 1e6
	total := 0.0
	row.PerProc = [2]float64{math.Inf(1), 0}
	for _, n := range inWindow {
		total += n
		row.PerProc[0] = min(row.PerProc[0], n/seconds)
		row.PerProc[1] = max(row.PerProc[1], n/seconds)
	}
	c := redis.NewClient(&redis.Options{Addr: counter.Addr, DisableIdentity: true})
	defer c.Close()
	v, err := c.Get(context.Background(), key+":counter").Result()
	if err != nil && err != redis.Nil {
		return row, err
	}
	row.Counter, _ = strconv.Atoi(v)
	row.Sections = len(all)
	row.PerSecond = total / seconds
	row.P50, row.P99 = pct(waits, 50), pct(waits, 99)
	if len(waits) > 0 {
		row.Max = waits[len(waits)-1]
	}
	row.Held = row.Overlaps == 0 && row.Counter == row.Sections
	return row, nil
}

// contended runs every library on nodeCount lock servers plus a counter server (unpinned).
func contended(a *args, nodeCount int) ([]contendedRow, error) {
	all, err := startServers(nodeCount + 1)
	if err != nil {
		return nil, err
	}
	defer stopAll(all)
	var rows []contendedRow
	for _, lib := range contendedLibs {
		r, err := runContendedOne(a, lib, urls(all[:nodeCount]), all[nodeCount], "bench:contended:"+lib)
		if err != nil {
			return nil, err
		}
		rows = append(rows, r)
	}
	return rows, nil
}
