package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// The C part: bench/c/blocking_loop.c (through the C library) vs its baseline, the same loop
// over the core's blocking path (bench/examples/blocking_loop.rs), alternating in rounds on
// the same servers, each a process of its own inheriting this one's CPU mask.
const (
	cLoop    = "C ferrolock_manager_acquire + release"
	rustLoop = "core blocking path (Rust)"
)

type loopResult struct {
	Ops     float64 `json:"ops"`
	Seconds float64 `json:"seconds"`
	P50     float64 `json:"p50"`
	P99     float64 `json:"p99"`
}

func runLoop(bin string, nodes []string, seconds float64, key string) (loopResult, error) {
	var out bytes.Buffer
	cmd := exec.Command(bin, strings.Join(nodes, ","), fmt.Sprint(seconds), key)
	cmd.Stdout = &out
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		return loopResult{}, fmt.Errorf("%s: %w", bin, err)
	}
	var r loopResult
	if err := json.Unmarshal(bytes.TrimSpace(out.Bytes()), &r); err != nil {
		return r, fmt.Errorf("%s printed %q: %w", bin, out.String(), err)
	}
	return r, nil
}

func blockingChild(a *args) error {
	all, err := startServers(a.nodes[0])
	if err != nil {
		return err
	}
	defer stopAll(all)
	loops := []struct{ name, bin string }{{rustLoop, a.rustLoop}, {cLoop, a.cLoop}}
	rounds := map[string][]loopResult{}
	for r := 0; r < a.rounds; r++ {
		// Each goes first in every other round, so that neither always warms the servers.
		for i := range loops {
			l := loops[(i+r)%len(loops)]
			res, err := runLoop(l.bin, urls(all), a.duration.Seconds(), fmt.Sprintf("bench:blocking:%d", r))
			if err != nil {
				return err
			}
			rounds[l.name] = append(rounds[l.name], res)
		}
	}
	var rows []row
	for _, l := range loops {
		var ops, p50, p99 []float64
		for _, res := range rounds[l.name] {
			ops = append(ops, res.Ops/res.Seconds)
			p50 = append(p50, res.P50)
			p99 = append(p99, res.P99)
		}
		// Each process reports its own percentiles: the median over rounds.
		rows = append(rows, row{Name: l.name, Ops: median(ops), P50: median(p50), P99: median(p99), Rounds: ops})
	}
	return json.NewEncoder(os.Stdout).Encode(rows)
}
