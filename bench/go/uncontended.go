package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// row is one contender's figures in one (node count, placement).
type row struct {
	Name   string    `json:"name"`
	Ops    float64   `json:"ops"` // median round, operations per second
	P50    float64   `json:"p50"` // µs, over every operation of every round
	P99    float64   `json:"p99"`
	Rounds []float64 `json:"rounds"`
	// µs of CPU per operation (median round): this process (every thread), and the
	// redis-servers (every thread of each).
	ClientCPU float64 `json:"client_cpu"`
	RedisCPU  float64 `json:"redis_cpu"`
}

type sample struct {
	ops                 float64
	lat                 []float64
	clientCPU, redisCPU float64
}

// processCPU is this process's CPU time so far (user + system, every thread), in µs.
func processCPU() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e3
}

// serversCPU is the CPU time so far of every thread of the processes pids, in µs
// (/proc/<pid>/task/*/schedstat: nanoseconds on the CPU, exact where /proc/<pid>/stat counts
// 10 ms ticks).
func serversCPU(pids []int) float64 {
	var ns float64
	for _, pid := range pids {
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if err != nil {
			continue
		}
		for _, t := range tasks {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/schedstat", pid, t.Name()))
			if err != nil {
				continue // a thread that ended since the listing
			}
			if v, err := strconv.ParseFloat(strings.Fields(string(b))[0], 64); err == nil {
				ns += v
			}
		}
	}
	return ns / 1e3
}

// measure runs op back to back for d: operations per second, each latency in µs, and the CPU
// per operation of this process and of the servers pids.
func measure(ctx context.Context, op func(context.Context) error, d time.Duration, pids []int) (sample, error) {
	var lat []float64
	cpu0, redis0 := processCPU(), serversCPU(pids)
	started := time.Now()
	end := started.Add(d)
	now := started
	for now.Before(end) {
		t := time.Now()
		if err := op(ctx); err != nil {
			return sample{}, err
		}
		now = time.Now()
		lat = append(lat, float64(now.Sub(t).Nanoseconds())/1e3)
	}
	n := float64(max(len(lat), 1))
	return sample{
		ops:       float64(len(lat)) / now.Sub(started).Seconds(),
		lat:       lat,
		clientCPU: (processCPU() - cpu0) / n,
		redisCPU:  (serversCPU(pids) - redis0) / n,
	}, nil
}


func pct(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p / 100 * float64(len(sorted)))
	if i >= len(sorted) {
		i = len(sorted) - 1
	}
	return sorted[i]
}

// summarize turns rounds of samples into a row: the median round's ops/s, percentiles over all.
func summarize(name string, rounds []sample) row {
	var ops, lat, client, redis []float64
	for _, s := range rounds {
		ops = append(ops, s.ops)
		lat = append(lat, s.lat...)
		client = append(client, s.clientCPU)
		redis = append(redis, s.redisCPU)
	}
	sort.Float64s(lat)
	return row{Name: name, Ops: median(ops), P50: pct(lat, 50), P99: pct(lat, 99), Rounds: ops,
		ClientCPU: median(client), RedisCPU: median(redis)}
}

// uncontendedChild is one (node count, placement): its own servers (inheriting this process's
// CPU mask), every library in interleaved rounds so that a slow moment of the shared machine
// hits them all; prints the rows as one JSON line.
func uncontendedChild(a *args) error {
	all, err := startServers(a.nodes[0])
	if err != nil {
		return err
	}
	defer stopAll(all)
	libs, closeAll, err := libraries(all)
	if err != nil {
		return err
	}
	defer closeAll()
	ctx := context.Background()
	var pids []int
	for _, s := range all {
		pids = append(pids, s.cmd.Process.Pid)
	}
	warm := min(500*time.Millisecond, a.duration/2)
	for _, l := range libs {
		if _, err := measure(ctx, l.op, warm, nil); err != nil {
			return err
		}
	}
	rounds := make([][]sample, len(libs))
	for r := 0; r < a.rounds; r++ {
		for i, l := range libs {
			s, err := measure(ctx, l.op, a.duration, pids)
			if err != nil {
				return err
			}
			rounds[i] = append(rounds[i], s)
		}
	}
	var rows []row
	for i, l := range libs {
		rows = append(rows, summarize(l.name, rounds[i]))
	}
	return json.NewEncoder(os.Stdout).Encode(rows)
}
