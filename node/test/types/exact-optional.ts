// Compiled with `exactOptionalPropertyTypes`: an option passed through as possibly undefined
// (`{ signal: opts.signal }`) is taken, as the runtime takes it (an undefined option is left
// out). The declarations refused it before.
import { withLock, withPermit, withReadLock, LockManager, LockError, setLogger, type LogLevel } from 'ferrolock';

interface Maybe {
  nodes?: string[];
  tlsCa?: string;
  restartGuard?: number;
  shardedPubsub?: boolean;
  ttl?: number;
  wait?: number;
  retryDelay?: number;
  nodeTimeout?: number;
  driftFactor?: number;
  watchdog?: boolean;
  maxHold?: number;
  maxExtensions?: number;
  reentrant?: boolean;
  fencing?: boolean;
  signal?: AbortSignal;
  count?: number;
  level?: LogLevel;
  key?: string;
}

export async function passThrough(o: Maybe): Promise<void> {
  const lock = { ttl: o.ttl, wait: o.wait, retryDelay: o.retryDelay, nodeTimeout: o.nodeTimeout, driftFactor: o.driftFactor, watchdog: o.watchdog, maxHold: o.maxHold, maxExtensions: o.maxExtensions, reentrant: o.reentrant, fencing: o.fencing };
  const manager = { nodes: o.nodes, tlsCa: o.tlsCa, restartGuard: o.restartGuard, shardedPubsub: o.shardedPubsub };
  await withLock('k', () => 1, { ...manager, ...lock, signal: o.signal });
  await withReadLock('k', () => 1, { ...manager, ttl: o.ttl, signal: o.signal });
  await withPermit('s', { permits: 2, count: o.count, signal: o.signal, ...manager }, () => 1);
  await using m = new LockManager({ ...manager, ...lock });
  await (await m.acquire('k', { ...lock, signal: o.signal })).release();
  await (await m.tryAcquire('k', { ttl: o.ttl, signal: o.signal })).release();
  await (await m.acquirePermit('s', { permits: 2, count: o.count, signal: o.signal })).release();
  setLogger(null, { level: o.level });
  void new LockError('m', { key: o.key, cause: undefined });
}
