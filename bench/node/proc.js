'use strict';
// What /proc says of this process's threads and of the redis-servers' (bench_node.js,
// one_loop.js).
const fs = require('node:fs');

// Context switches of every thread of this process so far (voluntary: a thread slept,
// waiting; involuntary: preempted), from /proc: the profile of where a binding's time goes,
// since every hop between the JavaScript thread and another thread is a sleep and a wake-up.
function switches() {
  let voluntary = 0;
  let involuntary = 0;
  for (const t of fs.readdirSync('/proc/self/task')) {
    let s;
    try {
      s = fs.readFileSync(`/proc/self/task/${t}/status`, 'utf8');
    } catch {
      continue; // a thread that ended since the listing
    }
    voluntary += Number(/^voluntary_ctxt_switches:\s+(\d+)/m.exec(s)?.[1] ?? 0);
    involuntary += Number(/^nonvoluntary_ctxt_switches:\s+(\d+)/m.exec(s)?.[1] ?? 0);
  }
  return { voluntary, involuntary };
}

// CPU time of every thread of the redis-servers `pids` so far, in µs (/proc/<pid>/task/*/schedstat:
// nanoseconds on the CPU, exact where /proc/<pid>/stat counts 10 ms ticks).
function serverCpu(pids) {
  let ns = 0;
  for (const pid of pids) {
    let tasks = [];
    try {
      tasks = fs.readdirSync(`/proc/${pid}/task`);
    } catch {
      continue;
    }
    for (const t of tasks) {
      try {
        ns += Number(fs.readFileSync(`/proc/${pid}/task/${t}/schedstat`, 'utf8').split(' ')[0]);
      } catch {
        // a thread that ended since the listing
      }
    }
  }
  return ns / 1000;
}

// The JavaScript main thread's CPU time so far, in ns (its schedstat: exact, where
// process.cpuUsage() counts every thread of the process).
function jsThreadNs() {
  return Number(fs.readFileSync(`/proc/self/task/${process.pid}/schedstat`, 'utf8').split(' ')[0]);
}

module.exports = { switches, serverCpu, jsThreadNs };
