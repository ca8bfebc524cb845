'use strict';
// A Node script in a process of its own, for the lifetime tests (exit, signals, loss): its
// exit code or signal and its output, killed after `limitMs` so a hung child cannot hang a test.
const path = require('node:path');
const { spawn } = require('node:child_process');

const PKG = path.resolve(__dirname, '..');

/**
 * Runs `script` with `node -e` in the package's folder; `env` is added to this process's
 * environment; `onLine(line, child)` sees each stdout line as it comes.
 */
function runNode(script, { env = {}, limitMs = 30_000, onLine } = {}) {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, ['-e', script], {
      cwd: PKG,
      env: { ...process.env, ...env },
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    let out = '';
    let err = '';
    child.stdout.on('data', (d) => {
      const before = out.length;
      out += d;
      if (onLine) for (const line of out.slice(out.lastIndexOf('\n', before) + 1).split('\n').slice(0, -1)) onLine(line, child);
    });
    child.stderr.on('data', (d) => (err += d));
    const timer = setTimeout(() => child.kill('SIGKILL'), limitMs);
    child.on('exit', (code, signal) => {
      clearTimeout(timer);
      resolve({ code, signal, out, err });
    });
  });
}

/** Starts a worker thread running `source`; resolves to it and the first message it posts. */
async function startWorker(source) {
  const { Worker } = require('node:worker_threads');
  const worker = new Worker(source, { eval: true });
  const message = await new Promise((resolve, reject) => {
    worker.once('message', resolve);
    worker.once('error', reject);
  });
  return { worker, message };
}

module.exports = { PKG, runNode, startWorker };
