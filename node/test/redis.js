'use strict';
// Real redis-servers for the tests: a free port each, no persistence, a temp dir of their own.
const { spawn, execFileSync } = require('node:child_process');
const fs = require('node:fs');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');

function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

function startOnce(port, dir) {
  return new Promise((resolve, reject) => {
    const proc = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', dir], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    const timer = setTimeout(() => {
      proc.kill('SIGKILL');
      reject(new Error(`redis-server on ${port} did not start: ${out}`));
    }, 20000);
    proc.stdout.on('data', (d) => {
      out += d;
      if (out.includes('Ready to accept connections')) {
        clearTimeout(timer);
        proc.stdout.removeAllListeners('data');
        proc.stdout.resume();
        resolve(proc);
      }
    });
    proc.on('exit', () => {
      clearTimeout(timer);
      reject(new Error(`redis-server on ${port} exited: ${out}`));
    });
  });
}

class Server {
  static async start() {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ferrolock-node-'));
    for (let attempt = 0; ; attempt++) {
      const port = await freePort();
      try {
        const proc = await startOnce(port, dir);
        proc.removeAllListeners('exit');
        return new Server(proc, port, dir);
      } catch (e) {
        // Another test may have taken the port between the pick and the bind.
        if (attempt >= 5) throw e;
      }
    }
  }
  constructor(proc, port, dir) {
    this.proc = proc;
    this.port = port;
    this.dir = dir;
    this.url = `redis://127.0.0.1:${port}`;
  }
  cli(...args) {
    return execFileSync('redis-cli', ['-p', String(this.port), ...args], { encoding: 'utf8', timeout: 10000 }).trim();
  }
  exists(key) {
    return this.cli('EXISTS', key) === '1';
  }
  /** Records every command the server runs, from any client or script, until `stop()`. */
  async monitor() {
    const proc = spawn('redis-cli', ['-p', String(this.port), 'MONITOR'], { stdio: ['ignore', 'pipe', 'ignore'] });
    let seen = '';
    proc.stdout.setEncoding('utf8').on('data', (d) => { seen += d; });
    // The first line ("OK") says it is on.
    await new Promise((resolve, reject) => { proc.stdout.once('data', resolve); proc.once('error', reject); });
    return {
      /** The lines recorded up to now: a marker command is sent, and awaited in the record. */
      stop: async () => {
        const marker = `monitor-end-${process.pid}-${Date.now()}`;
        this.cli('ECHO', marker);
        for (let i = 0; i < 1000 && !seen.includes(marker); i++) {
          await new Promise((resolve) => setTimeout(resolve, 10));
        }
        proc.kill();
        if (!seen.includes(marker)) throw new Error(`MONITOR on ${this.port} never showed ${marker}`);
        return seen.split('\n');
      },
    };
  }
  pause() {
    this.proc.kill('SIGSTOP');
  }
  resume() {
    this.proc.kill('SIGCONT');
  }
  stop() {
    this.proc.kill('SIGCONT');
    this.proc.kill('SIGKILL');
    fs.rmSync(this.dir, { recursive: true, force: true });
  }
}

async function servers(n) {
  return Promise.all(Array.from({ length: n }, () => Server.start()));
}

module.exports = { Server, servers };
