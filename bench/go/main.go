// Command bench is `make bench`'s Go and C part (issue 16); bench/run.sh --go-only runs it.
//
// Uncontended acquire+release per second, one goroutine doing each operation in turn, for
//   - hand-written go-redis: SET NX PX, then a compare-and-delete script (EVALSHA), on every
//     node at once with a majority counted: the baseline every ratio is against, measured in
//     the same process on the same redis-servers;
//   - redsync (WithTries(1): one attempt; it waits for every node's answer);
//   - ferrolock's Go package: Manager.Acquire + Lock.Release, and Manager.WithLock with an
//     empty callback (defaults: watchdog on).
//
// Then C: bench/c/blocking_loop.c (ferrolock_manager_acquire + ferrolock_lock_release) vs the
// same loop over the core's blocking path (bench/examples/blocking_loop.rs), in alternating
// rounds on the same servers. Each (part, node count, placement) runs in a process of its own
// that starts its own redis-servers; "pinned" runs that process, its servers and the loops on
// one CPU (taskset -c 0), "unpinned" lets the scheduler decide.
//
// Then contended (contended.go): 4 processes on one key, ferrolock vs redsync, 1 and 3 nodes.
//
// Every ferrolock manager here (Go, C, Rust) has ttl 10 s and the restart guard off (the
// servers are fresh: the guard would discount their votes for the first ttl).
//
// Usage: bench [-duration 2s] [-rounds 3] [-nodes 1,5] [-placements pinned,unpinned]
//
//	[-parts uncontended,c,contended] [-contended-nodes 1,3] [-contended-duration 3s]
//	[-procs 4] [-c-loop BIN] [-rust-loop BIN] [-out FILE] [-summary FILE] [-command S]
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"time"
)

type args struct {
	duration          time.Duration
	rounds            int
	nodes             []int
	placements        []string
	parts             []string
	contendedNodes    []int
	contendedDuration time.Duration
	procs             int
	cLoop, rustLoop   string
	out, summary      string
	command           string
	// A child process: "uncontended" or "c".
	child string
	// A contended worker: its library, nodes, counter server and key.
	worker, counter, key string
	urls                 []string
}

func ints(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q: expected a comma-separated list of counts >= 1", s)
		}
		out = append(out, n)
	}
	return out, nil
}

func parseArgs() (*args, error) {
	a := &args{}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.DurationVar(&a.duration, "duration", 2*time.Second, "each timed round (uncontended, C)")
	fs.IntVar(&a.rounds, "rounds", 3, "rounds per contender, interleaved; ops/s is the median round")
	nodes := fs.String("nodes", "1,5", "node counts of the uncontended and C parts")
	placements := fs.String("placements", "pinned,unpinned", "pinned (taskset -c 0) and/or unpinned")
	parts := fs.String("parts", "uncontended,c,contended", "parts to run")
	cnodes := fs.String("contended-nodes", "1,3", "node counts of the contended part")
	fs.DurationVar(&a.contendedDuration, "contended-duration", 3*time.Second, "each contended run")
	fs.IntVar(&a.procs, "procs", 4, "contending processes")
	fs.StringVar(&a.cLoop, "c-loop", "", "bench/c/blocking_loop.c, built (needed by the C part)")
	fs.StringVar(&a.rustLoop, "rust-loop", "", "the blocking_loop example of ferrolock-bench, built (needed by the C part)")
	fs.StringVar(&a.out, "out", "", "write the full markdown report here")
	fs.StringVar(&a.summary, "summary", "", "write the summary (for bench/results/latest.md) here")
	fs.StringVar(&a.command, "command", "go run ./bench/go", "the command line to quote in the report")
	fs.StringVar(&a.child, "child", "", "(internal) run one part's measuring process")
	fs.StringVar(&a.worker, "worker", "", "(internal) run one contended worker of this library")
	fs.StringVar(&a.counter, "counter", "", "(internal) the contended worker's counter server")
	fs.StringVar(&a.key, "key", "", "(internal) the contended worker's key")
	us := fs.String("urls", "", "(internal) the contended worker's nodes")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return nil, err
	}
	var err error
	if a.nodes, err = ints(*nodes); err != nil {
		return nil, fmt.Errorf("-nodes %w", err)
	}
	if a.contendedNodes, err = ints(*cnodes); err != nil {
		return nil, fmt.Errorf("-contended-nodes %w", err)
	}
	a.placements = strings.Split(*placements, ",")
	for _, p := range a.placements {
		if p != "pinned" && p != "unpinned" {
			return nil, fmt.Errorf("-placements: unknown placement %q (pinned, unpinned)", p)
		}
	}
	a.parts = strings.Split(*parts, ",")
	for _, p := range a.parts {
		if p != "uncontended" && p != "c" && p != "contended" {
			return nil, fmt.Errorf("-parts: unknown part %q (uncontended, c, contended)", p)
		}
	}
	if a.duration <= 0 || a.rounds < 1 || a.contendedDuration <= 0 || a.procs < 2 {
		return nil, fmt.Errorf("-duration and -contended-duration must be > 0, -rounds >= 1, -procs >= 2")
	}
	if *us != "" {
		a.urls = strings.Split(*us, ",")
	}
	if has(a.parts, "c") && a.child == "" && a.worker == "" && (a.cLoop == "" || a.rustLoop == "") {
		return nil, fmt.Errorf("the C part needs -c-loop and -rust-loop (bench/run.sh --go-only builds both)")
	}
	return a, nil
}

func has(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}

func hasTaskset() bool {
	return exec.Command("taskset", "-c", "0", "true").Run() == nil
}

// group is one (node count, placement) of the uncontended or C part.
type group struct {
	nodes     int
	placement string
	rows      []row
}

func runChild(a *args, part string, nodes int, placement string) ([]row, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	argv := []string{"-child", part, "-nodes", strconv.Itoa(nodes), "-duration", a.duration.String(),
		"-rounds", strconv.Itoa(a.rounds), "-c-loop", a.cLoop, "-rust-loop", a.rustLoop}
	cmd := exec.Command(self, argv...)
	if placement == "pinned" {
		cmd = exec.Command("taskset", append([]string{"-c", "0", self}, argv...)...)
	}
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("bench child (%s, %d nodes, %s): %w", part, nodes, placement, err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	var rows []row
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &rows); err != nil {
		return nil, fmt.Errorf("bench child (%s, %d nodes, %s) printed %q: %w", part, nodes, placement, out.String(), err)
	}
	return rows, nil
}

func run() error {
	a, err := parseArgs()
	if err != nil {
		return err
	}
	switch {
	case a.worker != "":
		return contendedWorker(a)
	case a.child == "uncontended":
		return uncontendedChild(a)
	case a.child == "c":
		return blockingChild(a)
	case a.child != "":
		return fmt.Errorf("-child %q: expected uncontended or c", a.child)
	}
	pinnedOK := hasTaskset()
	started := time.Now()
	rep := report{args: a}
	for _, part := range []string{"uncontended", "c"} {
		if !has(a.parts, part) {
			continue
		}
		for _, n := range a.nodes {
			for _, p := range a.placements {
				if p == "pinned" && !pinnedOK {
					fmt.Fprintln(os.Stderr, "bench/go: taskset not available, skipping the pinned runs")
					continue
				}
				fmt.Fprintf(os.Stderr, "bench/go: %s, %d node(s), %s ...\n", part, n, p)
				rows, err := runChild(a, part, n, p)
				if err != nil {
					return err
				}
				g := group{n, p, rows}
				if part == "c" {
					rep.c = append(rep.c, g)
				} else {
					rep.uncontended = append(rep.uncontended, g)
				}
			}
		}
	}
	if has(a.parts, "contended") {
		for _, n := range a.contendedNodes {
			fmt.Fprintf(os.Stderr, "bench/go: contended, %d node(s) ...\n", n)
			rows, err := contended(a, n)
			if err != nil {
				return err
			}
			rep.contended = append(rep.contended, cgroup{n, rows})
		}
	}
	rep.seconds = time.Since(started).Seconds()
	full, summary := rep.markdown(), rep.summaryMarkdown()
	fmt.Print(full)
	if a.out != "" {
		if err := os.WriteFile(a.out, []byte(full), 0o644); err != nil {
			return err
		}
	}
	if a.summary != "" {
		if err := os.WriteFile(a.summary, []byte(summary), 0o644); err != nil {
			return err
		}
	}
	return nil
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "bench/go: %v\n", err)
		os.Exit(1)
	}
}
