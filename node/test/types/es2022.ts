// Compiled with `tsc --noEmit` under lib es2022 alone (no DOM, no esnext.disposable, no
// @types/node) and without skipLibCheck: the declarations must not need what that lib lacks.
import { withLock, LockManager, NotAcquiredError, type Lock } from 'ferrolock';

export async function plain(nodes: string[]): Promise<number> {
  const n: number = await withLock('k', async (lock: Lock) => lock.validity, { nodes, ttl: 10_000 });
  const manager = new LockManager({ nodes });
  try {
    const lock = await manager.acquire('k', { wait: 0 });
    lock.signal.throwIfAborted();
    const aborted: boolean = lock.signal.aborted;
    void aborted;
    await lock.release();
  } catch (e) {
    if (e instanceof NotAcquiredError) return -1;
    throw e;
  } finally {
    await manager.close();
  }
  return n;
}
