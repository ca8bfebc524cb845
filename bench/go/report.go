package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

type cgroup struct {
	nodes int
	rows  []contendedRow
}

type report struct {
	args        *args
	uncontended []group
	c           []group
	contended   []cgroup
	seconds     float64
}

// fmtNum formats x with thousands separators and d decimals.
func fmtNum(x float64, d int) string {
	s := fmt.Sprintf("%.*f", d, x)
	intPart, frac, _ := strings.Cut(s, ".")
	neg := strings.HasPrefix(intPart, "-")
	intPart = strings.TrimPrefix(intPart, "-")
	var b strings.Builder
	for i, r := range intPart {
		if i > 0 && (len(intPart)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(r)
	}
	out := b.String()
	if neg {
		out = "-" + out
	}
	if d > 0 {
		out += "." + frac
	}
	return out
}

func plural(n int) string {
	if n == 1 {
		return "1 node"
	}
	return fmt.Sprintf("%d nodes", n)
}

func find(groups []group, nodes int, placement, name string) (float64, bool) {
	for _, g := range groups {
		if g.nodes == nodes && g.placement == placement {
			for _, r := range g.rows {
				if r.Name == name {
					return r.Ops, true
				}
			}
		}
	}
	return 0, false
}

func moduleVersion(path string) string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, m := range info.Deps {
			if m.Path == path {
				return m.Version
			}
		}
	}
	return "?"
}

func metOr(ok bool) string {
	if ok {
		return "met"
	}
	return "missed"
}

// targets are the lines "Targets of issue 16" of both reports.
func (r *report) targets() []string {
	var t []string
	for _, g := range r.c {
		core, ok1 := find(r.c, g.nodes, g.placement, rustLoop)
		c, ok2 := find(r.c, g.nodes, g.placement, cLoop)
		if ok1 && ok2 && c > 0 {
			t = append(t, fmt.Sprintf("- C within 1.15× of the core's blocking path, %s, %s: core ÷ C = **%s×** (%s)",
				plural(g.nodes), g.placement, fmtNum(core/c, 2), metOr(core/c <= 1.15)))
		}
	}
	for _, p := range r.args.placements {
		for _, name := range []string{ferroAcquire, ferroWithLock} {
			f, ok1 := find(r.uncontended, 1, p, name)
			b, ok2 := find(r.uncontended, 1, p, baseline)
			if ok1 && ok2 {
				t = append(t, fmt.Sprintf("- Go %s ≥ 1.0× hand-written go-redis, 1 node, %s: **%s×** (%s)",
					name, p, fmtNum(f/b, 2), metOr(f >= b)))
			}
		}
	}
	for _, p := range r.args.placements {
		for _, name := range []string{ferroAcquire, ferroWithLock} {
			f, ok1 := find(r.uncontended, 5, p, name)
			rs, ok2 := find(r.uncontended, 5, p, redsyncName)
			if ok1 && ok2 {
				t = append(t, fmt.Sprintf("- Go %s ≥ 1.2× redsync, 5 nodes, %s: **%s×** (%s)",
					name, p, fmtNum(f/rs, 2), metOr(f >= 1.2*rs)))
			}
		}
	}
	for _, g := range r.contended {
		for _, row := range g.rows {
			if row.Name == "ferrolock" {
				t = append(t, fmt.Sprintf("- contended, %s: ferrolock worst wait ≤ 20 ms: **%s ms** (%s)",
					plural(g.nodes), fmtNum(row.Max, 2), metOr(row.Max <= 20)))
			} else {
				t = append(t, fmt.Sprintf("- contended, %s: %s worst wait (as measured): %s ms",
					plural(g.nodes), row.Name, fmtNum(row.Max, 2)))
			}
		}
	}
	return t
}

// budgets turns each pinned speed target into CPU µs per acquire+release, and says how much of
// it is left to this process once the servers have had theirs.
func (r *report) budgets() []string {
	row := func(nodes int, name string) (row, bool) {
		for _, g := range r.uncontended {
			if g.nodes == nodes && g.placement == "pinned" {
				for _, x := range g.rows {
					if x.Name == name {
						return x, true
					}
				}
			}
		}
		return row{}, false
	}
	var out []string
	for _, t := range []struct {
		nodes  int
		base   string
		factor float64
		what   string
	}{{1, baseline, 1.0, "1.0× hand-written go-redis"}, {5, redsyncName, 1.2, "1.2× redsync"}} {
		f, ok1 := row(t.nodes, ferroAcquire)
		b, ok2 := row(t.nodes, t.base)
		if !ok1 || !ok2 || f.RedisCPU == 0 {
			continue
		}
		allowed := 1e6 / (t.factor * b.Ops)
		out = append(out, fmt.Sprintf("- %s: %s is %s ops/s, a budget of %s µs per acquire+release; ferrolock "+
			"Acquire/Release spends %s µs in this process and %s µs in Redis (%s: %s and %s), so it would need %s µs "+
			"or less in this process.", plural(t.nodes), t.what, fmtNum(t.factor*b.Ops, 0), fmtNum(allowed, 1),
			fmtNum(f.ClientCPU, 1), fmtNum(f.RedisCPU, 1), t.base, fmtNum(b.ClientCPU, 1), fmtNum(b.RedisCPU, 1),
			fmtNum(max(0, allowed-f.RedisCPU), 1)))
	}
	return out
}

func (r *report) facts() string {
	return fmt.Sprintf("Go %s, redsync %s, go-redis %s, %d CPUs; command: `%s` (%.0f s).",
		strings.TrimPrefix(runtime.Version(), "go"), moduleVersion("github.com/go-redsync/redsync/v4"),
		moduleVersion("github.com/redis/go-redis/v9"), runtime.NumCPU(), r.args.command, r.seconds)
}

func (r *report) markdown() string {
	a := r.args
	var out []string
	add := func(lines ...string) { out = append(out, lines...) }
	add("## Go and C comparison", "",
		fmt.Sprintf("Made by bench/go (issue 16). Uncontended: one caller doing each acquire+release in turn, ttl %s, "+
			"%d rounds of %s per contender, interleaved; ops/s is the median round. Each (part, node count, placement) "+
			"runs in a process of its own with redis-servers of its own; pinned: that process, its servers and its "+
			"children on CPU 0 (`taskset -c 0`). Every ferrolock manager (Go, C, Rust) has its defaults (watchdog on) "+
			"but the restart guard off: the servers are fresh.", ttl, a.rounds, a.duration), "",
		r.facts(), "")
	if len(r.c) > 0 {
		add("### C: blocking acquire+release vs the core's blocking path", "",
			"`bench/c/blocking_loop.c`: `ferrolock_manager_acquire` (no options, no cancel) + `ferrolock_lock_release` + "+
				"`ferrolock_lock_free`, linked statically through pkg-config (release build). Baseline: the same loop in "+
				"Rust over `ferrolock::host::Manager::acquire_blocking` + `Lock::release_blocking` "+
				"(`bench/examples/blocking_loop.rs`, release build), with the same options. The two alternate, a process "+
				"per round (200 warm-up operations each); p50/p99 are the median over the rounds of each process's own.", "",
			"| nodes | placement | implementation | ops/s | p50 µs | p99 µs | × core blocking path |",
			"|---:|---|---|---:|---:|---:|---:|")
		for _, g := range r.c {
			core, _ := find(r.c, g.nodes, g.placement, rustLoop)
			for _, row := range g.rows {
				add(fmt.Sprintf("| %d | %s | %s | %s | %s | %s | %s |", g.nodes, g.placement, row.Name,
					fmtNum(row.Ops, 0), fmtNum(row.P50, 0), fmtNum(row.P99, 0), fmtNum(row.Ops/core, 2)))
			}
		}
		add("")
	}
	if len(r.uncontended) > 0 {
		add("### Go: uncontended acquire+release", "",
			"hand-written go-redis: `SetNX` (SET NX PX) then a compare-and-delete script (`redis.NewScript(...).Run`: "+
				"EVALSHA), on every node at once (goroutines) with a majority counted; the baseline. redsync: one "+
				"`Mutex` (`WithExpiry(10s)`, `WithTries(1)`), `LockContext` + `UnlockContext`; it waits for every "+
				"node's answer. ferrolock: `Manager.Acquire` + `Lock.Release`, and `Manager.WithLock` with an empty "+
				"callback. \"diagnostic: one blocking cgo call\" is not a contender: `ferrolock_manager_acquire` + "+
				"`ferrolock_lock_release` in one cgo call that blocks the goroutine's OS thread, where the Go package "+
				"uses the completion-based acquire and a channel (a waiting goroutine holds no OS thread); the gap is "+
				"what that costs. p50/p99 over every operation of every round.", "")
		for _, g := range r.uncontended {
			base, _ := find(r.uncontended, g.nodes, g.placement, baseline)
			rs, _ := find(r.uncontended, g.nodes, g.placement, redsyncName)
			add(fmt.Sprintf("#### %s, %s", plural(g.nodes), g.placement), "",
				"| library | ops/s | p50 µs | p99 µs | × hand-written go-redis | × redsync | client CPU µs/op | Redis CPU µs/op |",
				"|---|---:|---:|---:|---:|---:|---:|---:|")
			for _, row := range g.rows {
				add(fmt.Sprintf("| %s | %s | %s | %s | %s | %s | %s | %s |", row.Name, fmtNum(row.Ops, 0), fmtNum(row.P50, 0),
					fmtNum(row.P99, 0), fmtNum(row.Ops/base, 2), fmtNum(row.Ops/rs, 2),
					fmtNum(row.ClientCPU, 1), fmtNum(row.RedisCPU, 1)))
			}
			add("")
		}
		if b := r.budgets(); len(b) > 0 {
			add("CPU budget (pinned: this process and every redis-server share one CPU, so ops/s ≈ 10⁶ ÷ (client + "+
				"Redis CPU µs per acquire+release); client CPU from `getrusage`, Redis CPU from the servers' "+
				"`/proc/<pid>/task/*/schedstat`):", "")
			add(b...)
			add("")
		}
	}
	if len(r.contended) > 0 {
		add(fmt.Sprintf("### Go: contended (%d processes, one key)", a.procs), "",
			fmt.Sprintf("%d processes, one key, %s per library, one library after the other on the same redis-servers "+
				"(unpinned); each process loops: acquire (blocking until granted) → GET + SET of a counter on a separate "+
				"redis-server → release. ferrolock: `Manager.Acquire(ctx, key)` with its defaults (wait until granted as "+
				"a queued waiter woken by pub/sub, watchdog on). redsync: its default retry delay (random 50–250 ms) "+
				"with `WithTries(math.MaxInt32)` (until granted; its default 32 tries give up after a few seconds). "+
				"sections/s: grants in the window ÷ its length; wait: acquire called → granted (capped by the window); "+
				"exclusion: no overlapping [granted, release called] intervals (CLOCK_MONOTONIC across processes) and "+
				"the non-atomic counter equal to the number of sections.", a.procs, a.contendedDuration), "",
			"| nodes | library | sections/s | per proc min–max | wait p50 ms | wait p99 ms | wait max ms | failed acquires | exclusion |",
			"|---:|---|---:|---:|---:|---:|---:|---:|---|")
		for _, g := range r.contended {
			for _, row := range g.rows {
				excl := fmt.Sprintf("held (%d = counter)", row.Counter)
				if !row.Held {
					excl = fmt.Sprintf("**BROKEN** (%d overlaps, counter %d for %d sections)", row.Overlaps, row.Counter, row.Sections)
				}
				add(fmt.Sprintf("| %d | %s | %s | %s–%s | %s | %s | %s | %d | %s |", g.nodes, row.Name,
					fmtNum(row.PerSecond, 0), fmtNum(row.PerProc[0], 0), fmtNum(row.PerProc[1], 0),
					fmtNum(row.P50, 2), fmtNum(row.P99, 2), fmtNum(row.Max, 2), row.Errors, excl))
			}
		}
		add("")
	}
	if t := r.targets(); len(t) > 0 {
		add("Targets of issue 16 (reported, not asserted):", "")
		add(t...)
		add("")
	}
	return strings.Join(out, "\n")
}

// summaryMarkdown is what bench/results/latest.md gets: the headline figures and the targets.
func (r *report) summaryMarkdown() string {
	var out []string
	add := func(lines ...string) { out = append(out, lines...) }
	add("## Go and C comparison (summary)", "",
		"Full tables and method: `bench/results/go.md`. "+r.facts(), "")
	if len(r.uncontended) > 0 {
		add("Uncontended acquire+release, ops/s (median round):", "",
			"| nodes | placement | hand-written go-redis | redsync | ferrolock Acquire/Release | ferrolock WithLock |",
			"|---:|---|---:|---:|---:|---:|")
		for _, g := range r.uncontended {
			cells := []string{}
			for _, name := range []string{baseline, redsyncName, ferroAcquire, ferroWithLock} {
				v, _ := find(r.uncontended, g.nodes, g.placement, name)
				cells = append(cells, fmtNum(v, 0))
			}
			add(fmt.Sprintf("| %d | %s | %s |", g.nodes, g.placement, strings.Join(cells, " | ")))
		}
		add("")
	}
	if len(r.c) > 0 {
		add("Blocking acquire+release, ops/s: C library vs the core's blocking path (Rust):", "",
			"| nodes | placement | core blocking path | C | core ÷ C |", "|---:|---|---:|---:|---:|")
		for _, g := range r.c {
			core, _ := find(r.c, g.nodes, g.placement, rustLoop)
			c, _ := find(r.c, g.nodes, g.placement, cLoop)
			add(fmt.Sprintf("| %d | %s | %s | %s | %s |", g.nodes, g.placement, fmtNum(core, 0), fmtNum(c, 0), fmtNum(core/c, 2)))
		}
		add("")
	}
	if t := r.targets(); len(t) > 0 {
		add("Targets of issue 16 (reported, not asserted):", "")
		add(t...)
		add("")
	}
	return strings.Join(out, "\n")
}
