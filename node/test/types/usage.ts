// Compiled with `tsc --noEmit` by the test suite: the declarations must accept this usage.
import { withLock, withPermit, withReadLock, withWriteLock, LockManager, LockLostError, NotAcquiredError, AbortError, metrics, prometheusText, setLogger, version, type Lock, type LogRecord, type LogLevel } from 'ferrolock';

export async function usage(nodes: string[]): Promise<number> {
  const result: number = await withLock(
    'orders:1001',
    async (lock: Lock) => {
      const s: AbortSignal = lock.signal;
      const t: string = lock.token;
      const f: number | null = lock.fence;
      const v: number = lock.validity;
      void s, t, f, v;
      return 42;
    },
    { nodes, ttl: 10_000, wait: 5_000, signal: AbortSignal.timeout(1000) },
  );
  await using manager = new LockManager({ nodes, ttl: 10_000 });
  try {
    await using lock = await manager.acquire('k', { wait: 0 });
    const validity: number = await lock.extend();
    void validity;
  } catch (e) {
    if (e instanceof NotAcquiredError || e instanceof LockLostError || e instanceof AbortError) {
      const code: string = e.code;
      void code;
    }
  }
  const again = await manager.tryAcquire('k');
  const r: Lock = await manager.acquireRead('rw', { ttl: 30_000, signal: AbortSignal.timeout(1000) });
  const w: Lock = await manager.tryAcquireWrite('rw2', { fencing: true });
  await manager.tryAcquireRead('rw3');
  await manager.acquireWrite('rw4', { wait: 0 });
  const shared: string = await withReadLock('rw', async (l: Lock) => l.token, { nodes });
  const alone: number | null = await withWriteLock('rw', (l: Lock) => l.fence, { nodes, fencing: true });
  const p: Lock = await manager.acquirePermit('sem', { permits: 4, count: 2, ttl: 30_000, signal: AbortSignal.timeout(1000) });
  await manager.tryAcquirePermit('sem', { permits: 4 });
  const limited: string = await withPermit('sem', { permits: 4, nodes }, async (l: Lock) => l.token);
  // @ts-expect-error permits is required
  await manager.acquirePermit('sem', { count: 1 });
  void r, w, shared, alone, p, limited;
  const released: boolean = await again.release();
  void released;
  return result;
}

// A node list the program keeps constant (`as const`, Object.freeze) is taken as the mutable
// arrays are: the binding copies it and never writes to it.
const FIXED_NODES = ['redis://10.0.0.1:6379', 'redis://10.0.0.2:6379', 'redis://10.0.0.3:6379'] as const;
export const fixed = new LockManager({ nodes: FIXED_NODES });
export function frozen(nodes: readonly string[]): Promise<number> {
  return withLock('k', () => 1, { nodes });
}

export const versionText: string = `ferrolock ${version}`;

export function scrape(): string {
  const m = metrics();
  const grants: number = m['orders']?.grants ?? 0;
  const le: number[] = m['orders']?.wait.le ?? [];
  void grants, le;
  return prometheusText();
}

export function logging(): void {
  setLogger((r: LogRecord) => {
    const level: LogLevel = r.level;
    console.log(level, r.target, r.message);
  }, { level: 'info' });
  setLogger(null);
}
