package main

import (
	"context"
	"encoding/json"
	"os"
	"sort"
	"time"
)

// row is one contender's figures in one (node count, placement).
type row struct {
	Name   string    `json:"name"`
	Ops    float64   `json:"ops"` // median round, operations per second
	P50    float64   `json:"p50"` // µs, over every operation of every round
	P99    float64   `json:"p99"`
	Rounds []float64 `json:"rounds"`
}

type sample struct {
	ops float64
	lat []float64
}

// measure runs op back to back for d: operations per second and each latency in µs.
func measure(ctx context.Context, op func(context.Context) error, d time.Duration) (sample, error) {
	var lat []float64
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
	return sample{float64(len(lat)) / now.Sub(started).Seconds(), lat}, nil
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
	var ops, lat []float64
	for _, s := range rounds {
		ops = append(ops, s.ops)
		lat = append(lat, s.lat...)
	}
	sort.Float64s(lat)
	sorted := append([]float64(nil), ops...)
	sort.Float64s(sorted)
	return row{Name: name, Ops: sorted[len(sorted)/2], P50: pct(lat, 50), P99: pct(lat, 99), Rounds: ops}
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
	warm := min(500*time.Millisecond, a.duration/2)
	for _, l := range libs {
		if _, err := measure(ctx, l.op, warm); err != nil {
			return err
		}
	}
	rounds := make([][]sample, len(libs))
	for r := 0; r < a.rounds; r++ {
		for i, l := range libs {
			s, err := measure(ctx, l.op, a.duration)
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
